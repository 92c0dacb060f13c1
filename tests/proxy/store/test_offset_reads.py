"""Reading held messages again by offset over real Redis: runs of nearby offsets share one ``XRANGE``,
the entries between them are dropped, and offsets that are gone are left out."""

from __future__ import annotations

import redis.asyncio as aioredis

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.store.broker import Broker
from ddmq.proxy.store.offset_reads import GAP, read_offsets, runs


def test_runs_join_offsets_up_to_the_gap_apart() -> None:
    assert runs([1, 2, 3, 7, 8]) == [(1, 3), (7, 8)]
    assert runs([1, 2, 3, 7, 8], gap=3) == [(1, 8)]
    assert runs([1, 2 + GAP, 4 + 2 * GAP], gap=GAP) == [(1, 2 + GAP), (4 + 2 * GAP, 4 + 2 * GAP)]
    assert runs([]) == []


async def test_only_the_offsets_asked_for_come_back(redis_url: str, redis_client: aioredis.Redis) -> None:
    await ensure_topic(redis_client, "t", 1)
    async with AsyncProducer(redis_url) as producer:
        await producer.send_batch("t", [{"value": f"v{i}", "qid": 0} for i in range(1, 41)])
    broker = Broker(redis_client)
    wanted = [2, 5, 9, 30, 31, 39]  # 2..9 one range (gaps under GAP), 30..31 and 39 others
    found = await read_offsets(broker, "t", 0, wanted)
    assert {offset: m.value for offset, m in found.items()} == {o: f"v{o}".encode() for o in wanted}
    assert set(await read_offsets(broker, "t", 0, [40, 41, 50])) == {40}  # 41 and 50 were never written
