"""The pull consumers and ``ddmq consume`` with ordered runs (``max_per_key``) against a real proxy
process: each key's messages are processed in order, a failure stops the rest of its run, which comes
again after the failed message; nothing is lost."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddmq.client.consumer import AsyncPullConsumer, ConsumedMessage, PullConsumer

from ..support import ProxyProcess, produce_keyed

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC = "g", "t"


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    group = {TOPIC: {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 2000,
                     "max_retry": 5, "retry_intervals_ms": [50]}}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 4}}).start()
    try:
        yield process
    finally:
        process.stop()


class Recorder:
    """Checks each key's processing: every call is for the key's next unacked message; the first call of
    every (key, seq) with seq % 7 == 3 fails."""

    def __init__(self, produced: dict[str, int]) -> None:
        self.produced = produced
        self.next: dict[str, int] = defaultdict(int)
        self.failed: set[tuple[str, int]] = set()
        self.violations: list[str] = []
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, message: ConsumedMessage) -> bool:
        event = json.loads(message.value)
        key, seq = event["k"], event["seq"]
        with self.lock:
            if seq > self.next[key]:
                self.violations.append(f"{key}: seq {seq} processed before {self.next[key]}")
            if seq % 7 == 3 and (key, seq) not in self.failed:
                self.failed.add((key, seq))
                return False
            self.next[key] = max(self.next[key], seq + 1)
            if all(self.next[k] == n for k, n in self.produced.items()):
                self.done.set()
            return True


def test_pull_consumer_with_runs_processes_each_key_in_order_and_resumes_after_a_failure(
    proxy: ProxyProcess, redis_url: str
) -> None:
    produced: dict[str, int] = {}
    produce_keyed(redis_url, 600, produced, random.Random(4), keys=6, topic=TOPIC)
    recorder = Recorder(produced)
    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, recorder, threads=3, linger_ms=200, max_per_key=16)
    with consumer:
        assert recorder.done.wait(60), "not every message was processed"
    assert recorder.violations == []
    assert consumer.stats.unreported > 0, "a failure inside a run leaves the rest of the run unreported"
    assert consumer.stats.failed == len(recorder.failed)


async def test_async_pull_consumer_with_runs_processes_each_key_in_order(proxy: ProxyProcess, redis_url: str) -> None:
    produced: dict[str, int] = {}
    produce_keyed(redis_url, 600, produced, random.Random(5), keys=6, topic=TOPIC)
    recorder = Recorder(produced)
    running: set[str] = set()
    overlapping: list[str] = []

    async def process(message: ConsumedMessage) -> bool:
        key = json.loads(message.value)["k"]
        if key in running:
            overlapping.append(key)
        running.add(key)
        await asyncio.sleep(0)  # let the other runs of the pull go on meanwhile
        running.discard(key)
        return recorder(message)

    consumer = AsyncPullConsumer(f"127.0.0.1:{proxy.port}", GROUP, process, concurrency=2, linger_ms=200,
                                 max_per_key=16)
    async with consumer:
        async with asyncio.timeout(60):
            while not recorder.done.is_set():  # noqa: ASYNC110 - the consumer's tasks set it
                await asyncio.sleep(0.05)
    assert recorder.violations == [] and overlapping == []


def test_consume_cli_with_runs_prints_each_key_in_order(proxy: ProxyProcess, redis_url: str) -> None:
    produced: dict[str, int] = {}
    produce_keyed(redis_url, 200, produced, random.Random(6), keys=4, topic=TOPIC)
    out = subprocess.run(
        [*DDMQ, "consume", "--servers", f"127.0.0.1:{proxy.port}", "--group", GROUP, "--count", "200",
         "--max-per-key", "32", "--linger-ms", "200"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    seen: dict[str, list[int]] = defaultdict(list)
    for line in out.stdout.splitlines():
        event = json.loads(json.loads(line)["value"])
        seen[event["k"]].append(event["seq"])
    assert {k: len(v) for k, v in seen.items()} == produced
    assert all(seqs == list(range(len(seqs))) for seqs in seen.values())


def test_consume_cli_refuses_a_max_per_key_below_one(proxy: ProxyProcess) -> None:
    out = subprocess.run(
        [*DDMQ, "consume", "--servers", f"127.0.0.1:{proxy.port}", "--group", GROUP, "--max-per-key", "0"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 2 and "max_per_key must be positive" in out.stderr
