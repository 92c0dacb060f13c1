"""A replay lease's ack outlives the proxy that served it: after that proxy's kill -9, an ackLeases sent to
another proxy finishes what the lease handed out (from its record in Redis), so the survivor, taking the
dead proxy's queues, delivers none of it again and everything else in key order. Real proxies (separate
processes, so the kill is a real -9), real Redis, real Thrift sockets."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddmq.client.thrift_client import ProxyClient
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.wire import ConsumeStatsRequest, LeaseAck, PullRequest

from ...support import OrderChecker, ProxyProcess, body

GROUPS = {"g": {"t": {"order_key": "KEY", "max_pull_batch_size": 1000}}}
# A commit interval far beyond the test: only what an ack makes durable at once can save the dead
# proxy's progress, so the test shows the ack's effect rather than a lucky periodic commit.
COMMIT_INTERVAL_MS = 600_000
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100}
KEYS, PER_KEY = 30, 8


def produce(redis_url: str) -> dict[str, int]:
    items = [{"key": f"k{i}", "value": body(f"k{i}", seq)} for seq in range(PER_KEY) for i in range(KEYS)]
    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 4)
        producer.send_batch("t", items)
    return {f"k{i}": PER_KEY for i in range(KEYS)}


def owners(port: int) -> dict[str, str]:
    with ProxyClient("127.0.0.1", port) as client:
        stats = client.get_consume_stats(ConsumeStatsRequest(group="g"))
    return {qid: owner for row in stats for qid, owner in (row.owners or {}).items()}


def drained(port: int) -> bool:
    """Every queue's consume offset (the first unfinished one) reached its produce offset."""
    with ProxyClient("127.0.0.1", port) as client:
        stats = client.get_consume_stats(ConsumeStatsRequest(group="g"))
    return all(consume == (row.produceOffsets or {}).get(qid, 0)
               for row in stats for qid, consume in (row.consumeOffsets or {}).items())


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def two(tmp_path: Path, redis_url: str) -> Iterator[list[ProxyProcess]]:
    yield from start_two(tmp_path, redis_url)


def start_two(tmp_path: Path, redis_url: str) -> Iterator[list[ProxyProcess]]:
    proxies: list[ProxyProcess] = []
    try:
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            proxies.append(ProxyProcess(
                tmp_path / name, redis_url, groups=GROUPS, topics={"t": {"queues": 4}}, instance_id=name,
                leases=LEASES, commit_interval_ms=COMMIT_INTERVAL_MS, shutdown_grace_ms=0,
            ).start())
        wait_until(lambda: set(owners(proxies[0].port).values()) == {"a", "b"}, 30, "both proxies to own queues")
        yield proxies
    finally:
        for process in proxies:
            process.stop()


def pull_lease(client: ProxyClient, lease: str) -> list[tuple[str, int, str, int]]:
    """Every pull of ``lease`` (ordered runs): (key, seq, qid, offset) in the order read."""
    rows = []
    for index in range(8):
        response = client.pull(PullRequest(groupId="g", maxBatchSize=100, maxLingerTime=300 if index == 0 else 0,
                                           leaseId=lease, leaseIndex=index, leaseTimeoutMs=60_000, maxPerKey=100))
        if not response.messages or response.context is None:
            break
        for message in response.messages:
            value = json.loads(message.value or b"")
            rows.append((value["k"], value["seq"], str(response.context.qid), message.offset or 0))
    return rows


@pytest.fixture(params=["redis", "cluster"])
def url_and_two(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, list[ProxyProcess]]]:
    """Over a single Redis, and over a Redis Cluster (the lease's record and each queue's finished
    offsets live in different slots)."""
    url = request.getfixturevalue("redis_url" if request.param == "redis" else "cluster_url")
    for proxies in start_two(tmp_path, url):
        yield url, proxies


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ack", ["before_takeover", "after_takeover"])
def test_a_lease_acked_at_another_proxy_after_its_proxy_died_is_not_delivered_again(
    url_and_two: tuple[str, list[ProxyProcess]], ack: str
) -> None:
    """``before_takeover``: the usual case, the ack comes well within the queue lease TTL, and the
    survivor skips the lease's offsets when it loads the queue. ``after_takeover``: the survivor holds
    the dead proxy's queues and has read them into its buffer (not handed out) when the ack comes."""
    redis_url, (a, b) = url_and_two
    produced = produce(redis_url)
    checker = OrderChecker()
    seen: set[tuple[str, int]] = set()  # (qid, offset): every row that reached the "sink"
    duplicates = []

    def sink(rows: list[tuple[str, int, str, int]]) -> None:
        for key, seq, qid, offset in rows:
            if (qid, offset) in seen:
                duplicates.append((key, seq, qid, offset))
            seen.add((qid, offset))
            checker.delivered(key, seq)
            checker.acked(key, seq)

    with ProxyClient("127.0.0.1", a.port) as client:
        served = pull_lease(client, "s/1/0")
    assert served, "the proxy to be killed served nothing"
    sink(served)  # the micro-batch committed these rows; its ack has not been sent yet
    a.kill()
    with ProxyClient("127.0.0.1", b.port) as client:
        if ack == "after_takeover":
            wait_until(lambda: set(owners(b.port).values()) == {"b"}, 30, "b to take a's queues")
            time.sleep(0.5)  # lets b read them into its buffer (if not, the ack takes the other path)
        # b never served the lease: it acks it from the record a wrote before answering the pulls
        client.ack_leases(LeaseAck(groupId="g", leaseIds=["s/1/0"]))
        wait_until(lambda: set(owners(b.port).values()) == {"b"}, 30, "b to take a's queues")
        deadline = time.monotonic() + 60
        number = 1
        # Until every queue is drained, not just until every key is complete: a redelivery would come then.
        while not drained(b.port) and time.monotonic() < deadline:
            number += 1
            lease = f"s/{number}/0"
            sink(pull_lease(client, lease))
            client.ack_leases(LeaseAck(groupId="g", leaseIds=[lease]))
    assert duplicates == []
    assert checker.violations == []
    assert checker.missing(produced) == {}
    assert len(seen) == KEYS * PER_KEY


@pytest.mark.timeout(120)
def test_an_abandoned_lease_is_not_finished_by_a_later_ack(two: list[ProxyProcess], redis_url: str) -> None:
    """A reader that found the lease's proxy gone gives the lease up: the batch goes on without its rows,
    so the ack that follows must finish none of them, and they all arrive through the survivor."""
    a, b = two
    produced = produce(redis_url)
    with ProxyClient("127.0.0.1", a.port) as client:
        served = pull_lease(client, "s/1/0")  # a read that does not reach the sink (say, a failed task)
    assert served
    a.kill()
    checker = OrderChecker()
    with ProxyClient("127.0.0.1", b.port) as client:
        client.ack_leases(LeaseAck(groupId="g", leaseIds=["s/1/0"], abandon=True))
        client.ack_leases(LeaseAck(groupId="g", leaseIds=["s/1/0"]))
        wait_until(lambda: set(owners(b.port).values()) == {"b"}, 30, "b to take a's queues")
        deadline = time.monotonic() + 60
        number = 1
        while not drained(b.port) and time.monotonic() < deadline:
            number += 1
            lease = f"s/{number}/0"
            for key, seq, _, _ in pull_lease(client, lease):
                checker.delivered(key, seq)
                checker.acked(key, seq)
            client.ack_leases(LeaseAck(groupId="g", leaseIds=[lease]))
    assert checker.violations == []
    assert checker.missing(produced) == {}  # the abandoned lease's rows came again: nothing lost
    assert checker.duplicates == 0
