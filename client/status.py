"""``ddmq status``: who owns each queue of a group, and how far behind it is, read from Redis.

It reads Redis directly (not a proxy), so it works while proxies are down or moving queues::

    ddmq status --redis redis://127.0.0.1:6379/0 --group cg_rides
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

from ddmq.client import keys
from ddmq.client.connection import REDIS_ERRORS, SyncRedis, sync_redis


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


@dataclass(frozen=True)
class GroupStatus:
    group: str
    members: dict[str, int]  # instance id -> ms since its last heartbeat
    queues: list[QueueStatus]


def group_status(client: SyncRedis, group: str, topics: list[str] | None = None) -> GroupStatus:
    now = int(time.time() * 1000)
    heartbeats = client.zrange(keys.members(group), 0, -1, withscores=True)
    members = {member.decode(): now - int(score) for member, score in heartbeats}
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
        replies = pipe.execute()
        topic_rows = []
        for qid in range(queues):
            lease, ttl, committed, sequence = replies[4 * qid : 4 * qid + 4]
            owner, _, term = lease.decode().rpartition(" ") if lease else (None, "", None)
            produced = int(sequence) + 1 if sequence is not None else 1
            consumed = int(committed) if committed is not None else None
            topic_rows.append(QueueStatus(
                topic, qid, owner, int(term) if term else None, int(ttl) if lease else None, consumed, produced,
                produced - (consumed if consumed is not None else 1),
            ))
        # Discovered topics are shown only where the group has started consuming.
        if explicit or any(r.committed is not None for r in topic_rows):
            rows.extend(topic_rows)
    return GroupStatus(group, members, rows)


def format_status(status: GroupStatus) -> str:
    lines = [f"group {status.group}: " + (", ".join(
        f"{member} (heartbeat {age} ms ago)" for member, age in sorted(status.members.items())) or "no live members")]
    lines.append(
        f"{'topic':<20} {'qid':>4} {'owner':<24} {'term':>5} {'lease ms':>9} "
        f"{'committed':>10} {'produced':>10} {'lag':>8}"
    )
    for row in status.queues:
        lines.append(
            f"{row.topic:<20} {row.qid:>4} {row.owner or '-':<24} {row.term or '-':>5} "
            f"{row.lease_expires_in_ms if row.lease_expires_in_ms is not None else '-':>9} "
            f"{row.committed if row.committed is not None else '-':>10} {row.produced:>10} {row.lag:>8}"
        )
    if not status.queues:
        lines.append("(no queues: the group has not consumed any topic yet)")
    return "\n".join(lines)


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("status", help="owners, lease expiry, committed and produced offsets, lag")
    parser.add_argument(
        "--redis", required=True,
        help="the broker's URL, e.g. redis://127.0.0.1:6379/0 (add ?cluster=true for a Redis Cluster)",
    )
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", action="append", help="only this topic (repeatable)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=_status_command)


def _status_command(args: argparse.Namespace) -> int:
    try:
        with sync_redis(args.redis) as client:
            status = group_status(client, args.group, args.topic)
    except REDIS_ERRORS as exc:
        print(f"ddmq status: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # a malformed URL
        print(f"ddmq status: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(status), indent=2) if args.json else format_status(status))
    return 0
