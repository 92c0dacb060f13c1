"""Helpers for action tests: produce into the test topic, wait until every message is finished."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis

from ddmq.client import keys
from ddmq.client.producer import AsyncProducer
from ddmq.proxy.service import ProxyService


async def produce(redis_url: str, messages: list[tuple[str, Any]], tag: str = "") -> None:
    """Send ``(key, body)`` pairs to topic ``t`` in order (dict bodies as JSON)."""
    producer = AsyncProducer(redis_url)
    try:
        for key, body in messages:
            value = body if isinstance(body, str) else json.dumps(body)
            await producer.send("t", value, key=key, tag=tag)
    finally:
        await producer.close()


async def wait_all_finished(service: ProxyService, timeout_s: float = 60) -> None:
    """Until the committed offset of every queue of ``g``/``t`` reaches its produce offset."""
    async with asyncio.timeout(timeout_s):
        while True:
            [row] = await service.consume_stats("g", "t")
            if row.produce_offsets and all(
                row.consume_offsets.get(qid) == offset for qid, offset in row.produce_offsets.items()
            ):
                return
            await asyncio.sleep(0.05)


async def dead_letters(redis_client: aioredis.Redis) -> list[dict[str, str]]:
    entries = await redis_client.xrange(keys.dead_letters("g", "t"))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]
