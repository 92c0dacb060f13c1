"""The Json action reads bodies the way json.loads does: UTF-8 fast, and UTF-8 with a BOM, UTF-16 and
UTF-32 too; only what is not JSON at all follows the order-key fallback."""

from __future__ import annotations

import json

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.core.types import QueueResult

from ..conftest import running_proxy

BODIES = [
    b'{"k": "a", "n": 1}',
    '\ufeff{"k": "a", "n": 2}'.encode(),  # UTF-8 with a BOM
    '{"k": "a", "n": 3, "é": "日本"}'.encode("utf-16"),
    '{"k": "a", "n": 4}'.encode("utf-32-le"),
    b'{"k": "a", "n": 5, "bad": "\xff"}',  # not UTF-8, not JSON
    b"[1, 2",
]


async def test_json_bodies_in_any_standard_encoding_give_their_key(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "$.k", "order_key_fallback": "none"}) as service:
        producer = AsyncProducer(redis_url)
        try:
            for body in BODIES:
                await producer.send("t", body, qid=0)
        finally:
            await producer.close()
        received: list[bytes] = []
        results: list[QueueResult] = []
        while len(received) < len(BODIES):
            batch = await service.api.pull("g", "t", 10, 2000, results)
            assert batch.queue is not None
            received += [m.value for m in batch.messages]
            results = [QueueResult("g", "t", str(batch.queue.qid), [m.offset for m in batch.messages], [])]
        await service.api.submit(results)
        counters = service.groups["g"].consumers["t"].counters
        assert counters["json_invalid"] == 2
        assert counters["order_key_missing"] == 2
        # The four readable bodies share key "a": delivered one at a time, in order.
        assert [body for body in received if body in BODIES[:4]] == BODIES[:4]


async def test_ids_past_64_bits_stay_distinct_keys_each_in_order(redis_url: str) -> None:
    """2**64 and 2**64 + 1 are one float but two integers: two keys, each delivered whole and in order
    (one head per key per pull, so the first pull has both keys' first messages)."""
    ids = (2**64, 2**64 + 1)
    produced = [(ids[n % 2], n // 2) for n in range(20)]
    async with running_proxy(redis_url, {"order_key": "$.id"}) as service:
        producer = AsyncProducer(redis_url)
        try:
            for key, seq in produced:
                await producer.send("t", f'{{"id":{key},"seq":{seq}}}'.encode(), qid=0)
        finally:
            await producer.close()
        seen: dict[int, list[int]] = {key: [] for key in ids}
        results: list[QueueResult] = []
        pulls = []
        while sum(map(len, seen.values())) < len(produced):
            batch = await service.api.pull("g", "t", 10, 2000, results)
            assert batch.queue is not None
            pulls.append(len(batch.messages))
            for message in batch.messages:
                event = json.loads(message.value)
                seen[event["id"]].append(event["seq"])
            results = [QueueResult("g", "t", str(batch.queue.qid), [m.offset for m in batch.messages], [])]
        await service.api.submit(results)
    assert pulls[0] == 2, pulls
    assert seen == {key: list(range(10)) for key in ids}
