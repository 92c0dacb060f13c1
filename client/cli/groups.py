"""``ddmq groups``: the consumer groups in a Redis, one group's progress per topic, and removing one::

    ddmq groups list
    ddmq groups describe cg_rides
    ddmq groups delete cg_old [--force] [--keep-dead-letters]
    ddmq groups pause cg_rides [--topic rides] [--for 10m]; ddmq groups resume cg_rides

Every proxy records the groups it serves and the topics it consumes for them at each heartbeat, so
``list`` shows each group with its topics, its live members and when a proxy last served it, whether or
not one serves it now. ``describe`` shows, per topic, the queues, committed and produced offsets (summed
over the queues), the lag in messages and in time, and the proxies owning the queues.

``delete`` removes the group's keys: committed offsets, finished sets, fetch positions, leases, lease
terms, rollback records, replayed-id sets, the member set, the registry entries and the group's dead
letters (``--keep-dead-letters`` keeps those). It refuses while a proxy holds a lease of the group: stop
the group's proxies, or remove the group from their config and reload, first; ``--force`` deletes anyway
(the running proxies then lose their queues of the group at their next renewal, and register the group
again if they still serve it). It asks nothing: it is meant for scripts too.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from ddmq.client.cli import patience
from ddmq.client.cli import pause as pause_cli
from ddmq.client.cli.group_registry import GroupHeld, GroupSummary, delete_group, group_names, group_summary
from ddmq.protocol import clitools
from ddmq.protocol.redis.connection import REDIS_ERRORS, SyncRedis, redact_url, sync_redis
from ddmq.protocol.redis.status import DEFAULT_MEMBER_TTL_MS, GroupStatus, group_status

__all__ = ["add_cli"]

_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, ValueError)


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("groups", help="list the consumer groups, describe, delete, pause or resume one (Redis)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every group: topics, live members, last seen")
    describe = actions.add_parser("describe", help="one group per topic: queues, committed vs produced, lag, owners")
    describe.add_argument("group")
    describe.add_argument("--topic", action="append", help="only this topic (repeatable)")
    delete = actions.add_parser("delete", help="remove a group's offsets, leases, members and dead letters")
    delete.add_argument("group")
    delete.add_argument("--force", action="store_true", help="delete even while a proxy holds a lease of the group")
    delete.add_argument("--keep-dead-letters", action="store_true", help="leave the group's dead letters")
    for action, func in ((listing, _list), (describe, _describe), (delete, _delete)):
        clitools.env_option(action, "--redis", clitools.ENV_REDIS, "the broker's URL, e.g. redis://127.0.0.1:6379/0")
        if action is not delete:
            action.add_argument(
                "--member-ttl-ms", type=int, default=DEFAULT_MEMBER_TTL_MS, metavar="MS",
                help=f"a member silent for longer is not alive: the proxies' leases.ttl_ms "
                     f"(default {DEFAULT_MEMBER_TTL_MS})",
            )
        action.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if action is not delete:  # reads are retried through a failover; a delete is not repeated
            patience.add_timeout(action)
        action.set_defaults(func=func)
    pause_cli.add_actions(actions)


def _connect(args: argparse.Namespace) -> SyncRedis:
    try:
        return sync_redis(args.redis)
    except ValueError as exc:
        raise clitools.CliError(f"{redact_url(args.redis)}: {exc}") from exc


def _failed(args: argparse.Namespace, exc: Exception) -> clitools.CliError:
    return clitools.CliError(f"{redact_url(args.redis)}: {exc}")


def _list(args: argparse.Namespace) -> int:
    summaries = patience.read_redis(
        args, lambda client: [group_summary(client, name, args.member_ttl_ms) for name in group_names(client)])
    if args.json:
        print(json.dumps([{**asdict(s), "last_seen_ms": s.last_seen_ms} for s in summaries], indent=2))
        return 0
    rows = [[s.group, ",".join(s.topics) or "-", len(s.members), clitools.utc_time(s.last_seen_ms)]
            for s in summaries]
    print(clitools.table(["group", "topics", "members alive", "last seen"], rows))
    print(f"{len(summaries)} group(s)")
    return 0


def _describe(args: argparse.Namespace) -> int:
    def read(client: SyncRedis) -> tuple[GroupSummary, GroupStatus]:
        summary = group_summary(client, args.group, args.member_ttl_ms)
        topics = args.topic or list(summary.topics) or None
        return summary, group_status(client, args.group, topics, args.member_ttl_ms)

    summary, status = patience.read_redis(args, read)
    if status.missing_topics:
        raise clitools.CliError(f"no topic {', '.join(map(repr, status.missing_topics))} in {redact_url(args.redis)}")
    if not status.known and not summary.topics:
        raise clitools.CliError(f"group {args.group!r} is unknown to {redact_url(args.redis)} "
                                "(ddmq groups list shows the groups it knows)")
    per_topic: dict[str, dict[str, Any]] = {}
    for row in status.queues:
        entry = per_topic.setdefault(row.topic, {"topic": row.topic, "queues": 0, "committed": 0, "produced": 0,
                                                 "lag": 0, "lag_ms": 0, "owners": set(),
                                                 "last_seen_ms": summary.topics.get(row.topic)})
        entry["queues"] += 1
        entry["committed"] += max(0, (row.committed or 1) - 1)  # offsets consumed (committed is the next one)
        entry["produced"] += row.produced - 1
        entry["lag"] += row.lag
        entry["lag_ms"] = None if entry["lag_ms"] is None or row.lag_ms is None else max(entry["lag_ms"], row.lag_ms)
        if row.owner:
            entry["owners"].add(row.owner)
    topics_out = [{**entry, "owners": sorted(entry["owners"])} for entry in per_topic.values()]
    if args.json:
        print(json.dumps({"group": args.group, "members": summary.members, "expired": summary.expired,
                          "topics": topics_out, "queues": [asdict(q) for q in status.queues]}, indent=2))
        return 0
    rows = [[t["topic"], t["queues"], t["committed"], t["produced"], t["lag"],
             "?" if t["lag_ms"] is None else f"{t['lag_ms'] / 1000:.1f}s", ",".join(t["owners"]) or "-",
             clitools.utc_time(t["last_seen_ms"])] for t in topics_out]
    print(clitools.table(["topic", "queues", "consumed", "produced", "lag", "time lag", "owners", "last seen"], rows))
    alive = ", ".join(sorted(summary.members)) or "none"
    print(f"group {args.group}: members alive: {alive}" + (f"; expired: {', '.join(summary.expired)}"
                                                            if summary.expired else ""))
    return 0


def _delete(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        with _connect(args) as client:
            report = delete_group(client, args.group, force=args.force, keep_dead_letters=args.keep_dead_letters)
    except GroupHeld as exc:
        raise clitools.CliError(f"{exc}; stop its proxies (or remove it from their config) first, "
                                "or pass --force") from exc
    except _ERRORS as exc:
        raise _failed(args, exc) from exc
    if args.json:
        print(json.dumps(asdict(report), indent=2))
        return 0
    letters = "kept its dead letters" if args.keep_dead_letters else f"{report.dead_letters_deleted} dead letter(s)"
    broken = f"; broke {len(report.leases_broken)} lease(s) held by running proxies" if report.leases_broken else ""
    print(f"deleted group {args.group}: {report.keys_deleted} key(s) over {len(report.topics)} topic(s), "
          f"{letters}{broken} ({time.monotonic() - started:.1f}s)")
    return 0
