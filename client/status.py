"""``ddmq status``: who owns each queue of a group, and how far behind it is, read from Redis.

It reads Redis directly (not a proxy), so it works while proxies are down or moving queues::

    ddmq status --redis redis://127.0.0.1:6379/0 --group cg_rides

A group is known when a proxy heartbeats for it or it has a committed offset in some topic; the
command fails (status 1) on a group that is neither. A member whose last heartbeat is older than
``--member-ttl-ms`` (the proxies' ``leases.ttl_ms``) is shown as expired: its proxy stopped without
leaving the group, and the others have already taken or will take its queues.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

from ddmq.client import clitools, keys
from ddmq.client.connection import REDIS_ERRORS, SyncRedis, sync_redis
from ddmq.config.schema import LeaseConfig

#: A proxy drops members silent for longer than its ``leases.ttl_ms``; status assumes the default.
DEFAULT_MEMBER_TTL_MS = LeaseConfig().ttl_ms


#: What ``ddmq status`` reports as a failure: Redis errors, and a malformed URL (a ValueError).
_STATUS_ERRORS: tuple[type[Exception], ...] = (*REDIS_ERRORS, ValueError)


@dataclass(frozen=True)
class QueueStatus:
    topic: str
    qid: int
    owner: str | None
    term: int | None
    lease_expires_in_ms: int | None
    committed: int | None  # next offset the group consumes; None: the group never started here
    produced: int  # next offset the producer writes
    lag: int
    rollbacks: int = 0  # times a proxy of the group found Redis had lost writes under this queue
    last_rollback_ms: int | None = None  # when it last did (ms since the epoch)


@dataclass(frozen=True)
class GroupStatus:
    group: str
    members: dict[str, int]  # instance id -> ms since its last heartbeat
    queues: list[QueueStatus]
    #: Members whose heartbeat is older than the member TTL (their proxy is gone).
    expired: list[str]
    #: False when no proxy ever heartbeated for the group and it has no committed offset.
    known: bool


def group_status(
    client: SyncRedis, group: str, topics: list[str] | None = None, member_ttl_ms: int = DEFAULT_MEMBER_TTL_MS
) -> GroupStatus:
    now = int(time.time() * 1000)
    heartbeats = client.zrange(keys.members(group), 0, -1, withscores=True)
    members = {member.decode(): now - int(score) for member, score in heartbeats}
    expired = sorted(member for member, age in members.items() if age > member_ttl_ms)
    explicit = topics is not None
    if topics is None:
        topics = sorted(t.decode() for t in client.smembers(keys.topics()))
    rows: list[QueueStatus] = []
    for topic in topics:
        raw_queues = client.hget(keys.topic_meta(topic), "queues")
        if raw_queues is None:
            continue
        queues = int(raw_queues)
        pipe = client.pipeline(transaction=False)
        for qid in range(queues):
            pipe.get(keys.lease(group, topic, qid))
            pipe.pttl(keys.lease(group, topic, qid))
            pipe.get(keys.committed(group, topic, qid))
            pipe.get(keys.sequence(topic, qid))
            pipe.hmget(keys.rollbacks(group, topic, qid), ["count", "at_ms"])
        replies = pipe.execute()
        topic_rows = []
        for qid in range(queues):
            lease, ttl, committed, sequence, (rollbacks, rollback_ms) = replies[5 * qid : 5 * qid + 5]
            owner, _, term = lease.decode().rpartition(" ") if lease else (None, "", None)
            produced = int(sequence) + 1 if sequence is not None else 1
            consumed = int(committed) if committed is not None else None
            topic_rows.append(QueueStatus(
                topic, qid, owner, int(term) if term else None, int(ttl) if lease else None, consumed, produced,
                produced - (consumed if consumed is not None else 1),
                int(rollbacks or 0), int(rollback_ms) if rollback_ms else None,
            ))
        # Discovered topics are shown only where the group has started consuming.
        if explicit or any(r.committed is not None for r in topic_rows):
            rows.extend(topic_rows)
    known = bool(members) or any(r.committed is not None or r.owner is not None for r in rows)
    return GroupStatus(group, members, rows, expired, known)


def format_status(status: GroupStatus) -> str:
    def member(name: str, age: int) -> str:
        return f"{name} ({'EXPIRED: ' if name in status.expired else ''}heartbeat {age} ms ago)"

    members = ", ".join(member(name, age) for name, age in sorted(status.members.items()))
    if not members:
        members = "no members: nothing is consuming"
    elif len(status.expired) == len(status.members):
        members += " -- no live member: nothing is consuming"
    lines = [f"group {status.group}: {members}"]
    lines.append(
        f"{'topic':<20} {'qid':>4} {'owner':<24} {'term':>5} {'lease ms':>9} "
        f"{'committed':>10} {'produced':>10} {'lag':>8} {'rollbacks':>9}"
    )
    for row in status.queues:
        lines.append(
            f"{row.topic:<20} {row.qid:>4} {row.owner or '-':<24} {row.term or '-':>5} "
            f"{row.lease_expires_in_ms if row.lease_expires_in_ms is not None else '-':>9} "
            f"{row.committed if row.committed is not None else '-':>10} {row.produced:>10} {row.lag:>8} "
            f"{row.rollbacks:>9}"
        )
    rolled = [row for row in status.queues if row.last_rollback_ms]
    if rolled:
        last = max(rolled, key=lambda row: row.last_rollback_ms or 0)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((last.last_rollback_ms or 0) / 1000))
        lines.append(f"Redis rolled back under {len(rolled)} queue(s), last under {last.topic}#{last.qid} at {when}: "
                     "messages it lost are lost; see the proxy's log")
    if not status.queues:
        lines.append("(no queues: the group has not consumed any topic yet)")
    return "\n".join(lines)


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "status", help="owners, lease expiry, committed and produced offsets, lag, rollbacks",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    clitools.env_option(
        parser, "--redis", clitools.ENV_REDIS,
        "the broker's URL, e.g. redis://127.0.0.1:6379/0 (add ?cluster=true for a Redis Cluster)",
    )
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", action="append", help="only this topic (repeatable)")
    parser.add_argument(
        "--member-ttl-ms", type=int, default=DEFAULT_MEMBER_TTL_MS, metavar="MS",
        help=f"a member silent for longer is expired: the proxies' leases.ttl_ms (default {DEFAULT_MEMBER_TTL_MS})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=_status_command)


def _status_command(args: argparse.Namespace) -> int:
    try:
        with sync_redis(args.redis) as client:
            status = group_status(client, args.group, args.topic, args.member_ttl_ms)
    except _STATUS_ERRORS as exc:
        raise clitools.CliError(f"{args.redis}: {exc}") from exc
    if not status.known:
        raise clitools.CliError(
            f"group {args.group!r} is unknown to {args.redis}: no proxy has served it and it has no committed offset"
        )
    print(json.dumps(asdict(status), indent=2) if args.json else format_status(status))
    return 0
