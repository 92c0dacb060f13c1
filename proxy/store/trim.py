"""Redis side of retention: who reads a queue and from where, trimming its head, counting what expired.

Every command names keys of one queue's slot (its stream, the groups' committed offsets, its trimmer
lease and expired counters all carry the queue's hash tag), except the group registry, read with one
command per key; so all of it works the same on a single Redis and on a Redis Cluster.

Trims are ``XTRIM <stream> MINID 0-<n>`` (exact): entry ids are ``0-<offset>``, so this removes every
entry below offset ``n`` and nothing else, in one command whose cost is the number of entries removed.
The caller bounds that number (``retention.step``), so no trim holds Redis long enough to stall reads.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from redis.asyncio.cluster import RedisCluster

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import AsyncRedis, eval_script, eval_scripts
from ddmq.protocol.redis.scripts import EXPIRED_RECORD_LUA, TRIMMER_DROP_LUA, TRIMMER_PROBE_LUA
from ddmq.proxy.store.broker import map_redis_errors


class Reader(NamedTuple):
    """A group registered for a topic, as the trimmer sees it on one queue."""

    group: str
    #: Its committed offset on the queue (the next one it consumes); None when it has none yet.
    committed: int | None
    #: Its last heartbeat for the topic (ms).
    last_seen_ms: int


class QueueHead(NamedTuple):
    offset: int
    produce_ms: int


def _entry(entry_id: bytes, fields: dict[bytes, bytes]) -> QueueHead | None:
    try:
        offset = keys.offset_of(entry_id)
    except ValueError:
        return None
    raw = fields.get(b"ts", b"")
    return QueueHead(offset, int(raw) if raw.isdigit() else 0)


async def registered_groups(redis: AsyncRedis, topic: str) -> dict[str, int]:
    """Group -> last heartbeat (ms) for the topic, of every group in the registry that consumes it."""
    with map_redis_errors(f"reading the groups of {topic}"):
        names = sorted(name.decode() for name in await redis.smembers(keys.groups()))
        if not names:
            return {}
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hget(keys.group_topics(name), topic)
            seen = await pipe.execute()
    return {name: int(raw) for name, raw in zip(names, seen, strict=True) if raw is not None}


async def registered_groups_of(redis: AsyncRedis, topics: list[str]) -> dict[str, dict[str, int]]:
    """:func:`registered_groups` of many topics in two round trips: topic -> group -> last heartbeat."""
    with map_redis_errors("reading the group registry"):
        names = sorted(name.decode() for name in await redis.smembers(keys.groups()))
        if not names or not topics:
            return {topic: {} for topic in topics}
        async with redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hmget(keys.group_topics(name), topics)
            seen = await pipe.execute()
    out: dict[str, dict[str, int]] = {topic: {} for topic in topics}
    for name, values in zip(names, seen, strict=True):
        for topic, raw in zip(topics, values, strict=True):
            if raw is not None:
                out[topic][name] = int(raw)
    return out


class Probe(NamedTuple):
    """What a round finds first of a queue whose trimmer lease it holds (:func:`probe`)."""

    #: The queue's first entry; None when the stream is empty or begins with a foreign writer's entry.
    first: QueueHead | None
    #: The last offset produced (the sequence; 0 when unknown or none).
    end: int


#: Queues one probe script call covers on a single Redis.
PROBE_BATCH = 128


async def probe(
    redis: AsyncRedis, queues: list[tuple[str, int]], held: list[bool], owner: str, ttl_ms: int
) -> list[Probe | None]:
    """Take or renew the trimmer lease of each of ``queues`` for ``owner`` (``held``: per queue, whether
    ``owner`` held it at its last probe: one command renews it then, another takes it when free) and
    read its first entry and end, in one pipeline of :data:`~ddmq.protocol.redis.scripts.TRIMMER_PROBE_LUA`
    calls (one per :data:`PROBE_BATCH` queues on a single Redis, one per queue on a Cluster). None for
    a queue another proxy trims."""
    size = 1 if isinstance(redis, RedisCluster) else PROBE_BATCH
    calls: list[tuple[str, list[str], list[Any]]] = [
        (TRIMMER_PROBE_LUA, [key for topic, qid in queues[i:i + size]
                             for key in (keys.trimmer(topic, qid), keys.sequence(topic, qid), keys.stream(topic, qid))],
         [owner, ttl_ms, "".join("1" if mine else "0" for mine in held[i:i + size])])
        for i in range(0, len(queues), size)
    ]
    out: list[Probe | None] = []
    with map_redis_errors(f"looking at {len(queues)} queues to trim"):
        for reply in await eval_scripts(redis, calls):
            if isinstance(reply, Exception):
                raise reply
            for answer in reply:
                if not answer:
                    out.append(None)
                elif len(answer) < 4:
                    out.append(Probe(None, 0))
                else:
                    first = _entry(answer[1], {b"ts": answer[2]})
                    out.append(Probe(first, int(answer[3]) if answer[3] else 0))
    return out


async def readers(redis: AsyncRedis, topic: str, qid: int, groups: dict[str, int]) -> list[Reader]:
    """The position on ``qid`` of each of ``groups`` (from :func:`registered_groups`): its committed
    offset, or its low-level ``ack`` position (Spark's queue mode) when that one is lower."""
    if not groups:
        return []
    names = sorted(groups)
    with map_redis_errors(f"reading the committed offsets of {topic}#{qid}"):
        # One slot (the queue's), so one MGET on a cluster too.
        raws = await redis.mget([key for name in names
                                 for key in (keys.committed(name, topic, qid), keys.fetch_position(name, topic, qid))])
    out = []
    for index, name in enumerate(names):
        positions = [int(raw) for raw in raws[2 * index: 2 * index + 2] if raw is not None]
        out.append(Reader(name, min(positions) if positions else None, groups[name]))
    return out


async def head(redis: AsyncRedis, topic: str, qid: int, count: int = 1) -> list[QueueHead]:
    """The first ``count`` entries of the queue (offset, produce time); entries of a foreign writer
    end the list."""
    with map_redis_errors(f"reading the head of {topic}#{qid}"):
        entries: Any = await redis.xrange(keys.stream(topic, qid), "-", "+", count=count)
    out: list[QueueHead] = []
    for entry_id, fields in entries:
        entry = _entry(entry_id, fields)
        if entry is None:
            break
        out.append(entry)
    return out


async def entry_from(redis: AsyncRedis, topic: str, qid: int, offset: int) -> QueueHead | None:
    """The first entry at or after ``offset``."""
    with map_redis_errors(f"reading {topic}#{qid} at {offset}"):
        entries: Any = await redis.xrange(keys.stream(topic, qid), keys.stream_id(offset), "+", count=1)
    return _entry(*entries[0]) if entries else None


async def trim_below(redis: AsyncRedis, topic: str, qid: int, offset: int) -> int:
    """Remove every entry of the queue with an offset below ``offset``; how many went."""
    with map_redis_errors(f"trimming {topic}#{qid} below {offset}"):
        return int(await redis.execute_command("XTRIM", keys.stream(topic, qid), "MINID", keys.stream_id(offset)))


async def drop_trimmer(redis: AsyncRedis, topic: str, qid: int, owner: str) -> None:
    with map_redis_errors(f"letting go of the trimmer of {topic}#{qid}"):
        await eval_script(redis, TRIMMER_DROP_LUA, [keys.trimmer(topic, qid)], [owner])


async def record_expired(redis: AsyncRedis, group: str, topic: str, qid: int, first: int, last: int) -> int:
    """Count offsets ``first..last`` as expired for ``group`` (what ``ddmq status`` shows), leaving out
    those counted before; returns how many were new."""
    with map_redis_errors(f"counting expired entries of {group}/{topic}#{qid}"):
        return int(await eval_script(redis, EXPIRED_RECORD_LUA, [keys.expired(group, topic, qid)],
                                     [first, last, int(time.time() * 1000)]))


class Expired(NamedTuple):
    """What a group lost of one queue: how many entries in all, and the latest range (0, 0 when none)."""

    entries: int
    first: int
    last: int


async def expired_records(redis: AsyncRedis, group: str, topic: str, queues: int) -> list[Expired]:
    """Per qid: the entries counted as expired for ``group``."""
    with map_redis_errors(f"reading expired counts of {group}/{topic}"):
        async with redis.pipeline(transaction=False) as pipe:
            for qid in range(queues):
                pipe.hmget(keys.expired(group, topic, qid), "count", "first", "last")
            raws = await pipe.execute()
    return [Expired(*(int(value or 0) for value in raw)) for raw in raws]



class RedisMemory(NamedTuple):
    used_bytes: int
    #: 0 = no limit.
    max_bytes: int


async def redis_memory(redis: AsyncRedis) -> RedisMemory:
    """Used memory and ``maxmemory``, summed over the masters of a cluster."""
    with map_redis_errors("reading Redis memory"):
        if isinstance(redis, RedisCluster):
            infos = await redis.info("memory", target_nodes=RedisCluster.PRIMARIES)
            nodes = list(infos.values()) if isinstance(infos, dict) and "used_memory" not in infos else [infos]
        else:
            nodes = [await redis.info("memory")]
    return RedisMemory(sum(int(node.get("used_memory", 0)) for node in nodes),
                       sum(int(node.get("maxmemory", 0)) for node in nodes))


class StreamSize(NamedTuple):
    entries: int
    bytes: int


async def stream_sizes(redis: AsyncRedis, queues: list[tuple[str, int]]) -> list[StreamSize]:
    """Entries and memory (``MEMORY USAGE``, sampled) of each of ``queues``' streams, in one pipeline."""
    if not queues:
        return []
    with map_redis_errors(f"measuring {len(queues)} streams"):
        async with redis.pipeline(transaction=False) as pipe:
            for topic, qid in queues:
                pipe.xlen(keys.stream(topic, qid))
                pipe.memory_usage(keys.stream(topic, qid))
            replies = await pipe.execute()
    pairs = zip(replies[::2], replies[1::2], strict=True)
    return [StreamSize(int(entries or 0), int(size or 0)) for entries, size in pairs]
