"""Redis restarts under a running proxy: it reconnects and carries on with nothing lost.

A private redis-server with an append-only file (the EmbeddedRedis the proxy itself uses), a real
``ddmq-proxy`` process and Thrift clients pulling and acking. Mid-stream, while clients hold
unacked messages and offsets wait to be committed, Redis is shut down and started again on the same
port from its AOF. Readers, lease renewals and commits fail while it is away and retry; afterwards
every produced message is acked, in per-key order, and the committed offsets reach the end.
"""

from __future__ import annotations

import asyncio
import functools
import random
import time
from pathlib import Path

import redis

from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys
from ddmq.proxy.store.embedded import EmbeddedRedis

from ..support import OrderChecker, ProxyProcess, check_and_ack, produce_keyed

QUEUES = 4
KEYS = 300


produce = functools.partial(produce_keyed, keys=KEYS, queues=QUEUES)


async def puller(port: int, checker: OrderChecker, stop: asyncio.Event, errors: list[str]) -> None:
    pending: list[wire.ConsumeResult] = []
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
        while not stop.is_set():
            try:
                response = await client.pull(wire.PullRequest(
                    groupId="g", topic="t", maxBatchSize=32, maxLingerTime=100, result=wire.link_results(pending)))
            except ProxyClientError as exc:  # e.g. 1006 while Redis is away: retry
                errors.append(str(exc))
                pending.clear()
                await asyncio.sleep(0.1)
                continue
            pending = check_and_ack(response, checker)
            await asyncio.sleep(0.002)  # a client with some work per batch, so the run spans the restart
        if pending:
            await client.submit(wire.link_results(pending))


async def test_proxy_survives_a_redis_restart_mid_stream(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port).start()
    url = f"redis://127.0.0.1:{port}"
    rng = random.Random(3)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    stop = asyncio.Event()
    errors: list[str] = []
    proxy = ProxyProcess(
        tmp_path, url, {"g": {"t": {"order_key": "KEY", "timeout_ms": 5000}}}, {"t": {"queues": QUEUES}},
        instance_id="proxy-a", leases={"ttl_ms": 5000, "renew_ms": 1000, "claim_interval_ms": 200},
    )
    try:
        await asyncio.to_thread(produce, url, 10_000, produced, rng)
        proxy.start()
        tasks = [asyncio.create_task(puller(proxy.port, checker, stop, errors)) for _ in range(2)]
        while checker.deliveries < 3000:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
        delivered_before = checker.deliveries
        await asyncio.to_thread(server.stop)  # SHUTDOWN: the AOF is flushed
        await asyncio.sleep(1.0)  # the proxy runs without Redis for a while
        server = await asyncio.to_thread(EmbeddedRedis(tmp_path / "redis", port=port).start)
        assert delivered_before < 10_000, "the restart should come mid-stream"
        await asyncio.to_thread(produce, url, 5_000, produced, rng)
        deadline = time.monotonic() + 60
        while checker.missing(produced):
            assert time.monotonic() < deadline, f"not drained: {list(checker.missing(produced).items())[:5]}"
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        assert proxy.stop() == 0
        assert checker.violations == [], checker.violations[:5]
        with redis.Redis.from_url(url) as client:
            produce_next = [int(client.get(keys.sequence("t", q)) or 0) + 1 for q in range(QUEUES)]
            committed = [int(client.get(keys.committed("g", "t", q)) or 0) for q in range(QUEUES)]
        assert committed == produce_next
        assert "redis failed" in proxy.log(), "the proxy should have seen Redis go away"
        assert "Redis rolled back" not in proxy.log(), "a clean restart loses nothing: no rollback to report"
        print(f"\nredis restart: {checker.deliveries} deliveries for {sum(produced.values())} messages, "
              f"{checker.duplicates} redelivered, {len(errors)} client errors while Redis was away")
    finally:
        stop.set()
        proxy.stop()
        server.stop()
