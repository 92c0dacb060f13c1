"""Filter and Transit in a running proxy with pull clients: dropped messages finish at once, kept ones
arrive reshaped, per key in order, and every offset is committed."""

from __future__ import annotations

import json

import redis.asyncio as aioredis

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.core.types import QueueResult
from tests.support import OrderChecker

from ..proxy.conftest import running_proxy
from .conftest import dead_letters, produce, wait_all_finished

CHAIN = {
    "actions": ["Json", "Filter", "Transit", "Order", "PullServer"],
    "filter": {"exclude_tags": ["noise"], "expression": "$.e != 'heartbeat' and $.r.id != null"},
    "transit": {"rider": "$.r.id", "event": "$.e", "meta.seq": "$.seq", "meta.fare": "$.fare.amount"},
    "order_key": "$.rider",  # read from the reshaped body
}


async def test_filter_drops_transit_reshapes_order_holds(redis_url: str) -> None:
    checker = OrderChecker()
    async with running_proxy(redis_url, CHAIN) as service:
        riders = [f"r{i}" for i in range(12)]
        kept: dict[str, int] = {}
        dropped = 0
        producer = AsyncProducer(redis_url)
        try:
            for step in range(9):
                for rider in riders:
                    if step % 3 == 2:  # heartbeats: dropped by the expression
                        body = {"r": {"id": rider}, "e": "heartbeat"}
                        await producer.send("t", json.dumps(body), key=rider)
                        dropped += 1
                    if step % 4 == 1:  # tagged noise: dropped by tag
                        await producer.send("t", json.dumps({"r": {"id": rider}, "e": "x"}), key=rider, tag="noise")
                        dropped += 1
                    seq = kept.get(rider, 0)
                    body = {"r": {"id": rider}, "e": f"step{step}", "seq": seq, "fare": {"amount": step * 1.5}}
                    await producer.send("t", json.dumps(body), key=rider, tag="ride")
                    kept[rider] = seq + 1
            await producer.send("t", "not json", key="x")  # paths find nothing: dropped by the expression
            dropped += 1
        finally:
            await producer.close()

        results: list[QueueResult] = []
        delivered = 0
        while delivered < sum(kept.values()):
            batch = await service.api.pull("g", "t", 16, 2000, results)
            assert batch.queue is not None, "a kept message was not delivered"
            for message in batch.messages:
                body = json.loads(message.value)
                assert set(body) == {"rider", "event", "meta"}
                assert body["event"].startswith("step")
                assert body["meta"]["fare"] == int(body["event"][4:]) * 1.5
                checker.delivered(body["rider"], body["meta"]["seq"])
                checker.acked(body["rider"], body["meta"]["seq"])
            delivered += len(batch.messages)
            results = [QueueResult("g", "t", str(batch.queue.qid), [m.offset for m in batch.messages], [])]
        await service.api.submit(results)
        await wait_all_finished(service)
        assert service.groups["g"].consumers["t"].counters["filtered_out"] == dropped
        leftover = await service.api.pull("g", "t", 16, 0, [])
        assert leftover.messages == []
    assert checker.violations == []
    assert checker.missing(kept) == {}


async def test_transit_dead_letters_a_body_that_is_not_json(redis_url: str, redis_client: aioredis.Redis) -> None:
    config = {"actions": ["Json", "Transit", "Order", "PullServer"], "transit": {"id": "$.id"}, "order_key": "KEY"}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("k", "{broken"), ("k", {"id": 7, "other": 1})])
        batch = await service.api.pull("g", "t", 16, 2000, [])
        assert [json.loads(m.value) for m in batch.messages] == [{"id": 7}]
        assert batch.queue is not None
        await service.api.submit([QueueResult("g", "t", str(batch.queue.qid), [batch.messages[0].offset], [])])
        await wait_all_finished(service)
    [dead] = await dead_letters(redis_client)
    assert dead["v"] == "{broken" and "not JSON" in dead["error"] and dead["attempts"] == "0"
