"""A proxy whose consumers all start at once (many groups of one topic, one service over the real Redis):
it opens every queue a few at a time on few connections, and every group gets every message in
per-key order."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from ddmq.config import parse
from ddmq.proxy.core.types import QueueResult
from ddmq.proxy.service import ProxyService
from ddmq.proxy.store.broker import OPENING_AT_ONCE

from ..support import OrderChecker
from .consumers import produce

GROUPS = [f"g{i:03d}" for i in range(100)]


async def test_many_consumers_starting_at_once_open_every_queue_on_few_connections_and_deliver_in_order(
    redis_url: str,
) -> None:
    config = parse({
        "instance_id": "start-up", "redis": redis_url, "thrift": {"port": 0}, "shutdown_grace_ms": 0,
        "topics": {"t": {"queues": 2}},
        "groups": {group: {"t": {"order_key": "KEY"}} for group in GROUPS},
    })
    checkers = {group: OrderChecker() for group in GROUPS}
    service = ProxyService(config)
    await service.start()  # declares the topic's 2 queues
    try:
        consumers = [service.groups[group].consumers["t"] for group in GROUPS]
        async with asyncio.timeout(30):
            while any(len(consumer.owned.readers()) < 2 for consumer in consumers):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        assert all(set(consumer.held) == {0, 1} for consumer in consumers)
        # 100 consumers opening 200 queues all at once took a connection per call in flight (two or
        # three per claim): a few at a time (Broker.opening) keep the pool near that many. Counted
        # before any message: a queue being read blocks on a connection of its own.
        assert service.broker is not None
        assert service.broker.connections.count <= 3 * OPENING_AT_ONCE, service.broker.connections.count
        produced: dict[str, int] = {}
        await produce(redis_url, produced, [f"k{i % 7}" for i in range(40)])
        acks: dict[str, list[QueueResult]] = {group: [] for group in GROUPS}
        async with asyncio.timeout(60):
            while waiting := [group for group in GROUPS if checkers[group].missing(produced)]:
                for group in waiting:
                    batch = await service.api.pull(group, "t", None, 0, acks[group])
                    acks[group] = []
                    if batch.queue is None or not batch.messages:
                        continue
                    for message in batch.messages:
                        event = json.loads(message.value)
                        checkers[group].delivered(event["k"], event["seq"])
                        checkers[group].acked(event["k"], event["seq"])
                    acks[group] = [QueueResult(group, "t", str(batch.queue.qid),
                                               [m.offset for m in batch.messages], [])]
                await asyncio.sleep(0.01)
        await service.api.submit([result for results in acks.values() for result in results])
        assert {group: checker.violations for group, checker in checkers.items() if checker.violations} == {}
    finally:
        await service.close()


async def test_a_redis_that_may_evict_keys_is_named_at_start_up_and_noeviction_is_not(
    redis_url: str, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse({"instance_id": "eviction", "redis": redis_url, "thrift": {"port": 0}, "shutdown_grace_ms": 0,
                    "topics": {"t": {"queues": 1}}, "groups": {"g": {"t": {}}}})
    before = next(iter((await redis_client.config_get("maxmemory-policy")).values()))
    try:
        for policy, warned in (("allkeys-lru", True), ("volatile-ttl", True), ("noeviction", False)):
            await redis_client.config_set("maxmemory-policy", policy)
            caplog.clear()
            async with ProxyService(config):
                pass
            said = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
            assert bool(said) == warned, (policy, said)
            if warned:
                assert policy in said[0] and "noeviction" in said[0]
    finally:
        await redis_client.config_set("maxmemory-policy", before)
