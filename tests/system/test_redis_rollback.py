"""A Redis that loses its last writes (``appendfsync everysec`` and an OS crash) under a running proxy.

A private redis-server with an append-only file and a real ``ddmq-proxy`` process. Messages are
produced and consumed; the AOF's size is recorded; more are produced and consumed (the proxy reads and
commits past that point); redis-server is killed with SIGKILL and its AOF cut back to the recorded
size, as if the OS had lost the file's tail; redis-server starts again on the same port. Producers
then write new messages under offsets the proxy had already read.

The proxy must detect the rollback (ERROR log, metric, ``ddmq status`` and the admin API) and skip
nothing written after it: every message Redis holds after the recovery, and every message produced
after it, is delivered, each key in order, and committed = produced at the end.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import redis

from ddmq.client.cli.status import group_status
from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys
from ddmq.proxy.store.embedded import EmbeddedRedis

from ..support import OrderChecker, ProxyProcess, produce_keyed
from .test_stray_acks import metric

QUEUES = 4
GROUP_CONFIG = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 5000}

produce = functools.partial(produce_keyed, keys=100)


def aof_tail(data_dir: Path) -> Path:
    """The file Redis appends to: ``appendonly.aof`` (Redis 6), or the last incremental file named in
    ``appendonlydir``'s manifest (Redis 7 and later)."""
    folder = data_dir / "appendonlydir"
    if not folder.is_dir():
        return data_dir / "appendonly.aof"
    manifest = next(folder.glob("*.manifest")).read_text().splitlines()
    increments = [line.split()[1] for line in manifest if line.split()[-2:] == ["type", "i"]]
    return folder / increments[-1]


@dataclass
class Consumer:
    """Pulls and acks everything, keeping each delivery's body."""

    port: int
    delivered: set[tuple[str, int]] = field(default_factory=set)
    log: list[tuple[str, int]] = field(default_factory=list)
    errors: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        pending: list[wire.ConsumeResult] = []
        while not stop.is_set():
            try:
                async with AsyncProxyClient("127.0.0.1", self.port, timeout_s=5) as client:
                    while not stop.is_set():
                        response = await client.pull(wire.PullRequest(
                            groupId="g", topic="t", maxBatchSize=64, maxLingerTime=100,
                            result=wire.link_results(pending)))
                        pending = []
                        for message in response.messages:
                            event = json.loads(message.value)
                            self.delivered.add((event["k"], event["seq"]))
                            self.log.append((event["k"], event["seq"]))
                        if response.messages:
                            pending.append(wire.ConsumeResult(
                                context=response.context, successOffsets=[m.offset for m in response.messages],
                                failOffsets=[]))
                    if pending:
                        await client.submit(wire.link_results(pending))
            except (TimeoutError, ProxyClientError, OSError):  # Redis away: 1006 answers; retry
                self.errors += 1
                pending = []
                await asyncio.sleep(0.1)


async def until(predicate: object, timeout_s: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert loop.time() < deadline, what
        await asyncio.sleep(0.05)


def committed_and_produced(url: str) -> list[tuple[int | None, int]]:
    with redis.Redis.from_url(url) as client:
        return [(q.committed, q.produced) for q in group_status(client, "g", ["t"]).queues]


def caught_up(url: str) -> bool:
    return all(c == p for c, p in committed_and_produced(url))


def rollbacks(url: str) -> list[int]:
    with redis.Redis.from_url(url) as client:
        return [q.rollbacks for q in group_status(client, "g", ["t"]).queues]


def first_offsets(url: str, prefix: str) -> list[int | None]:
    """Per queue, the offset of the first entry whose key starts with ``prefix``."""
    firsts: list[int | None] = []
    with redis.Redis.from_url(url) as client:
        for qid in range(QUEUES):
            offsets = [keys.offset_of(entry_id) for entry_id, fields in client.xrange(keys.stream("t", qid))
                       if json.loads(fields[b"v"])["k"].startswith(prefix)]
            firsts.append(min(offsets, default=None))
    return firsts


def stored_bodies(url: str) -> list[tuple[str, int]]:
    with redis.Redis.from_url(url) as client:
        return [
            (event["k"], event["seq"])
            for qid in range(QUEUES)
            for _, fields in client.xrange(keys.stream("t", qid))
            for event in [json.loads(fields[b"v"])]
        ]


async def test_a_redis_rollback_is_detected_and_nothing_written_after_it_is_skipped(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "redis"
    server = EmbeddedRedis(data, port=port).start()
    url = f"redis://127.0.0.1:{port}"
    http_port = free_port()
    proxy = ProxyProcess(
        tmp_path, url, {"g": {"t": GROUP_CONFIG}}, {"t": {"queues": QUEUES}}, instance_id="proxy-a",
        leases={"ttl_ms": 5000, "renew_ms": 1000, "claim_interval_ms": 200},
        http={"enabled": True, "host": "127.0.0.1", "port": http_port},
    )
    rng = random.Random(7)
    produced: dict[str, int] = {}
    consumer = Consumer(proxy.port)
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None
    try:
        proxy.start()
        task = asyncio.create_task(consumer.run(stop))
        await asyncio.to_thread(produce, url, 2000, produced, rng, key_prefix="a-")
        await until(lambda: caught_up(url), 30, "phase a not consumed")
        await asyncio.sleep(1.5)  # everything so far is in the AOF (fsync every second)
        aof = aof_tail(data)
        kept = aof.stat().st_size

        await asyncio.to_thread(produce, url, 2000, produced, rng, key_prefix="b-")
        await until(lambda: caught_up(url), 30, "phase b not consumed")
        read_before = committed_and_produced(url)

        # The crash: SIGKILL, and the AOF loses everything written since it was `kept` bytes long.
        server.kill()
        with aof.open("r+b") as handle:
            handle.truncate(kept)
        server = EmbeddedRedis(data, port=port).start()
        restored = committed_and_produced(url)
        assert all(p < before_p for (_, p), (_, before_p) in zip(restored, read_before, strict=True)), (
            f"the cut should lose produced messages: {restored} vs {read_before}")

        # New messages at once, under offsets the proxy had read before the crash.
        c_produced: dict[str, int] = {}
        await asyncio.to_thread(produce, url, 3000, c_produced, rng, key_prefix="c-")
        await until(lambda: all(rollbacks(url)), 30, f"the rollback was not detected on every queue: {rollbacks(url)}")
        await asyncio.to_thread(produce, url, 500, c_produced, rng, key_prefix="d-")
        # Messages produced after the detection never reuse an offset the proxy read before the crash
        # (so a late ack from then cannot finish them).
        for qid, first_d in enumerate(first_offsets(url, "d-")):
            assert first_d is None or first_d >= read_before[qid][1], (qid, first_d, read_before)

        expected = set(stored_bodies(url))  # what Redis holds after the recovery, and all produced since
        assert {(k, s) for k, n in c_produced.items() for s in range(n)} <= expected
        await until(lambda: expected <= consumer.delivered, 60,
                    f"never delivered: {sorted(expected - consumer.delivered)[:5]}")
        await until(lambda: caught_up(url), 30, f"committed != produced: {committed_and_produced(url)}")

        # Each key written after the recovery was delivered in order (and each message at least once).
        checker = OrderChecker()
        for key, seq in consumer.log:
            if key[0] in "cd":
                checker.delivered(key, seq)
                checker.acked(key, seq)
        assert checker.violations == [], checker.violations[:5]
        assert not checker.missing(c_produced)

        # Detected, and shown: ERROR log, metric, ddmq status, admin API.
        assert any("ERROR" in line and "Redis rolled back" in line for line in proxy.log().splitlines())
        with redis.Redis.from_url(url) as client:
            rows = group_status(client, "g", ["t"]).queues
        assert sum(row.rollbacks for row in rows) >= 1 and any(row.last_rollback_ms for row in rows)
        async with aiohttp.ClientSession() as session:
            base = f"http://127.0.0.1:{http_port}"
            assert await metric(session, base, "ddmq_queue_rollbacks_total", "g") >= 1
            async with session.get(f"{base}/admin/groups/g") as response:
                queues = (await response.json())["queues"]
            assert sum(q["rollbacks"] for q in queues) >= 1
        print(f"\nrollback: {len(expected)} messages in Redis after recovery, {len(consumer.log)} deliveries, "
              f"{sum(r.rollbacks for r in rows)} rollbacks detected, {consumer.errors} client errors")
    finally:
        stop.set()
        if task is not None:
            await asyncio.wait_for(task, 15)
        assert proxy.stop() == 0, proxy.log()
        server.stop()
