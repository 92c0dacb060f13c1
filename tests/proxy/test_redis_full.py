"""A full Redis (a small ``maxmemory``, policy noeviction) is survived: producers are refused with a
typed, retriable error and ``ddmq produce`` exits 1 naming it; the proxy keeps its leases, consumes,
commits and trims, which frees memory; the same producer then produces again; and every message a
producer was told was written is delivered, in order per key."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from ddmq.protocol.produce.producer import AsyncProducer, RedisFullError
from ddmq.protocol.redis import keys
from ddmq.proxy.store.embedded import EmbeddedRedis
from tests.support import OrderChecker

from .conftest import running_proxy
from .retention_support import consume, wait_for

MAXMEMORY_MB = 4
PAD = "x" * 1000


async def used_and_max(client: aioredis.Redis) -> tuple[int, int]:
    info = await client.info("memory")
    return int(info["used_memory"]), int(info["maxmemory"])


async def fill(producer: AsyncProducer, produced: dict[str, int], limit: int) -> RedisFullError | None:
    """Send keyed messages one by one until Redis refuses one (or ``limit`` went); count the acknowledged."""
    for i in range(limit):
        key = f"k{i % 20}"
        seq = produced.get(key, 0)
        try:
            await producer.send("t", json.dumps({"k": key, "seq": seq, "pad": PAD}), key=key)
        except RedisFullError as exc:
            return exc
        produced[key] = seq + 1
    return None


async def test_a_full_redis_refuses_producers_and_consumption_makes_room(tmp_path: Path) -> None:
    server = await asyncio.to_thread(EmbeddedRedis(tmp_path / "redis", maxmemory_mb=MAXMEMORY_MB).start)
    client = aioredis.Redis.from_url(server.url)
    try:
        assert (await client.config_get("maxmemory"))["maxmemory"] == str(MAXMEMORY_MB * 1024 * 1024)
        assert (await client.config_get("maxmemory-policy"))["maxmemory-policy"] == "noeviction"
        topics = {"t": {"queues": 2, "retention": {"interval_ms": 50}}}
        leases = {"ttl_ms": 1000, "renew_ms": 200, "claim_interval_ms": 100}
        producer = AsyncProducer(server.url, delivery_timeout_ms=300)
        produced: dict[str, int] = {}
        async with running_proxy(server.url, queues=2, topics=topics, leases=leases) as service:
            consumer = service.groups["g"].consumers["t"]

            async def holding() -> bool:
                return len(consumer.held) == 2
            await wait_for(holding, what="both leases")
            terms = dict(consumer.held)
            refused = await fill(producer, produced, 20_000)
            assert refused is not None, "Redis never filled up"
            # The proxy's reads pass through client output buffers, which count as used memory until
            # they drain: fill again until Redis refuses the very first message, with nothing draining.
            for _ in range(50):
                before = sum(produced.values())
                refused = await fill(producer, produced, 20_000)
                assert refused is not None, "Redis never filled up"
                if sum(produced.values()) == before:
                    break
                await asyncio.sleep(0.1)
            assert "Redis is full" in str(refused) and refused.written == []
            used, maximum = await used_and_max(client)
            assert used > maximum * 0.95
            # What DdmqRedisMemoryHigh computes, from the proxy's /metrics (as of the trimmer's reading).
            assert service.retention is not None
            await service.retention.measure()
            samples = {s.name: s.value for f in text_string_to_metric_families(service.metrics.render().decode())
                       for s in f.samples}
            assert samples["ddmq_redis_maxmemory_bytes"] == MAXMEMORY_MB * 1024 * 1024
            assert samples["ddmq_redis_used_memory_bytes"] / samples["ddmq_redis_maxmemory_bytes"] > 0.8

            # ddmq produce names it and exits 1. Redis sits at its limit, so a few bytes freed meanwhile
            # (a client's buffers draining) can let the CLI's message in: then it counts as produced, and
            # Redis is filled again before the next try.
            for _ in range(5):
                seq = produced.get("cli", 0)
                body = json.dumps({"k": "cli", "seq": seq, "pad": PAD})
                line = json.dumps({"key": "cli", "value": body}) + "\n"
                cli = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "ddmq.client.cli", "produce", "--topic", "t",
                     "--delivery-timeout-ms", "300"],
                    input=line, capture_output=True, text=True, timeout=60,
                    env={**os.environ, "DDMQ_REDIS": server.url},
                )
                if cli.returncode != 0:
                    break
                produced["cli"] = seq + 1
                assert await fill(producer, produced, 20_000) is not None, "Redis never filled up"
            assert cli.returncode == 1 and "Redis is full" in cli.stderr, cli.stderr
            full_count = sum(produced.values())

            # Leases are renewed while Redis is full: three TTLs later the same terms are held.
            await asyncio.sleep(3 * leases["ttl_ms"] / 1000)
            assert dict(consumer.held) == terms
            for qid in range(2):
                assert await client.pttl(keys.lease("g", "t", qid)) > 0

            # Consumption and commits go on under OOM; the trims free memory.
            checker = OrderChecker()
            await consume(service, "g", checker, full_count)
            assert checker.deliveries == full_count and not checker.violations

            async def committed() -> bool:
                return all([int(await client.get(keys.committed("g", "t", qid)) or 0)
                            == int(await client.get(keys.sequence("t", qid)) or 0) + 1 for qid in range(2)])
            await wait_for(committed, what="commits written while Redis is full")

            async def room() -> bool:
                used, maximum = await used_and_max(client)
                return used < maximum * 0.8
            await wait_for(room, what="trims freeing memory")

            # The same producer produces again, by itself.
            assert await fill(producer, produced, 500) is None
            await consume(service, "g", checker, sum(produced.values()))
            assert not checker.violations and checker.missing(produced) == {}
        await producer.close()
    finally:
        await client.aclose()
        await asyncio.to_thread(server.stop)
