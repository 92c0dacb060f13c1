"""``ddmq offsets reset``: move a group's committed offsets (the ordered pull path) to the earliest or
latest message, an offset, or a point in time; Kafka's ``--reset-offsets``, RocketMQ's
``resetOffsetByTime``.

Without ``--execute`` it changes nothing and prints, per queue, the offset now and the offset after::

    ddmq offsets reset --redis redis://127.0.0.1:6379/0 --group cg_rides --to-earliest
    ddmq offsets reset --redis ... --group cg_rides --topic rides --to-time 2026-11-23T08:00:00Z --execute

Fencing. A queue whose lease some proxy holds is being read: moving its offset under the reader would
be overwritten by the reader's next commit. So ``--execute`` refuses, naming the proxies, while any
lease of the selected queues is held; stop the group's proxies first (a graceful stop releases the
leases at once; a crashed proxy's lease lapses after ``leases.ttl_ms``). Each queue is then reset by one
Lua script that checks again that the lease is free, writes the committed offset, drops the offsets
recorded as finished past it, and bumps the queue's lease term: a proxy that held an expired lease
without noticing is fenced off, and its later commits are refused. The proxy that next takes the queue
reads from the new offset.

Targets. ``--to-earliest`` is the oldest entry still in the stream (older ones may have been trimmed);
``--to-latest`` the offset the next produced message gets (skip everything). ``--to-offset N`` is
clamped to that range, and lands on the first entry at or after N. ``--to-time T`` (ISO 8601; UTC when
no zone is given) is the first message whose produce time (the entry's ``ts`` field, the producer's
clock) is at or after T, found by a binary search over the entries the queue holds: exact when produce
times grow along the queue, which holds for one producer and for producers whose clocks agree. Offsets
with no entry (deleted, or never written: a Redis rollback and a foreign entry past the sequence leave
such holes) are stepped over by both. Only the ordered path's offsets move, not the low-level ``fetch``
positions (``ack``), which their clients own.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import redis

from ddmq.client.cli.actions import note as record
from ddmq.protocol import clitools
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import sync_redis
from ddmq.protocol.redis.scripts import OFFSETS_RESET_LUA

__all__ = ["QueueReset", "add_cli", "apply", "plan"]


@dataclass(frozen=True)
class QueueReset:
    """One queue's reset: ``old`` is the committed offset now (None: the group never read the queue)."""

    topic: str
    qid: int
    old: int | None
    new: int
    earliest: int
    latest: int
    owner: str | None  # the proxy holding the queue's lease, if any


@dataclass(frozen=True)
class Target:
    kind: str  # earliest | latest | offset | time
    value: int = 0  # the offset, or the time in ms since the epoch


def parse_time(text: str) -> int:
    """ISO 8601 → milliseconds since the epoch (UTC when the text names no zone)."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--to-time: {text!r} is not an ISO 8601 time (e.g. 2026-11-23T08:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _bounds(client: redis.Redis, topic: str, qid: int) -> tuple[int, int]:
    """(earliest offset still stored, next offset to be produced)."""
    sequence = client.get(keys.sequence(topic, qid))
    first = client.xrange(keys.stream(topic, qid), count=1)
    if sequence is not None:
        latest = int(sequence) + 1
    else:  # the producer script's own fallback: continue after the stream's last entry
        last = client.xrevrange(keys.stream(topic, qid), count=1)
        latest = keys.offset_of(last[0][0]) + 1 if last else 1
    earliest = keys.offset_of(first[0][0]) if first else latest
    return earliest, latest


#: Entries one XRANGE call reads while looking for the next entry that carries a produce time.
_PAGE = 16


def _stamped_entry(client: redis.Redis, topic: str, qid: int, offset: int, end: int) -> tuple[int, int] | None:
    """(offset, produce ms) of the first entry at or after ``offset`` and below ``end`` that carries the
    producer's ``ts``; None when there is none. Offsets with no entry (deleted, trimmed, or never
    written: the holes a Redis rollback or a foreign entry leaves) are stepped over, and so are entries
    without a readable ``ts`` (foreign ones, which the proxy dead-letters anyway)."""
    stream = keys.stream(topic, qid)
    while offset < end:
        entries = client.xrange(stream, min=keys.stream_id(offset), max=keys.stream_id(end - 1), count=_PAGE)
        if not entries:
            return None
        for entry_id, fields in entries:
            try:
                return keys.offset_of(entry_id), int(fields[b"ts"])
            except (KeyError, ValueError):
                continue
        offset = keys.offset_of(entries[-1][0]) + 1
    return None


def _first_entry(client: redis.Redis, topic: str, qid: int, offset: int, end: int) -> int:
    """The offset of the first entry at or after ``offset`` and below ``end``; ``end`` if none."""
    if offset >= end:
        return end
    entries = client.xrange(keys.stream(topic, qid), min=keys.stream_id(offset), max=keys.stream_id(end - 1), count=1)
    return keys.offset_of(entries[0][0]) if entries else end


def offset_at(client: redis.Redis, topic: str, qid: int, time_ms: int, earliest: int, latest: int) -> int:
    """The first offset in ``earliest..latest-1`` produced at or after ``time_ms``; ``latest`` if none.

    A binary search over the entries that exist: each probe reads the first entry at or after the
    middle, so holes in the offsets cost nothing. It keeps two facts true: every entry below ``low``
    was produced before ``time_ms``, and the first entry at or after ``high`` (if any before
    ``latest``) was produced at or after it."""
    low, high = earliest, latest
    while low < high:
        middle = (low + high) // 2
        found = _stamped_entry(client, topic, qid, middle, high)
        if found is not None and found[1] < time_ms:
            low = found[0] + 1
        else:
            high = middle  # the entries in middle..high-1 (if any) were produced at or after time_ms
    found = _stamped_entry(client, topic, qid, low, latest)
    return found[0] if found is not None else latest


def _topics(client: redis.Redis, group: str, topics: list[str] | None) -> dict[str, int]:
    """Topic → queue count: the named topics, or those where the group has a committed offset."""
    chosen: dict[str, int] = {}
    names = topics if topics else sorted(t.decode() for t in client.smembers(keys.topics()))
    for topic in names:
        queues = client.hget(keys.topic_meta(topic), "queues")
        if queues is None:
            if topics:
                raise clitools.CliError(f"topic {topic!r} does not exist (no producer has written to it)")
            continue
        count = int(queues)
        if topics or any(client.exists(keys.committed(group, topic, qid)) for qid in range(count)):
            chosen[topic] = count
    if not chosen:
        raise clitools.CliError(f"group {group!r} has no committed offset in any topic; name the topic with --topic")
    return chosen


def plan(client: redis.Redis, group: str, target: Target, topics: list[str] | None = None) -> list[QueueReset]:
    """What a reset would do, queue by queue (reads only)."""
    rows = []
    for topic, queues in _topics(client, group, topics).items():
        for qid in range(queues):
            earliest, latest = _bounds(client, topic, qid)
            committed = client.get(keys.committed(group, topic, qid))
            lease = client.get(keys.lease(group, topic, qid))
            if target.kind == "earliest":
                new = earliest
            elif target.kind == "latest":
                new = latest
            elif target.kind == "offset":
                new = _first_entry(client, topic, qid, min(max(target.value, earliest), latest), latest)
            else:
                new = offset_at(client, topic, qid, target.value, earliest, latest)
            owner = lease.decode().rpartition(" ")[0] if lease is not None else None
            rows.append(QueueReset(topic, qid, int(committed) if committed is not None else None, new,
                                   earliest, latest, owner))
    return rows


def apply(client: redis.Redis, group: str, rows: list[QueueReset]) -> list[QueueReset]:
    """Reset each queue whose lease is free; returns the rows that were refused (lease taken meanwhile)."""
    script = client.register_script(OFFSETS_RESET_LUA)
    refused = []
    for row in rows:
        topic, qid = row.topic, row.qid
        keys_ = [keys.lease(group, topic, qid), keys.lease_term(group, topic, qid),
                 keys.committed(group, topic, qid), keys.finished(group, topic, qid)]
        if not script(keys=keys_, args=[row.new]):
            refused.append(row)
    return refused


def format_plan(rows: list[QueueReset]) -> str:
    lines = [f"{'topic':<20} {'qid':>4} {'old':>10}    {'new':>10} {'earliest':>10} {'latest':>10}  owner"]
    for row in rows:
        old = str(row.old) if row.old is not None else "-"
        lines.append(f"{row.topic:<20} {row.qid:>4} {old:>10} -> {row.new:>10} {row.earliest:>10} "
                     f"{row.latest:>10}  {row.owner or '-'}")
    return "\n".join(lines)


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("offsets", help="move a group's committed offsets (dry run unless --execute)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    reset = actions.add_parser(
        "reset", help="reset a group's offsets", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    clitools.env_option(reset, "--redis", clitools.ENV_REDIS, "the broker's URL")
    reset.add_argument("--group", required=True)
    reset.add_argument("--topic", action="append", help="only this topic (repeatable; default: every topic "
                       "where the group has a committed offset)")
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the oldest message still stored")
    to.add_argument("--to-latest", action="store_true", help="after the newest message (skip everything)")
    to.add_argument("--to-offset", type=int, metavar="N", help="offset N in every queue (clamped to what exists)")
    to.add_argument("--to-time", metavar="ISO8601", help="the first message produced at or after this time")
    reset.add_argument("--execute", action="store_true", help="apply the reset (default: show it only)")
    reset.add_argument("--json", action="store_true", help="print JSON instead of a table")
    reset.set_defaults(func=_reset_command)


def _target(args: argparse.Namespace) -> Target:
    if args.to_earliest:
        return Target("earliest")
    if args.to_latest:
        return Target("latest")
    if args.to_offset is not None:
        return Target("offset", args.to_offset)
    try:
        return Target("time", parse_time(args.to_time))
    except ValueError as exc:
        raise clitools.CliError(str(exc), clitools.USAGE_ERROR) from exc


def _reset_command(args: argparse.Namespace) -> int:
    target = _target(args)
    try:
        with sync_redis(args.redis) as client:
            rows = plan(client, args.group, target, args.topic)
            held = sorted({row.owner for row in rows if row.owner is not None})
            refused: list[QueueReset] = []
            if args.execute and not held:
                refused = apply(client, args.group, rows)
                record(client, "offsets reset", args.group, None,
                       {"to": asdict(target), "topics": args.topic, "queues": len(rows) - len(refused)})
    except (redis.RedisError, ValueError) as exc:
        raise clitools.CliError(str(exc)) from exc
    if args.json:
        print(json.dumps({"group": args.group, "executed": args.execute and not held,
                          "queues": [asdict(row) for row in rows],
                          "refused": [[row.topic, row.qid] for row in refused], "held_by": held}, indent=2))
    else:
        print(format_plan(rows))
    note = sys.stderr if args.json else sys.stdout  # keep --json output parseable
    if held:
        why = (f"leases of these queues are held by {', '.join(held)}: stop the group's proxies (or wait for "
               "their leases to expire) and run again")
        if args.execute:
            raise clitools.CliError(f"refused, nothing changed: {why}")
        print(f"dry run; --execute would be refused: {why}", file=note)
    elif refused:
        names = ", ".join(f"{row.topic}#{row.qid}" for row in refused)
        raise clitools.CliError(f"a proxy took the lease of {names} meanwhile: those were not reset")
    elif args.execute:
        print(f"reset {len(rows)} queue(s) of group {args.group}", file=note)
    else:
        print("dry run: nothing changed; add --execute to apply", file=note)
    return 0
