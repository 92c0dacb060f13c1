"""End to end over HTTP: a real proxy process, real Redis, several real aiohttp pull clients.

Clients fail some messages and drop the acks of others (redelivered after ``timeout_ms``): every
message is delivered and acked, each key's deliveries follow its order, and the committed offsets
reach the produce offsets.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ddmq.protocol.net import free_port

from ..support import OrderChecker, ProxyProcess, produce_keyed

QUEUES = 8
KEYS = 500
MESSAGES = 8_000
GROUP = "cg_http"
TOPIC = "events"


produce = functools.partial(produce_keyed, keys=KEYS, topic=TOPIC)


class HttpClient:
    """Pulls over HTTP with its acks and fails riding on the next pull; fails or drops at random."""

    def __init__(self, base: str, checker: OrderChecker, rng: random.Random, fail_p: float, drop_p: float) -> None:
        self.base = base
        self.checker = checker
        self.rng = rng
        self.fail_p = fail_p
        self.drop_p = drop_p
        self.pending: list[dict[str, Any]] = []
        self.pulls = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while not stop.is_set():
                request = {"group": GROUP, "topic": TOPIC, "max_batch": 32, "linger_ms": 200, "results": self.pending}
                async with session.post(self.base + "/v1/pull", json=request) as response:
                    assert response.status == 200, await response.text()
                    answer = await response.json()
                self.pulls += 1
                self.pending = [self.handle(answer)] if answer["messages"] else []
            if self.pending:
                async with session.post(self.base + "/v1/ack", json={"group": GROUP, "results": self.pending}) as r:
                    assert r.status == 200, await r.text()

    def handle(self, answer: dict[str, Any]) -> dict[str, Any]:
        ok, failed = [], []
        for message in answer["messages"]:
            event = json.loads(message["value_text"])
            self.checker.delivered(event["k"], event["seq"])
            roll = self.rng.random()
            if roll < self.fail_p:
                failed.append(message["offset"])
            elif roll < self.fail_p + self.drop_p:
                pass  # neither ack nor fail: redelivered after timeout_ms
            else:
                self.checker.acked(event["k"], event["seq"])
                ok.append(message["offset"])
        return {"topic": answer["topic"], "qid": answer["qid"], "success": ok, "fail": failed}


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        return response.status, await response.json()


async def wait_ready(base: str, timeout_s: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            try:
                if (await _get(session, base + "/readyz"))[0] == 200:
                    return
            except aiohttp.ClientError:
                pass
            assert loop.time() < deadline, "the HTTP server did not become ready"
            await asyncio.sleep(0.05)


async def committed_reaches_produced(base: str, timeout_s: float = 15) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            status, group = await _get(session, f"{base}/admin/groups/{GROUP}")
            assert status == 200, group
            queues: list[dict[str, Any]] = group["queues"]
            if all(q["committed"] == q["produced"] for q in queues) or loop.time() > deadline:
                assert [(q["qid"], q["committed"]) for q in queues] == [(q["qid"], q["produced"]) for q in queues]
                return queues
            await asyncio.sleep(0.1)


@pytest.mark.timeout(180)
async def test_http_pull_keeps_key_order_and_loses_nothing(redis_url: str, tmp_path: Path) -> None:
    rng = random.Random(20261123)
    group = {
        TOPIC: {
            "actions": ["Json", "Order", "PullServer"],
            "order_key": "$.k",
            "timeout_ms": 1000,
            "max_retry": 50,
            "retry_intervals_ms": [50, 100, 200],
            "concurrency": 2000,
        }
    }
    http_port = free_port()
    proxy = ProxyProcess(
        tmp_path,
        redis_url,
        {GROUP: group},
        {TOPIC: {"queues": QUEUES}},
        http={"enabled": True, "host": "127.0.0.1", "port": http_port},
    ).start()
    base = f"http://127.0.0.1:{http_port}"
    checker = OrderChecker()
    produced: dict[str, int] = {}
    try:
        await wait_ready(base)
        await asyncio.to_thread(produce, redis_url, MESSAGES, produced, rng)
        stop = asyncio.Event()
        clients = [HttpClient(base, checker, random.Random(i), fail_p=0.03, drop_p=0.01) for i in range(5)]
        tasks = [asyncio.create_task(client.run(stop)) for client in clients]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while checker.missing(produced) and loop.time() < deadline and not any(t.done() for t in tasks):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        missing = checker.missing(produced)
        assert not missing, f"{len(missing)} keys not fully acked, e.g. {list(missing.items())[:5]}"
        assert checker.violations == [], checker.violations[:10]
        assert checker.deliveries > MESSAGES, "fails and dropped acks should have caused redeliveries"
        queues = await committed_reaches_produced(base)
        assert sum(q["committed"] for q in queues) == MESSAGES + QUEUES  # next offset per queue
        assert all(client.pulls > 0 for client in clients)
    finally:
        assert proxy.stop() == 0, proxy.log()
