"""TopicConsumer on its own (no service, no servers) over real Redis: delivery in key order, the
commit point, the hand-off of queues between two proxies."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from ddmq.config.schema import TopicGroupConfig
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.engine.offsets import decode_ranges

from ...support import OrderChecker
from ..consumers import Proxy, consume_all, deliver, produce


async def committed(proxy: Proxy, queues: int) -> list[int | None]:
    return [await proxy.broker.committed_offset("g", "t", qid) for qid in range(queues)]


async def produced_ends(proxy: Proxy, queues: int) -> list[int]:
    return [await proxy.broker.next_produce_offset("t", qid) for qid in range(queues)]


async def test_every_message_is_delivered_in_key_order_and_committed(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 4)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i % 20}" for i in range(400)])
    checker = OrderChecker()
    config = TopicGroupConfig(concurrency=16, read_batch_size=8)
    async with Proxy(redis_client, "p1", config) as proxy:
        await proxy.wait_held({0, 1, 2, 3})
        await consume_all([(proxy, 0)], checker, produced, concurrency=16)
        await produce(redis_url, produced, [f"k{i % 7}" for i in range(50)])  # read while running
        await consume_all([(proxy, 0)], checker, produced, concurrency=16)
        await proxy.consumer.commits.flush()
        assert await committed(proxy, 4) == await produced_ends(proxy, 4)
    assert checker.violations == [] and checker.missing(produced) == {}
    assert checker.duplicates == 0  # one owner, every message acked at once: nothing is redelivered


async def test_the_commit_stops_at_the_first_unfinished_message(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i}" for i in range(10)], qid=0)  # offsets 1..10, one key each
    checker = OrderChecker()
    async with Proxy(redis_client, "p1") as first:
        await first.wait_held({0})
        batches = []
        while sum(len(b.messages) for b in batches) < 10:
            batch = await first.pull()
            if not batch.messages:
                await asyncio.sleep(0.01)  # the reader is still reading
                continue
            deliver(first, batch, checker, ack=False)
            batches.append(batch)
        delivered = [m for b in batches for m in b.messages]
        assert sorted(m.offset for m in delivered) == list(range(1, 11))
        queue = batches[0].queue
        assert queue is not None
        first.buffer.ack(queue, [m.offset for m in delivered if m.offset != 4])
        for m in delivered:
            if m.offset != 4:
                event = json.loads(m.value)
                checker.acked(event["k"], event["seq"])
        await first.consumer.commits.flush()
        assert await committed(first, 1) == [4]
        assert decode_ranges(await first.broker.finished_offsets("g", "t", 0)) == set(range(5, 11))
    # Offset 4 was never acked: the next owner delivers it again, and only it.
    async with Proxy(redis_client, "p2") as second:
        await second.wait_held({0})
        await consume_all([(second, 1)], checker, produced)
        assert second.consumer.counters["skipped_finished"] == 6
        assert second.consumer.counters["read"] == 1
        await second.consumer.commits.flush()
        assert await committed(second, 1) == [11]
    assert checker.violations == [] and checker.missing(produced) == {}


async def test_queues_move_to_a_second_proxy_without_loss_or_reordering(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 4)
    produced: dict[str, int] = {}
    keys = [f"k{i % 30}" for i in range(300)]
    await produce(redis_url, produced, keys)
    checker = OrderChecker()
    # "p2" sorts after "p1": once both are members, p1 owns queues 0-1 and p2 keeps 2-3. Jobs the
    # first owner delivered and never got acked go again: after the move from the next owner, on the
    # queues it keeps once their pull times out.
    async with Proxy(redis_client, "p2", TopicGroupConfig(timeout_ms=300)) as old:
        await old.wait_held({0, 1, 2, 3})
        half = 0
        while half < 150:
            batch = await old.pull(10)
            if not batch.messages:
                await asyncio.sleep(0.01)  # the readers are still reading
                continue
            deliver(old, batch, checker, epoch=0, ack=half < 100)
            half += len(batch.messages)
        async with Proxy(redis_client, "p1") as new:
            await produce(redis_url, produced, keys)  # read by whoever owns the queue by then
            await consume_all([(old, 0), (new, 1)], checker, produced)
            await old.wait_held({2, 3})
            await new.wait_held({0, 1})
            await old.consumer.commits.flush()
            await new.consumer.commits.flush()
            assert await committed(new, 4) == await produced_ends(new, 4)
    assert checker.violations == [] and checker.missing(produced) == {}
