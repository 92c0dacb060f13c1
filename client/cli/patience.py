"""Reading Redis from a command while a failover is under way: retried, said once, given up on time.

``ddmq status``, ``ddmq topics`` and ``ddmq groups`` read Redis directly. Started right after a Cluster
master died or while Redis restarts, the first call fails although the answer is seconds away; so a
read is retried on what the producer also retries (a lost connection, a timeout, a Cluster failover
or redirection, a loading or read-only server: :func:`~ddmq.protocol.produce.delivery.is_retriable`),
with backoff, until ``--timeout`` (30 s by default; 0 fails at once). The first failure is said on one
line of stderr; any other error, or the last one once time is up, ends the command as before: the URL
(password hidden) and the error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from ddmq.protocol import clitools
from ddmq.protocol.produce.delivery import is_retriable
from ddmq.protocol.redis.connection import REDIS_ERRORS, SyncRedis, redact_url, sync_redis

__all__ = ["DEFAULT_TIMEOUT_S", "add_timeout", "read_redis"]

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
_FIRST_WAIT_S = 0.1
_LONGEST_WAIT_S = 1.0


def add_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
        help=f"keep retrying this long while Redis does not answer (a failover, a restart); 0: fail at once "
             f"(default {DEFAULT_TIMEOUT_S:g})",
    )


def read_redis(args: argparse.Namespace, read: Callable[[SyncRedis], T]) -> T:
    """``read`` on a new client of ``args.redis``, retried as the module says; a malformed URL or a
    final error is a :class:`~ddmq.protocol.clitools.CliError` naming the URL."""
    timeout_s = float(getattr(args, "timeout", 0.0))
    if not timeout_s >= 0:  # NaN included
        raise clitools.CliError("--timeout must not be negative", clitools.USAGE_ERROR)
    deadline = time.monotonic() + timeout_s
    url = redact_url(args.redis)
    wait_s, said = _FIRST_WAIT_S, False
    while True:
        try:
            with sync_redis(args.redis) as client:
                return read(client)
        except ValueError as exc:  # a malformed URL, or a reply that makes no sense: no retry cures it
            raise clitools.CliError(f"{url}: {exc}") from exc
        except REDIS_ERRORS as exc:
            left = deadline - time.monotonic()
            if not is_retriable(exc) or left <= 0:
                raise clitools.CliError(f"{url}: {exc}") from exc
            if not said:
                prog = getattr(args, "prog", "ddmq")
                print(f"{prog}: {url} does not answer ({exc}); retrying for up to {timeout_s:g}s",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(min(wait_s, left))
            wait_s = min(wait_s * 2, _LONGEST_WAIT_S)
