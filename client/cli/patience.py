"""Reading Redis from a command while a failover is under way: retried, said once, given up on time.

``ddmq status``, ``ddmq topics`` and ``ddmq groups`` read Redis directly. Started right after a Cluster
master died or while Redis restarts, the first call fails although the answer is seconds away; so a
read is retried on what the producer also retries (a lost connection, a timeout, a Cluster failover
or redirection, a loading or read-only server: :func:`~ddmq.protocol.produce.delivery.is_retriable`),
with backoff, until ``--timeout`` (30 s by default; 0 fails at once). The first failure is said on one
line of stderr; any other error, or the last one once time is up, ends the command as before: the URL
(password hidden) and the error.

The commands' clients retry nothing inside redis-py (:func:`client`): a Cluster client's own retries
back off for seconds in silence (three attempts, up to 10 s apart) while a replica is promoted, so a
command would wait without saying why. Every failure reaches the command's own loop, which says so.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis.backoff import NoBackoff
from redis.retry import Retry

from ddmq.protocol import clitools
from ddmq.protocol.produce.delivery import is_retriable
from ddmq.protocol.redis.connection import REDIS_ERRORS, SyncRedis, redact_url, sync_redis

__all__ = ["DEFAULT_TIMEOUT_S", "add_timeout", "client", "connect", "read_redis"]

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


def client(url: str, **options: Any) -> SyncRedis:
    """A client of ``url`` that retries nothing itself: each failure is its caller's to retry (and say).
    ``options`` go to redis-py. A Cluster client reads the slot map here, so an unreachable cluster
    raises at once."""
    return sync_redis(url, retry=Retry(NoBackoff(), 0), **options)


def read_redis(args: argparse.Namespace, read: Callable[[SyncRedis], T]) -> T:
    """``read`` on a new client of ``args.redis``, retried as the module says; a malformed URL or a
    final error is a :class:`~ddmq.protocol.clitools.CliError` naming the URL."""
    timeout_s = float(getattr(args, "timeout", 0.0))
    if not timeout_s >= 0:  # NaN included
        raise clitools.CliError("--timeout must not be negative", clitools.USAGE_ERROR)
    prog = getattr(args, "prog", "ddmq")

    def attempt() -> T:
        with client(args.redis) as redis_client:
            return read(redis_client)

    return patiently(attempt, args.redis, timeout_s, lambda exc: say_waiting(prog, args.redis, exc, timeout_s))


def connect(url: str, timeout_s: float, waiting: Callable[[BaseException], None], **options: Any) -> SyncRedis:
    """:func:`client`, retried while no seed of a Cluster answers, up to ``timeout_s``; ``waiting`` is
    called at the first retry (the caller says that it waits)."""
    return patiently(lambda: client(url, **options), url, timeout_s, waiting)


def say_waiting(prog: str, url: str, exc: BaseException, timeout_s: float) -> None:
    print(f"{prog}: {redact_url(url)} does not answer ({exc}); retrying for up to {timeout_s:g}s",
          file=sys.stderr, flush=True)


def patiently(call: Callable[[], T], url: str, timeout_s: float, waiting: Callable[[BaseException], None]) -> T:
    """``call`` until it returns, retrying a retriable Redis failure with backoff until ``timeout_s``
    has passed; ``waiting`` is called once, at the first retry. A final error is a CliError naming ``url``."""
    deadline = time.monotonic() + timeout_s
    shown = redact_url(url)
    wait_s, said = _FIRST_WAIT_S, False
    while True:
        try:
            return call()
        except ValueError as exc:  # a malformed URL, or a reply that makes no sense: no retry cures it
            raise clitools.CliError(f"{shown}: {exc}") from exc
        except REDIS_ERRORS as exc:
            left = deadline - time.monotonic()
            if not is_retriable(exc) or left <= 0:
                raise clitools.CliError(f"{shown}: {exc}") from exc
            if not said:
                waiting(exc)
                said = True
            time.sleep(min(wait_s, left))
            wait_s = min(wait_s * 2, _LONGEST_WAIT_S)
