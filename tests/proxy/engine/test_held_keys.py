"""Held keys over real Redis: a burst of one key longer than the read-ahead window leaves the rest of
its queue (and the topic's other queues) flowing; the burst's messages wait in Redis, are read again in
the key's order, and nothing is lost, through a hand-off mid-burst too."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from ddmq.config.schema import TopicGroupConfig
from ddmq.protocol.redis.queues import ensure_topic

from ...support import OrderChecker
from ..consumers import Proxy, deliver, events, produce

HOT = "hot"
#: Small windows so that the burst is many times both: 20 per key, 200 per topic.
SETTINGS = {"concurrency": 200, "key_buffer": 20, "read_batch_size": 50}


async def drain(
    proxies: list[tuple[Proxy, int]], checker: OrderChecker, produced: dict[str, int], *, others_done_at: list[int],
    hot_acks: int = 0, stop_after_hot: int | None = None, timeout_s: float = 60, peak_held: list[int] | None = None,
) -> int:
    """Pull from every (proxy, epoch) and ack everything, the hot key one message per pull (a slow
    consumer of it), until every produced message is acked or ``stop_after_hot`` hot acks. Appends to
    ``others_done_at`` how many hot acks had been made when every other key was done. Returns the hot acks."""
    others = {key: n for key, n in produced.items() if key != HOT}
    async with asyncio.timeout(timeout_s):
        while checker.missing(produced) and (stop_after_hot is None or hot_acks < stop_after_hot):
            idle = True
            for proxy, epoch in proxies:
                # held messages do not count against the window; the resumer may pass it by one key's cap
                assert proxy.consumer.unfinished <= SETTINGS["concurrency"] + SETTINGS["key_buffer"]
                if peak_held is not None:
                    peak_held.append(max(proxy.consumer.jobs.held.per_queue.values(), default=0))
                batch = await proxy.pull(100)
                if not batch.messages:
                    continue
                idle = False
                deliver(proxy, batch, checker, epoch)
                hot_acks += sum(1 for key, _ in events(batch) if key == HOT)
                if not others_done_at and not checker.missing(others):
                    others_done_at.append(hot_acks)
            if idle:
                await asyncio.sleep(0.005)
    return hot_acks


async def committed(proxy: Proxy, qids: range) -> list[int | None]:
    await proxy.consumer.commits.flush()
    return [await proxy.broker.committed_offset("g", "t", qid) for qid in qids]


@pytest.mark.parametrize("order_key", ["KEY", "$.k"])
@pytest.mark.parametrize("where", ["same queue", "other queue"])
async def test_a_burst_of_one_key_past_the_window_does_not_hold_back_the_other_keys(
    redis_url: str, redis_client: aioredis.Redis, order_key: str, where: str
) -> None:
    await ensure_topic(redis_client, "t", 2)
    produced: dict[str, int] = {}
    burst = 2_000  # ten times the window, a hundred times the key's cap
    await produce(redis_url, produced, [HOT] * burst, qid=0)
    await produce(redis_url, produced, [f"k{i}" for i in range(300)], qid=0 if where == "same queue" else 1)
    checker = OrderChecker()
    done_at: list[int] = []
    config = TopicGroupConfig(order_key=order_key, **SETTINGS)
    async with Proxy(redis_client, "p1", config) as proxy:
        await proxy.wait_held({0, 1})
        await drain([(proxy, 0)], checker, produced, others_done_at=done_at)
        assert done_at and done_at[0] <= burst // 10, f"the other keys finished after {done_at} hot acks"
        assert proxy.consumer.jobs.held.held_total > 0 and not proxy.consumer.jobs.held.keys
        assert proxy.consumer.counters["resumed"] == proxy.consumer.jobs.held.held_total
        assert await committed(proxy, range(2)) == [
            burst + (300 if where == "same queue" else 0) + 1, (300 if where == "other queue" else 0) + 1
        ]
    assert checker.violations == [] and checker.missing(produced) == {}
    assert checker.duplicates == 0


async def test_a_hand_off_mid_burst_delivers_the_held_messages_from_redis_in_order(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    burst = 1_000
    keys = [HOT] * burst + [f"k{i}" for i in range(200)] + [HOT] * 100 + [f"k{i}" for i in range(200)]
    await produce(redis_url, produced, keys, qid=0)
    checker = OrderChecker()
    done_at: list[int] = []
    config = TopicGroupConfig(**SETTINGS)
    # "p2" reads first and goes away (a clean stop) while most of the burst is held in Redis.
    async with Proxy(redis_client, "p2", config) as old:
        await old.wait_held({0})
        hot = await drain([(old, 0)], checker, produced, others_done_at=done_at, stop_after_hot=50)
        assert old.consumer.jobs.held.per_queue[0] > 0
        await old.consumer.commits.flush()
        # The commit point stays at the hot key's first unacked message; the others' finished work is recorded.
        assert await old.broker.committed_offset("g", "t", 0) == hot + 1
    async with Proxy(redis_client, "p1", config) as new:
        await new.wait_held({0})
        await drain([(new, 1)], checker, produced, others_done_at=done_at, hot_acks=hot)
        assert await committed(new, range(1)) == [len(keys) + 1]
    assert checker.violations == [] and checker.missing(produced) == {}
    # The new owner skipped what the old one finished past its commit point: no key other than the hot
    # one (whose in-memory jobs were not acked) was delivered twice.
    assert checker.duplicates <= SETTINGS["key_buffer"]


async def test_by_queue_order_a_queue_is_one_key_and_the_other_queues_flow(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 2)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [HOT] * 2_000, qid=0)
    await produce(redis_url, produced, [f"k{i}" for i in range(300)], qid=1)
    checker = OrderChecker()
    done_at: list[int] = []
    peak: list[int] = []
    async with Proxy(redis_client, "p1", TopicGroupConfig(order_key="QID", **SETTINGS)) as proxy:
        await proxy.wait_held({0, 1})
        await drain([(proxy, 0)], checker, produced, others_done_at=done_at, peak_held=peak)
        assert await committed(proxy, range(2)) == [2_001, 301]
    # The queue's reader waits once a read's worth is held: it does not read the whole queue twice.
    assert 0 < max(peak) <= 2 * SETTINGS["read_batch_size"]
    assert checker.violations == [] and checker.missing(produced) == {}
