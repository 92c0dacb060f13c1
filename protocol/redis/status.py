"""A group's status, read from Redis: who owns each queue, its lease, offsets, lag and rollbacks.

It reads Redis directly (not a proxy), so it works while proxies are down or moving queues: ``ddmq
status`` prints it, and the proxy's admin API (``GET /admin/groups/...``) answers with it.

A group is known when a proxy heartbeats for it or it has a committed offset in some topic. A member
whose last heartbeat is older than the proxies' ``leases.ttl_ms`` is expired: its proxy stopped without
leaving the group, and the others have already taken or will take its queues.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redis.cluster import RedisCluster

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import SyncRedis, server_time_ms

__all__ = ["DEFAULT_MEMBER_TTL_MS", "GroupStatus", "QueueStatus", "RetentionHolder", "group_status", "redis_memory"]

#: A proxy drops members silent for longer than its ``leases.ttl_ms``; status assumes the default.
DEFAULT_MEMBER_TTL_MS = keys.DEFAULT_MEMBER_TTL_MS


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
    #: Produce time (ms since the epoch) of the first unfinished message; None when caught up or when
    #: that entry is gone from the stream.
    oldest_unfinished_ms: int | None = None
    #: Lag in time: the age of the first unfinished message (0 when caught up, None when unknown).
    lag_ms: int | None = 0
    #: Messages the group never received: trimmed before it read them (docs/retention.md).
    expired: int = 0
    #: Entries of the queue in Redis now (all groups).
    stored: int = 0


@dataclass(frozen=True)
class RetentionHolder:
    """The group that holds a topic's ``consumed`` trim back most: the lowest committed offset of the
    registered groups, on the queues where it is lowest."""

    topic: str
    group: str
    #: Entries kept in Redis on its account (from its committed offsets to the queues' ends).
    retained: int
    #: Produce time (ms since the epoch) of the oldest entry kept for it; None when unknown.
    oldest_ms: int | None


@dataclass(frozen=True)
class GroupStatus:
    group: str
    members: dict[str, int]  # instance id -> ms since its last heartbeat
    queues: list[QueueStatus]
    #: Members whose heartbeat is older than the member TTL (their proxy is gone).
    expired: list[str]
    #: False when no proxy ever heartbeated for the group and it has no committed offset.
    known: bool
    #: Topics asked for by name that do not exist (no metadata in Redis).
    missing_topics: list[str]
    #: Per topic shown: the group holding its trim back, when one does.
    retention: list[RetentionHolder] = field(default_factory=list)
    #: Redis ``used_memory`` and ``maxmemory`` (0: no limit), summed over a cluster's masters.
    used_memory: int = 0
    maxmemory: int = 0


def group_status(
    client: SyncRedis, group: str, topics: list[str] | None = None, member_ttl_ms: int = DEFAULT_MEMBER_TTL_MS
) -> GroupStatus:
    now = server_time_ms(client)
    heartbeats = client.zrange(keys.members(group), 0, -1, withscores=True)
    members = {member.decode(): now - int(score) for member, score in heartbeats}
    expired = sorted(member for member, age in members.items() if age > member_ttl_ms)
    explicit = topics is not None
    if topics is None:
        topics = sorted(t.decode() for t in client.smembers(keys.topics()))
    rows: list[QueueStatus] = []
    missing: list[str] = []
    holders: list[RetentionHolder] = []
    for topic in topics:
        raw_queues = client.hget(keys.topic_meta(topic), "queues")
        if raw_queues is None:
            missing.append(topic)
            continue
        queues = int(raw_queues)
        pipe = client.pipeline(transaction=False)
        for qid in range(queues):
            pipe.get(keys.lease(group, topic, qid))
            pipe.pttl(keys.lease(group, topic, qid))
            pipe.get(keys.committed(group, topic, qid))
            pipe.get(keys.sequence(topic, qid))
            pipe.hmget(keys.rollbacks(group, topic, qid), ["count", "at_ms"])
            pipe.hget(keys.expired(group, topic, qid), "count")
            pipe.xlen(keys.stream(topic, qid))
        replies = pipe.execute()
        firsts = _first_unfinished(client, topic, [int(c) if c else 1 for c in replies[2::7]])
        topic_rows = []
        for qid in range(queues):
            lease, ttl, committed, sequence, (rollbacks, rollback_ms), expired_count, stored = (
                replies[7 * qid : 7 * qid + 7])
            owner, _, term = lease.decode().rpartition(" ") if lease else (None, "", None)
            produced = int(sequence) + 1 if sequence is not None else 1
            consumed = int(committed) if committed is not None else None
            lag = produced - (consumed if consumed is not None else 1)
            oldest = firsts[qid] if lag > 0 else None
            lag_ms = 0 if lag <= 0 else (max(0, now - oldest) if oldest is not None else None)
            topic_rows.append(QueueStatus(
                topic, qid, owner, int(term) if term else None, int(ttl) if lease else None, consumed, produced,
                lag, int(rollbacks or 0), int(rollback_ms) if rollback_ms else None, oldest, lag_ms,
                int(expired_count or 0), int(stored or 0),
            ))
        # Discovered topics are shown only where the group has started consuming.
        if explicit or any(r.committed is not None for r in topic_rows):
            rows.extend(topic_rows)
            holder = retention_holder(client, topic, queues, [r.produced - 1 for r in topic_rows])
            if holder is not None:
                holders.append(holder)
    known = bool(members) or any(r.committed is not None or r.owner is not None for r in rows)
    used, maximum = redis_memory(client)
    return GroupStatus(group, members, rows, expired, known, missing, holders, used, maximum)


def retention_holder(client: SyncRedis, topic: str, queues: int, ends: list[int]) -> RetentionHolder | None:
    """The registered group that keeps the most of ``topic`` in Redis by its committed offsets (the
    ``consumed`` trim stops at the lowest one per queue); None when no group holds anything back."""
    names = sorted(name.decode() for name in client.smembers(keys.groups()))
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hexists(keys.group_topics(name), topic)
    readers = [name for name, reads in zip(names, pipe.execute(), strict=True) if reads]
    if not readers:
        return None
    pipe = client.pipeline(transaction=False)
    for qid in range(queues):
        for name in readers:
            pipe.get(keys.committed(name, topic, qid))
    raws = iter(pipe.execute())
    kept: dict[str, int] = {}
    lowest: dict[int, tuple[int, str]] = {}
    for qid in range(queues):
        at = [(int(raw), name) for name in readers if (raw := next(raws)) is not None]
        if not at:
            continue
        offset, name = min(at)
        if offset <= ends[qid]:
            lowest[qid] = (offset, name)
            kept[name] = kept.get(name, 0) + ends[qid] - offset + 1
    if not kept:
        return None
    group = max(sorted(kept), key=lambda name: kept[name])
    qids = sorted(qid for qid, (_, name) in lowest.items() if name == group)
    times = [t for t in _first_unfinished_of(client, topic, {q: lowest[q][0] for q in qids}) if t is not None]
    return RetentionHolder(topic, group, kept[group], min(times) if times else None)


def redis_memory(client: SyncRedis) -> tuple[int, int]:
    """(used_memory, maxmemory) of Redis, summed over a cluster's masters."""
    if isinstance(client, RedisCluster):
        info: Any = client.info("memory", target_nodes=RedisCluster.PRIMARIES)
    else:
        info = client.info("memory")
    nodes = list(info.values()) if isinstance(info, dict) and "used_memory" not in info else [info]
    nodes = [node for node in nodes if isinstance(node, dict)]
    return sum(int(n.get("used_memory", 0)) for n in nodes), sum(int(n.get("maxmemory", 0)) for n in nodes)


def _first_unfinished(client: SyncRedis, topic: str, offsets: list[int]) -> list[int | None]:
    """Per qid, the produce time of the entry at ``offsets[qid]`` (or the first one after it)."""
    return _first_unfinished_of(client, topic, dict(enumerate(offsets)))


def _first_unfinished_of(client: SyncRedis, topic: str, offsets: dict[int, int]) -> list[int | None]:
    pipe = client.pipeline(transaction=False)
    for qid, offset in offsets.items():
        pipe.xrange(keys.stream(topic, qid), f"0-{offset}", "+", count=1)
    times: list[int | None] = []
    for entries in pipe.execute():
        raw = entries[0][1].get(b"ts") if entries else None
        times.append(int(raw) if raw is not None and raw.isdigit() else None)
    return times
