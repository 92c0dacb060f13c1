"""Lag in time and the lag history, against real Redis and a real proxy."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import redis.asyncio

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys
from ddmq.proxy.ops.lag import LagHistory, produce_times, rates, topic_lag

from ...http_support import ApiClient, OpenApiChecker
from ..conftest import running_proxy
from ..servers.test_http_api import eventually, pull


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
        history = LagHistory(service.registry, interval_s=60, points=3)
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


async def test_lag_history_survives_a_restart_bounded_in_redis_with_rates(redis_url: str) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000}
    async with running_proxy(redis_url, config, queues=2) as service:
        async with redis.asyncio.Redis.from_url(redis_url) as client:
            await client.delete(keys.lag_history("g", "t"))  # the proxy's own sampler may have written one
        # A 10 ms interval: every sample below falls in an interval of its own.
        first = LagHistory(service.registry, interval_s=0.01, points=4)
        async with AsyncProducer(redis_url) as producer:
            for _ in range(6):
                await producer.send_batch("t", [{"key": f"k{i}", "value": "v", "qid": 1} for i in range(10)])
                await first.sample()
                await asyncio.sleep(0.02)
        (samples,) = first.series("g").values()
        assert [s.produced for s in samples] == [30, 40, 50, 60]
        async with redis.asyncio.Redis.from_url(redis_url) as client:
            assert await client.xlen(keys.lag_history("g", "t")) == 4  # capped like the memory
        found = rates(samples)
        assert found is not None and found[0] > 0

        # A proxy starting afresh (a new history) reads the stored samples back before its own.
        second = LagHistory(service.registry, interval_s=0.01, points=4)
        await asyncio.sleep(0.02)
        await second.sample()
        (restored,) = second.series("g").values()
        assert [s.produced for s in restored] == [40, 50, 60, 60]
        assert [s.at_ms for s in restored[:3]] == [s.at_ms - s.at_ms % 10 for s in samples[1:]]

        # The same interval sampled twice (two proxies of a group): Redis keeps one; no error.
        shared = LagHistory(service.registry, interval_s=3600, points=4)
        await shared.sample()
        await shared.sample()
        async with redis.asyncio.Redis.from_url(redis_url) as client:
            assert await client.xlen(keys.lag_history("g", "t")) == 4


async def test_local_samples_hold_this_proxys_keys_by_state_and_latency_and_survive_a_restart(
    redis_url: str,
) -> None:
    """Each sample also counts the group's dead letters, and this proxy's keys by state and the latency
    (produce to ack) of the messages acked since its previous sample; a new history reads back its own
    proxy's local samples, never another's."""
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 0}
    http = {"enabled": True, "port": 0}
    async with running_proxy(redis_url, config, queues=1, http=http) as service, aiohttp.ClientSession() as session:
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i}", "value": "v"} for i in range(6)])
        consumer = service.groups["g"].consumers["t"]

        async def read() -> bool:
            return consumer.parking.counts()["waiting"] == 6

        await eventually(read)
        history = LagHistory(service.registry, interval_s=0.01, points=10)
        await history.sample()
        # The last: the proxy's own sampler (same instance) may have stored one already, read back here.
        first = history.local_series("g")["t"][-1]
        assert (first.parked, first.failing, first.in_flight, first.waiting) == (0, 0, 0, 6)
        assert (first.acked_p50_ms, first.acked_p99_ms) == (-1, -1)  # nothing acked yet

        batch = await pull(api, max_batch=6)
        offsets = [m["offset"] for m in batch["messages"]]
        results = [{"topic": "t", "qid": 0, "success": offsets[:4], "fail": offsets[4:5]}]
        assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": results}))[0] == 200
        async with redis.asyncio.Redis.from_url(redis_url) as client:

            async def dead_lettered() -> bool:
                return int(await client.xlen(keys.dead_letters("g", "t"))) == 1

            await eventually(dead_lettered)
        await asyncio.sleep(0.02)
        await history.sample()
        second = history.local_series("g")["t"][-1]
        assert (second.parked, second.failing, second.in_flight, second.waiting) == (0, 0, 1, 0)
        assert 0 <= second.acked_p50_ms <= second.acked_p99_ms < 60_000  # four acked in this interval
        assert history.series("g")["t"][-1].dead == 1
        await asyncio.sleep(0.02)
        await history.sample()
        assert history.local_series("g")["t"][-1].acked_p50_ms == -1  # none acked since

        async with redis.asyncio.Redis.from_url(redis_url) as client:
            await client.xadd(keys.local_history("g", "t"), {"i": "another-proxy", "t": 1, "s": "9 9 9 9 9 9"})
        restarted = LagHistory(service.registry, interval_s=0.01, points=10)
        await asyncio.sleep(0.02)
        await restarted.sample()
        restored = restarted.local_series("g")["t"]
        # (the proxy's own sampler, same instance, may have stored some of its own as well)
        assert {s.at_ms for s in history.local_series("g")["t"]} <= {s.at_ms for s in restored}
        assert all(s.parked != 9 for s in restored)

