"""Helpers for action tests: produce into the test topic, wait until every message is finished, and a
real HTTP upstream (aiohttp server) whose answers a test decides."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys
from ddmq.proxy.service import ProxyService
from tests.support import OrderChecker


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
            [row] = await service.api.consume_stats("g", "t")
            if row.produce_offsets and all(
                row.consume_offsets.get(qid) == offset for qid, offset in row.produce_offsets.items()
            ):
                return
            await asyncio.sleep(0.05)


async def dead_letters(redis_client: aioredis.Redis) -> list[dict[str, str]]:
    entries = await redis_client.xrange(keys.dead_letters("g", "t"))
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


Behaviour = Callable[["Upstream", str, int, int], Awaitable[web.Response]]


@dataclass
class Upstream:
    """A real HTTP service on a free port; ``behaviour`` decides each answer."""

    behaviour: Behaviour
    max_retry: int
    checker: OrderChecker = field(default_factory=OrderChecker)
    attempts: Counter[tuple[str, int]] = field(default_factory=Counter)
    paths: Counter[str] = field(default_factory=Counter)
    requests: list[web.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    #: Request path -> epoch for the order checker (which proxy pushed, when queues move).
    epochs: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            raw = await request.read()
            self.requests.append(request)
            self.bodies.append(raw)
            self.paths[request.path] += 1
            try:
                body = json.loads(raw)
            except ValueError:  # a form body
                body = {name: values[0] for name, values in parse_qs(raw.decode()).items()}
            key, seq = body.get("k", ""), int(body.get("seq", 0))
            attempt = int(request.headers["X-Ddmq-Attempt"])
            self.attempts[key, seq] += 1
            epoch = self.epochs.get(request.path, 0)
            self.checker.delivered(key, seq, epoch)
            response = await self.behaviour(self, key, seq, attempt)
            if 200 <= response.status < 300 or attempt > self.max_retry:
                self.checker.acked(key, seq, epoch)  # answered 2xx, or the proxy dead-letters it now
            return response
        finally:
            self.in_flight -= 1


@pytest.fixture
async def upstream_factory() -> AsyncIterator[Callable[[Behaviour, int], Awaitable[Upstream]]]:
    runners: list[web.AppRunner] = []

    async def start(behaviour: Behaviour, max_retry: int) -> Upstream:
        upstream = Upstream(behaviour, max_retry)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", upstream.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        upstream.url = f"http://127.0.0.1:{port}"
        return upstream

    yield start
    for runner in runners:
        await runner.cleanup()


def proxy_tasks() -> int:
    """Tasks in this loop other than the test server's (aiohttp runs one per connection and request)."""
    # A mypyc-compiled coroutine (DDMQ_COMPILE=1 builds) has no __qualname__; it is never aiohttp's.
    names = (getattr(task.get_coro(), "__qualname__", "") for task in asyncio.all_tasks())
    return sum(1 for name in names if not name.startswith("RequestHandler."))


async def readers_started(service: ProxyService) -> None:
    consumer = service.groups["g"].consumers["t"]
    async with asyncio.timeout(30):
        while len(consumer.owned.readers()) < 4:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def push_config(urls: list[str], **http: Any) -> dict[str, Any]:
    return {
        "actions": ["Json", "Order", "AsyncHttp"],
        "order_key": "$.k",
        "max_retry": 2,
        "retry_intervals_ms": [30, 60],
        "async_http": {"urls": urls, **http},
    }


def keyed(keys_: list[str], seqs: int) -> list[tuple[str, dict[str, Any]]]:
    """Messages interleaved across keys, each key's ``seq`` 0..seqs-1 in order."""
    return [(key, {"k": key, "seq": seq}) for seq in range(seqs) for key in keys_]
