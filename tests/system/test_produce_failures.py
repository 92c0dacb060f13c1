"""Producers ride out Redis failures and write every message exactly once.

50,000 keyed messages are produced in batches while Redis fails under the producer: (a) a Redis
Cluster master is killed with SIGKILL and its replica promoted, (b) a redis-server with
``appendfsync always`` is killed with SIGKILL and started again, (c) Redis is stopped (SIGSTOP) for
longer than the producer's socket timeout and then resumed, so calls that ran lose their replies.
Each time the producer finishes without an error, and the streams themselves hold every message once,
each key's messages in the order they were produced. In (c) a proxy then delivers them all, in order.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import AsyncProducer, Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import sync_redis
from ddmq.proxy.store.embedded import EmbeddedRedis
from ddmq.proxy.store.embedded_cluster import EmbeddedCluster

from ..support import OrderChecker, ProxyProcess, body, check_and_ack

MESSAGES = 50_000
BATCH = 500
KEYS = 500
QUEUES = 8


class KeyedRun:
    """Produce MESSAGES keyed messages in a thread; ``fault`` runs (in the test's thread) once
    ``fault_after`` have been acknowledged, while the producer keeps sending."""

    def __init__(self, url: str, **producer_options: Any) -> None:
        self.url, self.options = url, producer_options
        self.produced: dict[str, int] = {}
        self.acknowledged = 0
        self.retries = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rng = random.Random(25)
        try:
            with Producer(self.url, **self.options) as producer:
                producer.ensure_topic("t", QUEUES)
                for _ in range(0, MESSAGES, BATCH):
                    batch = []
                    for _ in range(BATCH):
                        key = f"key-{rng.randrange(KEYS)}"
                        seq = self.produced.get(key, 0)
                        self.produced[key] = seq + 1
                        batch.append({"key": key, "value": body(key, seq)})
                    producer.send_batch("t", batch)
                    self.acknowledged += len(batch)
                    self.retries = producer.retries
        except BaseException as exc:  # reported by run()
            self.error = exc

    def run(self, fault_after: int, fault: Callable[[], None], timeout_s: float = 150) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while self.acknowledged < fault_after and self.thread.is_alive():
            assert time.monotonic() < deadline, "the producer did not get going"
            time.sleep(0.005)
        assert self.acknowledged < MESSAGES, "the fault should come mid-stream"
        fault()
        self.thread.join(max(1.0, deadline - time.monotonic()))
        assert not self.thread.is_alive(), f"the producer did not finish ({self.acknowledged} acknowledged)"
        assert self.error is None, f"the producer failed: {self.error!r}"
        assert self.acknowledged == MESSAGES


def check_streams(url: str, produced: dict[str, int], messages: int = MESSAGES) -> None:
    """Every produced message is in its key's queue exactly once, in the order it was produced, under
    dense offsets from 1."""
    seen: dict[str, list[int]] = {}
    total = 0
    client = sync_redis(url)
    try:
        for qid in range(QUEUES):
            stream = keys.stream("t", qid)
            offsets = []
            after = "-"
            while True:
                chunk = client.xrange(stream, after, "+", count=5000)
                if not chunk:
                    break
                for entry_id, fields in chunk:
                    offsets.append(keys.offset_of(entry_id))
                    event = json.loads(fields[b"v"])
                    seen.setdefault(event["k"], []).append(event["seq"])
                after = "(" + chunk[-1][0].decode()
            assert offsets == list(range(1, len(offsets) + 1)), f"queue {qid}: offsets not dense"
            total += len(offsets)
    finally:
        client.close()
    bad = {k: s for k, s in seen.items() if s != list(range(produced.get(k, 0)))}
    assert not bad, f"{len(bad)} key(s) with a duplicate, a loss or a reordering, e.g. {next(iter(bad.items()))}"
    assert seen.keys() == produced.keys()
    assert total == sum(produced.values()) == messages


@pytest.mark.timeout(240)
def test_a_cluster_master_killed_mid_stream(redis_cluster: EmbeddedCluster, cluster_url: str) -> None:
    run = KeyedRun(cluster_url, request_timeout_ms=1000)
    victim = redis_cluster.master_of(keys.stream("t", 0))

    def kill_master() -> None:
        victim.kill()

    run.run(MESSAGES // 3, kill_master)
    assert redis_cluster.master_of(keys.stream("t", 0)).port != victim.port, "the replica was promoted"
    assert run.retries > 0
    check_streams(cluster_url, run.produced)
    print(f"\ncluster failover: {MESSAGES} produced with {run.retries} retries")


@pytest.mark.timeout(240)
def test_redis_killed_and_restarted_mid_stream(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()
    url = f"redis://127.0.0.1:{port}/0"
    run = KeyedRun(url, request_timeout_ms=1000)

    def crash_and_restart() -> None:
        nonlocal server
        server.kill()
        time.sleep(1.0)  # the producer keeps trying against nothing for a while
        server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()

    try:
        run.run(MESSAGES // 3, crash_and_restart)
        assert run.retries > 0
        check_streams(url, run.produced)
    finally:
        server.stop()
    print(f"\nredis kill -9 and restart: {MESSAGES} produced with {run.retries} retries")


async def drain(port: int, produced: dict[str, int], timeout_s: float = 120) -> OrderChecker:
    """Pull and ack through the proxy until every produced message was acked; checks per-key order."""
    checker = OrderChecker()
    pending: list[wire.ConsumeResult] = []
    deadline = time.monotonic() + timeout_s
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=10) as client:
        while checker.missing(produced):
            assert time.monotonic() < deadline, f"not drained: {list(checker.missing(produced).items())[:5]}"
            response = await client.pull(wire.PullRequest(
                groupId="g", topic="t", maxBatchSize=500, maxLingerTime=100, result=wire.link_results(pending)))
            pending = check_and_ack(response, checker)
        if pending:
            await client.submit(wire.link_results(pending))
    return checker


@pytest.mark.timeout(240)
async def test_redis_stopped_past_the_socket_timeout_loses_replies_not_messages(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port).start()
    url = f"redis://127.0.0.1:{port}/0"
    run = KeyedRun(url, request_timeout_ms=300)
    pid = server.pid
    assert pid is not None

    def pause() -> None:
        os.kill(pid, signal.SIGSTOP)  # requests already sent stay in the socket: they run on resume
        try:
            time.sleep(1.5)  # five socket timeouts: replies are lost, calls are sent again
        finally:
            os.kill(pid, signal.SIGCONT)

    proxy = ProxyProcess(tmp_path, url, {"g": {"t": {"order_key": "KEY", "timeout_ms": 5000}}},
                         {"t": {"queues": QUEUES}})
    try:
        await asyncio.to_thread(run.run, MESSAGES // 3, pause)
        assert run.retries > 0
        check_streams(url, run.produced)
        proxy.start()
        checker = await drain(proxy.port, run.produced)
        assert checker.violations == [], checker.violations[:5]
        assert checker.missing(run.produced) == {}
    finally:
        proxy.stop()
        server.stop()
    print(f"\nredis SIGSTOP past the socket timeout: {MESSAGES} produced with {run.retries} retries, "
          f"{checker.deliveries} deliveries through a proxy")


@pytest.mark.timeout(240)
def test_ddmq_produce_rides_out_a_redis_restart(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()
    url = f"redis://127.0.0.1:{port}/0"
    count = 20_000
    rng = random.Random(26)
    produced: dict[str, int] = {}
    lines = []
    for _ in range(count):
        key = f"key-{rng.randrange(KEYS)}"
        produced[key] = produced.get(key, 0) + 1
        lines.append(json.dumps({"key": key, "value": body(key, produced[key] - 1)}).encode() + b"\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddmq.client.cli", "produce", "--redis", url, "--topic", "t", "--create",
         "--queues", str(QUEUES), "--batch", "200"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )

    def feed() -> None:  # paced, so the restart comes while lines are still arriving
        assert proc.stdin is not None
        for start in range(0, count, 500):
            proc.stdin.write(b"".join(lines[start:start + 500]))
            proc.stdin.flush()
            time.sleep(0.02)
        proc.stdin.close()

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        with sync_redis(url) as client:
            deadline = time.monotonic() + 60
            while sum(int(client.get(keys.sequence("t", q)) or 0) for q in range(QUEUES)) < count // 4:
                assert time.monotonic() < deadline, "ddmq produce did not get going"
                time.sleep(0.01)
        server.kill()
        time.sleep(1.0)
        server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()
        feeder.join(60)
        assert proc.stderr is not None
        with proc.stderr:
            stderr = proc.stderr.read()
        proc.wait(timeout=120)
        summary = stderr.decode().splitlines()[-1]
        assert proc.returncode == 0, stderr.decode()
        assert summary.startswith(f"sent {count} message(s) to 't' over {QUEUES} queue(s) in "), summary
        retries = int(summary.split(", ")[-2].split()[0])
        assert retries > 0, summary
        check_streams(url, produced, count)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.stop()


@pytest.mark.timeout(240)
async def test_the_async_producer_rides_out_a_stop_and_a_restart(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start()
    url = f"redis://127.0.0.1:{port}/0"
    count = 20_000
    rng = random.Random(27)
    produced: dict[str, int] = {}
    acknowledged = 0

    async def produce(producer: AsyncProducer) -> None:
        nonlocal acknowledged
        await producer.ensure_topic("t", QUEUES)
        for _ in range(0, count, BATCH):
            batch = []
            for _ in range(BATCH):
                key = f"key-{rng.randrange(KEYS)}"
                produced[key] = produced.get(key, 0) + 1
                batch.append({"key": key, "value": body(key, produced[key] - 1)})
            await producer.send_batch("t", batch)
            acknowledged += len(batch)

    async def until(target: int) -> None:
        while acknowledged < target:  # noqa: ASYNC110
            await asyncio.sleep(0.005)

    try:
        async with AsyncProducer(url, request_timeout_ms=300) as producer:
            task = asyncio.create_task(produce(producer))
            await until(count // 4)
            pid = server.pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(1.0)
            os.kill(pid, signal.SIGCONT)
            await until(count // 2)
            await asyncio.to_thread(server.kill)
            await asyncio.sleep(0.5)
            server = await asyncio.to_thread(EmbeddedRedis(tmp_path / "redis", port=port, appendfsync="always").start)
            await asyncio.wait_for(task, 120)
            assert producer.retries > 0
        check_streams(url, produced, count)
    finally:
        server.stop()
