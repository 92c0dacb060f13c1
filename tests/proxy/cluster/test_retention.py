"""Retention against a real Redis, and a real Redis Cluster: the consumed trim follows the slowest group
and never passes it, caps and a producer's maxlen drop entries that the group then counts as expired,
exactly, while it receives the rest in order."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from ddmq.client.cli.status import format_status
from ddmq.config.schema import RetentionConfig
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import AsyncRedis, async_redis, sync_redis
from ddmq.protocol.redis.status import group_status
from ddmq.proxy.cluster.membership import STAMP_EVERY_MS
from ddmq.proxy.cluster.retention import cap_floor, consumed_floor
from ddmq.proxy.store.trim import QueueHead, Reader
from tests.support import OrderChecker, produce_keyed

from ..conftest import running_proxy
from ..retention_support import consume, wait_for

#: Messages of the two-groups run on a single Redis and on the Cluster, scaled to the CI budget (the
#: bench row runs 1M); ``DDMQ_RETENTION_TEST_MESSAGES=200000`` runs both at full size.
MESSAGES = {"redis": 20_000, "cluster": 6_000}
if os.environ.get("DDMQ_RETENTION_TEST_MESSAGES"):
    MESSAGES = dict.fromkeys(MESSAGES, int(os.environ["DDMQ_RETENTION_TEST_MESSAGES"]))
QUEUES = 4
#: Entries a queue may hold past what the slower group has not finished: the trimmer runs every 50 ms
#: and commits every 50 ms, so a few reads' worth (read_batch_size 256 per queue) at most.
SLACK = 1_500

FAST_RETENTION = {"interval_ms": 50, "step": 500}


@pytest.fixture(params=["redis", "cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str, AsyncRedis]]:
    """(kind, url, client) of a single Redis or of the Redis Cluster, emptied."""
    kind: str = request.param
    url: str = request.getfixturevalue("redis_url" if kind == "redis" else "cluster_url")
    client = async_redis(url, decode_responses=False)
    try:
        yield kind, url, client
    finally:
        await client.aclose()


async def committed(client: AsyncRedis, group: str, qid: int, topic: str = "t") -> int:
    raw = await client.get(keys.committed(group, topic, qid))
    return int(raw) if raw is not None else 1


async def head(client: AsyncRedis, qid: int, topic: str = "t") -> int | None:
    entries = await client.xrange(keys.stream(topic, qid), "-", "+", count=1)
    return keys.offset_of(entries[0][0]) if entries else None


async def sequence(client: AsyncRedis, qid: int, topic: str = "t") -> int:
    return int(await client.get(keys.sequence(topic, qid)) or 0)


async def test_consumed_retention_follows_the_slower_group_and_never_passes_it(
    store: tuple[str, str, AsyncRedis]
) -> None:
    kind, redis_url, redis_client = store
    count = MESSAGES[kind]
    groups = {"fast": {"t": {}}, "slow": {"t": {}}}
    topics = {"t": {"queues": QUEUES, "retention": FAST_RETENTION}}
    async with running_proxy(redis_url, queues=QUEUES, groups=groups, topics=topics) as service:
        async def registered() -> bool:
            return all([await redis_client.hexists(keys.group_topics(g), "t") for g in groups])
        await wait_for(registered, what="both groups in the registry")
        produced: dict[str, int] = {}
        producing = asyncio.create_task(asyncio.to_thread(
            produce_keyed, redis_url, count, produced, random.Random(7), keys=300, pause_s=0.02))
        fast, slow = OrderChecker(), OrderChecker()
        violations: list[str] = []
        samples = 0

        async def watch() -> None:
            nonlocal samples
            while True:
                for qid in range(QUEUES):
                    # Head before the committed offset: the offset only grows, so head <= it must hold.
                    first = await head(redis_client, qid)
                    slow_at = await committed(redis_client, "slow", qid)
                    if first is not None and first > slow_at:
                        violations.append(f"#{qid}: head {first} past the slow group's offset {slow_at}")
                    # The committed offset before the length: the length only shrinks as it grows.
                    slow_at = await committed(redis_client, "slow", qid)
                    end = await sequence(redis_client, qid)
                    length = await redis_client.xlen(keys.stream("t", qid))
                    if length > max(0, end - slow_at + 1) + SLACK:
                        violations.append(f"#{qid}: {length} entries, slow group at {slow_at} of {end}")
                samples += 1
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch())
        try:
            await asyncio.gather(
                consume(service, "fast", fast, count, deadline_s=max(60.0, count / 400)),
                consume(service, "slow", slow, count, pause_s=0.01, max_batch=16, deadline_s=max(60.0, count / 400)),
            )
            await producing
        finally:
            watcher.cancel()
        assert not violations, violations[:5]
        assert samples > 10
        for checker in (fast, slow):
            assert not checker.violations, checker.violations[:5]
            assert checker.missing(produced) == {}

        async def drained() -> bool:
            return sum([await redis_client.xlen(keys.stream("t", q)) for q in range(QUEUES)]) == 0
        await wait_for(drained, what="every queue trimmed once both groups finished")
        consumers = [service.groups[g].consumers["t"] for g in groups]
        assert all(sum(c.expired.values()) == 0 for c in consumers)
        assert service.retention is not None
        assert sum(service.retention.trimmed.values()) == count


async def test_a_stopped_group_holds_the_trim_back_and_is_named(redis_url: str, redis_client: aioredis.Redis) -> None:
    topics = {"t": {"queues": 1, "retention": FAST_RETENTION}}
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce_keyed, redis_url, 300, produced, random.Random(1), keys=10, queues=1)
    # "idle" consumes 100 and stops; "live" consumes everything.
    async with running_proxy(redis_url, queues=1, groups={"idle": {"t": {}}}, topics=topics) as service:
        await consume(service, "idle", OrderChecker(), 100, max_batch=10)
    async with running_proxy(redis_url, queues=1, groups={"live": {"t": {}}}, topics=topics) as service:
        await consume(service, "live", OrderChecker(), 300)
        assert service.retention is not None
        retention = service.retention

        async def held_back() -> bool:
            holder = retention.holders.get(("t", 0))
            return holder is not None and holder.group == "idle"
        await wait_for(held_back, what="the idle group named as the holder")
        holder = retention.holders["t", 0]
        idle_at = await committed(redis_client, "idle", 0)
        assert holder.committed == idle_at and holder.retained == 300 - idle_at + 1
        assert holder.oldest_ms > 0
        assert await head(redis_client, 0) == idle_at
        # ddmq status (and the admin API, which answers with the same) names it too.
        with sync_redis(redis_url) as client:
            status = group_status(client, "live", ["t"])
        assert [(h.topic, h.group, h.retained) for h in status.retention] == [("t", "idle", 300 - idle_at + 1)]
        assert status.queues[0].stored == 300 - idle_at + 1 and status.queues[0].expired == 0
        assert f"retention of t: held back by group idle, {300 - idle_at + 1} message(s) kept" in format_status(status)
        assert status.used_memory > 0


async def test_group_idle_after_lets_the_trim_pass_and_the_group_counts_it(
    redis_url: str, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    topics = {"t": {"queues": 1, "retention": {**FAST_RETENTION, "group_idle_after_s": 1}}}
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce_keyed, redis_url, 300, produced, random.Random(2), keys=10, queues=1)
    async with running_proxy(redis_url, queues=1, groups={"idle": {"t": {}}}, topics=topics) as service:
        await consume(service, "idle", OrderChecker(), 100, max_batch=10)
    idle_at = await committed(redis_client, "idle", 0)
    async with running_proxy(redis_url, queues=1, groups={"live": {"t": {}}}, topics=topics) as service:
        await consume(service, "live", OrderChecker(), 300)

        async def trimmed() -> bool:
            return await redis_client.xlen(keys.stream("t", 0)) == 0
        await wait_for(trimmed, what="the idle group no longer holding the trim")
    # The idle group comes back: what was trimmed past it is expired for it, the rest does not exist.
    caplog.set_level(logging.ERROR)
    await asyncio.to_thread(produce_keyed, redis_url, 50, {}, random.Random(3), keys=10, key_prefix="new-")
    async with running_proxy(redis_url, queues=1, groups={"idle": {"t": {}}}, topics=topics) as service:
        checker = OrderChecker()
        await consume(service, "idle", checker, 50)
        assert checker.deliveries == 50 and not checker.violations
        consumer = service.groups["idle"].consumers["t"]
        assert consumer.expired[0] == 300 - idle_at + 1
    assert f"group idle lost offsets {idle_at}..300 of t#0" in caplog.text


async def _expired_run(redis_url: str, redis_client: AsyncRedis, topics: dict[str, Any], trim: Any) -> None:
    """The group starts once (it is registered and its offset stored, at 1), stops; 1000 messages are
    produced on one queue and ``trim`` drops some; then the group consumes: it gets exactly the rest, in
    order, and counts exactly the dropped ones as expired (metric and Redis)."""
    async with running_proxy(redis_url, queues=1, groups={"late": {"t": {}}}, topics=topics):
        async def started() -> bool:
            return await redis_client.get(keys.committed("late", "t", 0)) == b"1"
        await wait_for(started, what="the group's offset stored")
    values = [json.dumps({"k": f"k{i % 7}", "seq": i // 7}) for i in range(1000)]
    await trim(values)
    left = await redis_client.xlen(keys.stream("t", 0))
    assert 0 < left < 1000
    first_left = await head(redis_client, 0)
    assert first_left == 1000 - left + 1
    async with running_proxy(redis_url, queues=1, groups={"late": {"t": {}}}, topics=topics,
                             http={"enabled": True, "port": 0}) as service:
        checker = OrderChecker()
        # Each key's first delivered seq is its first kept one.
        for i in range(first_left - 1):
            key, seq = f"k{i % 7}", i // 7
            checker.acked_upto[key] = seq + 1
        await consume(service, "late", checker, left)
        assert checker.deliveries == left and not checker.violations
        consumer = service.groups["late"].consumers["t"]
        assert consumer.expired[0] == 1000 - left
        assert int(await redis_client.hget(keys.expired("late", "t", 0), "count")) == 1000 - left
        with sync_redis(redis_url) as client:
            status = group_status(client, "late", ["t"])
        assert status.queues[0].expired == 1000 - left
        assert f"EXPIRED: {1000 - left} message(s) of 1 queue(s)" in format_status(status)
        await service.metrics.refresh()
        text = service.metrics.render().decode()
        assert f'ddmq_messages_expired_total{{group="late"}} {float(1000 - left)}' in text  # per group by default


async def test_max_len_on_a_topic_nobody_consumes_counts_what_it_dropped(store: tuple[str, str, AsyncRedis]) -> None:
    _, redis_url, redis_client = store
    topics = {"t": {"queues": 1, "retention": {**FAST_RETENTION, "max_len": 300}}}

    async def trim(values: list[str]) -> None:
        async with running_proxy(redis_url, queues=1, groups={}, topics=topics):
            with Producer(redis_url) as producer:
                for start in range(0, 1000, 100):
                    producer.send_batch("t", [{"key": None, "value": v, "qid": 0} for v in values[start:start + 100]])

            async def capped() -> bool:
                return await redis_client.xlen(keys.stream("t", 0)) <= 300
            await wait_for(capped, what="max_len applied")

    await _expired_run(redis_url, redis_client, topics, trim)


async def test_a_producer_maxlen_trim_is_counted_as_expired(store: tuple[str, str, AsyncRedis]) -> None:
    _, redis_url, redis_client = store
    topics = {"t": {"queues": 1, "retention": FAST_RETENTION}}

    async def trim(values: list[str]) -> None:
        with Producer(redis_url, maxlen=200) as producer:
            producer.ensure_topic("t", 1)
            for start in range(0, 1000, 100):
                producer.send_batch("t", [{"key": None, "value": v, "qid": 0} for v in values[start:start + 100]])

    await _expired_run(redis_url, redis_client, topics, trim)


async def test_a_new_group_starts_where_the_queue_starts_and_lost_nothing(
    redis_url: str, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """What was trimmed before a group existed was never the group's: it starts at the queue's first
    entry and counts nothing as expired."""
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce_keyed, redis_url, 100, produced, random.Random(5), keys=1, queues=1)
    await redis_client.xtrim(keys.stream("t", 0), minid=keys.stream_id(41), approximate=False)
    caplog.set_level(logging.ERROR)
    async with running_proxy(redis_url, queues=1, groups={"fresh": {"t": {}}}) as service:
        checker = OrderChecker(acked_upto={"key-0": 40})
        await consume(service, "fresh", checker, 60)
        assert checker.deliveries == 60 and not checker.violations and checker.missing(produced) == {}
        assert sum(service.groups["fresh"].consumers["t"].expired.values()) == 0
    assert "lost offsets" not in caplog.text


def test_the_floors_of_each_rule() -> None:
    now = 10_000 + STAMP_EVERY_MS
    readers = [Reader("a", 50, 9_000), Reader("b", 20, 9_000), Reader("idle", 5, 0), Reader("new", None, 9_000)]
    # The lowest position of the groups heard from within group_idle_after_s (plus the heartbeat's
    # stamp interval); a group without an offset holds the queue at its head.
    assert consumed_floor(readers[:3], head=1, now_ms=now, idle_after_s=None) == (5, readers[2])
    assert consumed_floor(readers[:3], head=1, now_ms=now, idle_after_s=1) == (20, readers[1])
    assert consumed_floor(readers, head=3, now_ms=now, idle_after_s=1)[0] == 3
    # A stamp written up to STAMP_EVERY_MS late still counts as live.
    late, gone = Reader("late", 7, now - 1_000 - STAMP_EVERY_MS), Reader("gone", 6, now - 1_001 - STAMP_EVERY_MS)
    assert consumed_floor([readers[0], late], head=1, now_ms=now, idle_after_s=1) == (7, late)
    assert consumed_floor([readers[0], gone], head=1, now_ms=now, idle_after_s=1) == (50, readers[0])
    assert consumed_floor([], head=7, now_ms=0, idle_after_s=None) == (7, None)
    entries = [QueueHead(offset, produce_ms) for offset, produce_ms in [(10, 100), (11, 200), (12, 900)]]
    assert cap_floor(RetentionConfig(), 100, entries, 1_000) == 0
    assert cap_floor(RetentionConfig(max_len=30), 100, entries, 1_000) == 71
    assert cap_floor(RetentionConfig(max_age_s=1), 100, entries, 1_150) == 11  # 10 is older than 1 s
    assert cap_floor(RetentionConfig(max_age_s=1), 100, entries, 5_000) == 13  # all of them are
    assert cap_floor(RetentionConfig(max_age_s=1, max_len=95), 100, entries, 1_150) == 11


async def test_max_age_removes_what_is_older_and_keeps_the_rest(redis_url: str, redis_client: aioredis.Redis) -> None:
    topics = {"t": {"queues": 1, "retention": {**FAST_RETENTION, "max_age_s": 3}}}
    async with running_proxy(redis_url, queues=1, groups={}, topics=topics):
        await asyncio.to_thread(produce_keyed, redis_url, 100, {}, random.Random(8), keys=5)
        await asyncio.sleep(3.2)
        await asyncio.to_thread(produce_keyed, redis_url, 100, {}, random.Random(9), keys=5)

        async def aged_out() -> bool:
            return await head(redis_client, 0) == 101
        await wait_for(aged_out, timeout_s=2.5, what="the old entries removed")
        assert await redis_client.xlen(keys.stream("t", 0)) == 100
