"""Entries written around the producer's script never block a queue.

A plain ``XADD`` with an automatic id, one with the next id but none of the producer's fields, and one
that leaves a gap go into three queues of a topic a real proxy is consuming, and at the end one more
automatic id that no produce follows. Producers go on appending to every queue, the proxy
dead-letters each foreign entry (its fields kept) with an error
in its log, and a full consume gets every produced message, each key in order, with committed =
produced in ``ddmq status`` (and never above it meanwhile).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from pathlib import Path

import aiohttp
import redis

from ddmq.client.cli.status import group_status
from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys

from ..support import OrderChecker, ProxyProcess, check_and_ack, produce_keyed
from .test_http_end_to_end import wait_ready
from .test_stray_acks import metric

QUEUES = 4
GROUP_CONFIG = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 5000}

produce = functools.partial(produce_keyed, keys=150)


def inject_foreign_entries(url: str) -> list[bytes]:
    """One foreign entry of each shape, in queues 0, 1 and 2; returns their ids as written."""
    with redis.Redis.from_url(url) as client:
        last = [int(client.get(keys.sequence("t", q)) or 0) for q in range(3)]
        return [
            client.xadd(keys.stream("t", 0), {"source": "auto id"}),
            client.xadd(keys.stream("t", 1), {"source": "next id"}, id=f"0-{last[1] + 1}"),
            client.xadd(keys.stream("t", 2), {"v": "gap", "source": "gap"}, id=f"0-{last[2] + 5}"),
        ]


def check_offsets(url: str) -> list[tuple[int | None, int]]:
    with redis.Redis.from_url(url) as client:
        status = group_status(client, "g", ["t"])
    pairs = [(q.committed, q.produced) for q in status.queues]
    assert all(c is None or c <= p for c, p in pairs), f"committed above produced: {pairs}"
    return pairs


async def test_foreign_entries_are_dead_lettered_and_producers_go_on(redis_url: str, tmp_path: Path) -> None:
    http_port = free_port()
    proxy = ProxyProcess(tmp_path, redis_url, {"g": {"t": GROUP_CONFIG}}, {"t": {"queues": QUEUES}},
                         http={"enabled": True, "host": "127.0.0.1", "port": http_port}).start()
    base = f"http://127.0.0.1:{http_port}"
    rng = random.Random(31)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    try:
        await wait_ready(base)
        await asyncio.to_thread(produce, redis_url, 1000, produced, rng)
        foreign = inject_foreign_entries(redis_url)
        assert not foreign[0].startswith(b"0-")
        # Every later produce succeeds, into every queue (keys spread over all four).
        await asyncio.to_thread(produce, redis_url, 1000, produced, rng)
        pending: list[wire.ConsumeResult] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            while checker.missing(produced):
                assert loop.time() < deadline, f"not drained: {list(checker.missing(produced).items())[:5]}"
                response = await client.pull(wire.PullRequest(
                    groupId="g", topic="t", maxBatchSize=64, maxLingerTime=200, result=wire.link_results(pending)))
                pending = check_and_ack(response, checker)  # a foreign entry in a batch would not parse
                check_offsets(redis_url)
            await client.submit(wire.link_results(pending))
        assert checker.violations == [], checker.violations[:5]
        assert checker.deliveries == sum(produced.values())
        # An automatic id with no produce after it: the proxy renumbers it itself.
        with redis.Redis.from_url(redis_url) as r:
            r.xadd(keys.stream("t", 3), {"source": "auto id, last"})
            while r.xlen(keys.dead_letters("g", "t")) < 4:
                assert loop.time() < deadline, "the last foreign entry was not dead-lettered"
                await asyncio.sleep(0.05)
        while (pairs := check_offsets(redis_url)) and any(c != p for c, p in pairs):
            assert loop.time() < deadline, f"committed never reached produced: {pairs}"
            await asyncio.sleep(0.1)
        with redis.Redis.from_url(redis_url) as r:
            dead = r.xrange(keys.dead_letters("g", "t"))
        sources = sorted(json.loads(fields[b"v"]).get("source", "") if fields[b"v"] != b"gap" else "gap"
                         for _, fields in dead)
        assert sources == ["auto id", "auto id, last", "gap", "next id"], dead
        assert all(b"not written by the ddmq producer" in fields[b"error"] for _, fields in dead)
        async with aiohttp.ClientSession() as session:
            assert await metric(session, base, "ddmq_consumer_events_total", "g", event="foreign_entries") == 4
            assert await metric(session, base, "ddmq_consumer_events_total", "g", event="foreign_renumbered") >= 1
        alerts = [line for line in proxy.log().splitlines() if "not written by the ddmq producer" in line]
        assert len(alerts) >= 4 and all("ERROR" in line for line in alerts), alerts
    finally:
        assert proxy.stop() == 0, proxy.log()
