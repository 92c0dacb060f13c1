"""``ddmq groups pause|resume``: stop a group (or one topic of it) handing out messages, and let it go on::

    ddmq groups pause cg_rides                       # every topic, until resumed
    ddmq groups pause cg_rides --topic rides --for 10m   # resumes by itself after 10 minutes
    ddmq groups resume cg_rides [--topic rides]

The pause is written to Redis: every proxy of the group reads it within one heartbeat
(``leases.claim_interval_ms``) and from then on answers its pulls empty. Messages already handed out
keep their deadlines and their acks count; leases and offsets are kept, lag keeps counting. A proxy
that starts while the group is paused stays paused. ``--for`` ends by Redis's clock, whether or not
any command or proxy runs then. ``ddmq status`` shows the pause.
"""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any

from ddmq.client.cli.actions import note
from ddmq.protocol import clitools
from ddmq.protocol.redis.connection import REDIS_ERRORS, redact_url, sync_redis
from ddmq.protocol.redis.pauses import Pause, parse_duration, pause, pauses, resume

__all__ = ["add_actions", "describe"]

_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, ValueError)


def add_actions(actions: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``pause`` and ``resume`` under ``ddmq groups``."""
    for name, func, what in (("pause", _pause, "stop handing out the group's messages (every proxy, stored in Redis)"),
                             ("resume", _resume, "lift a pause of the group, or of one topic")):
        action = actions.add_parser(name, help=what, description=__doc__,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        action.add_argument("group")
        action.add_argument("--topic", help="only this topic (default: every topic of the group)")
        if name == "pause":
            action.add_argument("--for", dest="for_", metavar="DURATION", type=_duration,
                                help="resume by itself after this long: 30s, 10m, 2h, 1d (default: until resumed)")
        clitools.env_option(action, "--redis", clitools.ENV_REDIS, "the broker's URL, e.g. redis://127.0.0.1:6379/0")
        action.add_argument("--json", action="store_true", help="print JSON")
        action.set_defaults(func=func)


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name (a bare container)
        return "ddmq"


def _run(args: argparse.Namespace, body: Any) -> Any:
    if args.topic == "*":
        raise clitools.CliError("--topic takes a topic name; leave it out to pause every topic",
                                clitools.USAGE_ERROR)
    try:
        with sync_redis(args.redis) as client:
            return body(client)
    except _ERRORS as exc:
        raise clitools.CliError(f"{redact_url(args.redis)}: {exc}") from exc


def describe(found: Pause, now_ms: int) -> str:
    """One pause in a line: what, by whom, since when, until when."""
    what = f"topic {found.topic}" if found.topic else "every topic"
    since = f" since {clitools.utc_time(found.at_ms)}" if found.at_ms else ""
    if found.until_ms is None:
        until = "until resumed"
    else:
        until = f"until {clitools.utc_time(found.until_ms)} (in {max(found.until_ms - now_ms, 0) // 1000} s)"
    return f"PAUSED: {what}, by {found.by or '?'}{since}, {until}: pulls get nothing"


def _pause(args: argparse.Namespace) -> int:
    def body(client: Any) -> tuple[Pause, int]:
        written = pause(client, args.group, args.topic, _user(), args.for_ or 0)
        note(client, "pause", args.group, args.topic, {"for_ms": args.for_ or None})
        return written, pauses(client, args.group)[0]

    written, now = _run(args, body)
    print(json.dumps(written.as_json()) if args.json else
          f"{args.group}: {describe(written, now)} (every proxy within one heartbeat)")
    return 0


def _resume(args: argparse.Namespace) -> int:
    def body(client: Any) -> tuple[int, list[Pause]]:
        lifted = resume(client, args.group, args.topic)
        note(client, "resume", args.group, args.topic, {"lifted": lifted})
        return lifted, pauses(client, args.group)[1]

    lifted, left = _run(args, body)
    if args.json:
        print(json.dumps({"lifted": lifted, "paused": [p.as_json() for p in left]}))
    else:
        what = f"{args.group}/{args.topic}" if args.topic else args.group
        print(f"{what}: {'resumed' if lifted else 'was not paused'}"
              + ("; still paused: every topic (ddmq groups resume " + args.group + ")"
                 if args.topic and any(p.topic is None for p in left) else ""))
    return 0
