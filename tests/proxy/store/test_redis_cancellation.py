"""The proxy stops tasks that are in the middle of Redis commands (shutdown, lost leases, rebalance).

redis-py 8.0 and 8.1 lose about a third of such cancellations on Python 3.11: the task keeps running.
So does redis-py 7 with a socket timeout, which writes under ``asyncio.wait_for`` (Python 3.11's loses
a cancel that arrives as the write completes); the project's clients, which always have one
(``protocol/redis/connection.py``), write under ``asyncio.timeout``. This pins the behaviour we rely on, so
an upgrade that brings it back fails here, not in production.
"""

from __future__ import annotations

import asyncio
import random

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.redis.connection import AsyncRedis, async_redis


@pytest.mark.both_loops
async def test_a_cancel_during_a_command_always_stops_the_task(redis_client: aioredis.Redis) -> None:
    await _cancel_during_commands(redis_client)


@pytest.mark.both_loops
async def test_a_cancel_during_a_command_of_a_client_with_deadlines_stops_the_task(redis_url: str) -> None:
    client = async_redis(redis_url)  # socket timeouts, keepalive, health checks: as the proxy's
    try:
        await _cancel_during_commands(client)
    finally:
        await client.aclose()


async def _cancel_during_commands(redis_client: AsyncRedis) -> None:
    rng = random.Random(3)

    async def busy() -> None:
        while True:
            await redis_client.get("x")
            await redis_client.set("y", 1)

    lost = 0
    for _ in range(100):
        task = asyncio.create_task(busy())
        await asyncio.sleep(rng.random() * 0.003)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1)
        if not done:
            lost += 1
            task.cancel()
            await asyncio.wait({task}, timeout=1)
        elif not task.cancelled():
            task.exception()  # retrieve it; a failed command is not what this test is about
    assert lost == 0, f"{lost} of 100 cancellations were lost inside redis-py"
