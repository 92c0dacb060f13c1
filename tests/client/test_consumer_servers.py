"""Every server a pull consumer is given is read, and a proxy's death does not stop the others.

Proxies of one group share its queues: each hands out only the queues it owns, so a consumer that
leaves a server without a puller never sees that server's share. Real proxy processes sharing one
group (short queue leases, so a killed proxy's queues move within a second or two), the real
``ddmq consume`` command in a subprocess, real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ddmq.client.consumer import AsyncPullConsumer, ConsumedMessage, PullConsumer
from ddmq.client.thrift_client import ProxyClient, ProxyClientError
from ddmq.protocol.wire import ConsumeStatsRequest

from ..support import ProxyFleet, ProxyProcess, order_violations, produce_keyed

GROUP, TOPIC, QUEUES = "g", "t", 8
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100, "handoff_drain_ms": 500}
GROUP_CONFIG = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 3000}


def owners(proxy: ProxyProcess) -> dict[str, str]:
    """qid -> instance id of the proxy holding the queue's lease, as ``proxy`` reports it."""
    try:
        with ProxyClient("127.0.0.1", proxy.port, timeout_s=5) as client:
            stats = client.get_consume_stats(ConsumeStatsRequest(group=GROUP, topic=TOPIC))
    except ProxyClientError:
        return {}
    return {qid: owner for row in stats for qid, owner in (row.owners or {}).items() if owner}


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str) -> Iterator[ProxyFleet]:
    proxies = ProxyFleet(tmp_path, redis_url, {GROUP: {TOPIC: GROUP_CONFIG}}, {TOPIC: {"queues": QUEUES}}, LEASES)
    try:
        yield proxies
    finally:
        for proxy in proxies.proxies.values():
            if proxy.proc is not None and proxy.proc.poll() is None:
                proxy.kill()


def start_sharing(fleet: ProxyFleet, names: list[str]) -> list[ProxyProcess]:
    """Start proxies on one group and wait until every one of them owns some of its queues."""
    proxies = [fleet.start(name) for name in names]
    wait_until(lambda: set(owners(proxies[0]).values()) == set(names) and len(owners(proxies[0])) == QUEUES,
               30, f"the queues spread over {names}")
    return proxies


def servers(proxies: list[ProxyProcess]) -> str:
    return ",".join(f"127.0.0.1:{proxy.port}" for proxy in proxies)


class Seen:
    """What a consumer's processor saw, per key in arrival order (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seqs: dict[str, list[int]] = defaultdict(list)
        self.qids: set[str] = set()

    def add(self, key: str, seq: int, qid: str) -> None:
        with self.lock:
            self.seqs[key].append(seq)
            self.qids.add(qid)

    def add_message(self, message: ConsumedMessage) -> bool:
        event = json.loads(message.value)
        self.add(event["k"], event["seq"], message.qid)
        return True

    def complete(self, produced: dict[str, int]) -> bool:
        with self.lock:
            return all(set(self.seqs.get(key, ())) >= set(range(count)) for key, count in produced.items())


@pytest.mark.timeout(120)
def test_pull_consumer_with_one_thread_reads_every_one_of_three_servers(fleet: ProxyFleet, redis_url: str) -> None:
    proxies = start_sharing(fleet, ["proxy-a", "proxy-b", "proxy-c"])
    produced: dict[str, int] = {}
    produce_keyed(redis_url, 900, produced, random.Random(3), keys=90, topic=TOPIC)
    seen = Seen()
    consumer = PullConsumer(servers(proxies), GROUP, seen.add_message, threads=1, linger_ms=200)
    with consumer:
        deadline = time.monotonic() + 60
        while not seen.complete(produced) and time.monotonic() < deadline:
            time.sleep(0.05)
        consumer.stop()
    # Each proxy hands out only its own queues: every queue arriving means every server was read.
    assert seen.qids == {str(qid) for qid in range(QUEUES)}
    assert order_violations(seen.seqs, produced) == []
    assert consumer.error is None


@pytest.mark.timeout(120)
async def test_async_pull_consumer_with_one_task_reads_every_one_of_three_servers(
    fleet: ProxyFleet, redis_url: str
) -> None:
    proxies = await asyncio.to_thread(start_sharing, fleet, ["proxy-a", "proxy-b", "proxy-c"])
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce_keyed, redis_url, 900, produced, random.Random(4), keys=90, topic=TOPIC)
    seen = Seen()
    done = asyncio.Event()

    async def process(message: ConsumedMessage) -> bool:
        seen.add_message(message)
        if seen.complete(produced):
            done.set()
        return True

    consumer = AsyncPullConsumer(servers(proxies), GROUP, process, concurrency=1, linger_ms=200)
    async with consumer:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 60)
        consumer.stop()
    assert seen.qids == {str(qid) for qid in range(QUEUES)}
    assert order_violations(seen.seqs, produced) == []


@pytest.mark.timeout(180)
def test_ddmq_consume_over_two_proxies_gets_everything_in_order_when_one_is_killed(
    fleet: ProxyFleet, redis_url: str
) -> None:
    """``ddmq consume --servers P1,P2`` with default options (one thread): P1 is killed with -9
    mid-stream; P2 takes P1's queues after the lease TTL and the command prints every message, each
    key in order (a key may replay from the dead proxy's committed offset)."""
    p1, p2 = start_sharing(fleet, ["proxy-a", "proxy-b"])
    produced: dict[str, int] = {}
    rng = random.Random(7)
    produce_keyed(redis_url, 4000, produced, rng, keys=200, topic=TOPIC)
    seen = Seen()
    # The installed console script, beside this interpreter (the venv's).
    command = [str(Path(sys.executable).with_name("ddmq")), "consume", "--servers", servers([p1, p2]), "--group", GROUP]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as consume:
        assert consume.stdout is not None and consume.stderr is not None
        stdout = consume.stdout

        def read_lines() -> None:
            for line in stdout:
                event = json.loads(json.loads(line)["value"])
                seen.add(event["k"], event["seq"], "")

        reader = threading.Thread(target=read_lines, daemon=True)
        reader.start()
        try:
            wait_until(lambda: sum(map(len, seen.seqs.values())) >= 1000, 60, "a quarter of the messages")
            p1.kill()
            # Messages produced after the kill come through the survivor as well.
            produce_keyed(redis_url, 2000, produced, rng, keys=200, topic=TOPIC)
            wait_until(lambda: seen.complete(produced), 90, "every message, through the surviving proxy")
        finally:
            consume.send_signal(signal.SIGINT)
            try:
                consume.wait(timeout=20)
            except subprocess.TimeoutExpired:
                consume.kill()
            reader.join(5)
        stderr = consume.stderr.read()
    assert order_violations(seen.seqs, produced) == [], stderr[-3000:]
    # The survivor took over every queue of the dead proxy.
    assert set(owners(p2).values()) == {"proxy-b"} and len(owners(p2)) == QUEUES
