"""Lag in time and the lag history, against real Redis and a real proxy."""

from __future__ import annotations

import time

import aiohttp
import redis.asyncio

from ddmq.protocol import keys
from ddmq.protocol.producer import AsyncProducer
from ddmq.proxy.ops.lag import LagHistory, produce_times, topic_lag

from ..http_support import ApiClient, OpenApiChecker
from .conftest import running_proxy
from .test_http_api import eventually, pull


async def test_produce_times_read_the_entry_at_an_offset_or_the_next_one(redis_url: str) -> None:
    async with AsyncProducer(redis_url) as producer:
        await producer.ensure_topic("t", 3)
        before = int(time.time() * 1000)
        await producer.send_batch("t", [{"value": f"v{i}", "qid": 0} for i in range(3)])
        after = int(time.time() * 1000)
        await producer.send("t", "only", qid=1)
    async with redis.asyncio.Redis.from_url(redis_url) as client:
        await client.xdel(keys.stream("t", 0), "0-2")  # a gap: offset 2 reads the entry of offset 3
        times = await produce_times(client, "t", {0: 2, 1: 2, 2: 1})
        assert set(times) == {0} and before <= times[0] <= after  # queue 1 has no offset 2, queue 2 nothing
        assert await produce_times(client, "t", {}) == {}
        rows = await topic_lag(client, "g", "t", 3)
        assert [(r.committed, r.produced, r.lag) for r in rows] == [(1, 4, 3), (1, 2, 1), (1, 1, 0)]
        assert rows[0].oldest_ms is not None and rows[1].oldest_ms is not None and rows[2].oldest_ms is None


async def test_lag_history_keeps_a_bounded_series_per_group_and_topic(redis_url: str) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000}
    http = {"enabled": True, "port": 0}
    async with running_proxy(redis_url, config, queues=2, http=http) as service, aiohttp.ClientSession() as session:
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        history = LagHistory(service, interval_s=60, points=3)
        await history.sample()
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": "k", "value": f"v{i}", "qid": 1} for i in range(4)])
        held = await pull(api, topic="t", max_batch=10)
        assert len(held["messages"]) == 1  # one key: one at a time, the rest waits
        for _ in range(4):
            await history.sample()
        (samples,) = history.series("g").values()
        assert len(samples) == 3  # bounded: the oldest samples are dropped
        assert [s.messages for s in samples] == [4, 4, 4]
        produced_ms = held["messages"][0]["produce_ms"]
        assert all(abs(s.age_ms - (s.at_ms - produced_ms)) <= 1 for s in samples) and samples[-1].age_ms >= 0
        assert history.series("other") == {}

        # The endpoint answers what the proxy's own sampler took (one sample at start-up).
        async def sampled() -> bool:
            status, body = await api.call("GET", "/admin/groups/g/lag-history")
            assert status == 200 and body["interval_ms"] == 5000
            return bool(body["topics"].get("t"))

        await eventually(sampled)
        status, body = await api.call("GET", "/admin/groups/nope/lag-history")
        assert (status, body["code"]) == (404, 1001)
