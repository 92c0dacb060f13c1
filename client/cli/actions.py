"""``ddmq actions``: the last operator actions, newest first, from the record every proxy and the
``ddmq`` command keep in Redis (:mod:`ddmq.protocol.redis.actions`)::

    ddmq actions --redis redis://127.0.0.1:6379/0              # the last 50 of every group
    ddmq actions --group cg_rides --limit 200 [--json]

Each row: when (Redis's time, UTC), who (the admin token's holder and peer address, an operator's
``user@host``, ``proxy <instance>``, ``breaker``), what, on which group and topic, and its details.
The record keeps the last 1,000 actions of every group together.

The commands that act on Redis directly (``ddmq groups pause|resume``, ``ddmq offsets reset
--execute``) record themselves through :func:`note`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys
from typing import Any

from ddmq.protocol import clitools
from ddmq.protocol.redis.actions import MAX_KEPT, recent_actions_sync, record_action_sync
from ddmq.protocol.redis.connection import REDIS_ERRORS, SyncRedis, redact_url, sync_redis

__all__ = ["add_cli", "note", "operator"]

_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, ValueError)


def operator() -> str:
    """Who runs this command: ``user@host``."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no login name (a bare container)
        user = "?"
    return f"{user}@{socket.gethostname()} (ddmq)"


def note(client: SyncRedis, action: str, group: str | None = None, topic: str | None = None,
         detail: dict[str, Any] | None = None) -> None:
    """Record ``action`` done by this command; a Redis failure is a warning, the action stands."""
    try:
        record_action_sync(client, operator(), action, group=group, topic=topic, detail=detail)
    except REDIS_ERRORS as exc:
        print(f"warning: {action} done, but its record was not written: {exc}", file=sys.stderr)


def _limit(text: str) -> int:
    if not (text.isdigit() and 1 <= int(text) <= MAX_KEPT):
        raise argparse.ArgumentTypeError(f"a whole number 1..{MAX_KEPT}, got {text!r}")
    return int(text)


def _detail(detail: dict[str, Any]) -> str:
    text = " ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(detail.items()) if v is not None)
    return text if len(text) <= 100 else text[:99] + "…"


def _list(args: argparse.Namespace) -> int:
    try:
        with sync_redis(args.redis) as client:
            found = recent_actions_sync(client, args.limit, args.group)
    except _ERRORS as exc:
        raise clitools.CliError(f"{redact_url(args.redis)}: {exc}") from exc
    if args.json:
        print(json.dumps({"actions": [a.as_json() for a in found]}, indent=2, ensure_ascii=False))
        return 0
    rows = [[clitools.utc_time(a.at_ms), a.who, a.action,
             f"{a.group or '-'}{'/' + a.topic if a.topic else ''}", _detail(a.detail)] for a in found]
    cells = [["WHEN", "WHO", "ACTION", "GROUP/TOPIC", "DETAIL"], *rows]
    widths = [max(len(row[i]) for row in cells) for i in range(4)]
    for row in cells:
        print("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4])
    if not found:
        print("no operator actions recorded" + (f" for group {args.group}" if args.group else ""))
    return 0


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("actions", help="the last operator actions: pauses, replays, key actions, resets (Redis)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    clitools.env_option(parser, "--redis", clitools.ENV_REDIS, "the broker's URL, e.g. redis://127.0.0.1:6379/0")
    parser.add_argument("--group", help="only this group's actions")
    parser.add_argument("--limit", type=_limit, default=50, help=f"at most this many (1..{MAX_KEPT}, default 50)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=_list)
