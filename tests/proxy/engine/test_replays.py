"""Replayable pulls (PullRequest.leaseId) and ackLeases, over a real proxy, real Redis and real sockets."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from ddmq.client.thrift_client import AsyncProxyClient, PullError
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.wire import LeaseAck, PullRequest, PullResponse
from ddmq.proxy.service import ProxyService

from ...support import OrderChecker, body
from ..conftest import running_proxy

ORDERED = {"order_key": "KEY", "timeout_ms": 5000}


async def produce(redis_url: str, keys: int, per_key: int, seed: int = 7) -> dict[str, int]:
    rng = random.Random(seed)
    remaining = {f"k{i}": 0 for i in range(keys)}
    items = []
    while remaining:
        key = rng.choice(list(remaining))
        items.append({"key": key, "value": body(key, remaining[key])})
        remaining[key] += 1
        if remaining[key] == per_key:
            del remaining[key]
    async with AsyncProducer(redis_url) as producer:
        await producer.ensure_topic("t", 4)  # as the proxy declares it
        await producer.send_batch("t", items)
    return {f"k{i}": per_key for i in range(keys)}


def leased(lease: str, index: int, timeout_ms: int | None = None, linger_ms: int = 200) -> PullRequest:
    return PullRequest(
        groupId="g",
        maxBatchSize=16,
        maxLingerTime=linger_ms,
        leaseId=lease,
        leaseIndex=index,
        leaseTimeoutMs=timeout_ms,
    )


def events(response: PullResponse) -> list[tuple[str, int, int]]:
    assert response.context is not None
    return [
        (json.loads(m.value or b"")["k"], json.loads(m.value or b"")["seq"], m.offset or 0)
        for m in response.messages or ()
    ]


async def test_a_repeated_leased_pull_replays_and_ack_by_lease_releases_keys_in_order(redis_url: str) -> None:
    produced = await produce(redis_url, keys=40, per_key=6)
    checker = OrderChecker()
    async with running_proxy(redis_url, ORDERED) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            batch_no = 0
            while checker.missing(produced):
                batch_no += 1
                assert batch_no < 200, f"not drained: {list(checker.missing(produced).items())[:5]}"
                # One "partition" reads up to three pulls of one lease, then reads it all again.
                first: list[list[tuple[str, int, int]]] = []
                for index in range(3):
                    got = events(await client.pull(leased(f"c/{batch_no}/0", index)))
                    first.append(got)
                    if not got:
                        break
                for index, expected in enumerate(first):
                    assert events(await client.pull(leased(f"c/{batch_no}/0", index, linger_ms=0))) == expected
                rows = [row for pull in first for row in pull]
                for key, seq, _ in rows:
                    checker.delivered(key, seq)
                # Not acked yet: no key's successor is handed out.
                assert service.groups["g"].buffer.in_flight == len(rows)
                acked = await client.ack_leases(LeaseAck(groupId="g", leaseIds=[f"c/{batch_no}/0", "unknown"]))
                assert acked == len(rows)
                for key, seq, _ in rows:
                    checker.acked(key, seq)
                # An acked lease is forgotten: reading past its first pull answers nothing.
                assert not events(await client.pull(leased(f"c/{batch_no}/0", 1, linger_ms=0)))
            assert checker.violations == []
            assert checker.duplicates == 0
            assert service.groups["g"].buffer.in_flight == 0
            assert service.groups["g"].buffer.stats.timed_out == 0


async def test_an_expired_lease_is_redelivered_elsewhere_and_never_replayed(redis_url: str) -> None:
    produced = await produce(redis_url, keys=10, per_key=3)
    checker = OrderChecker()
    async with running_proxy(redis_url, {**ORDERED, "retry_intervals_ms": [0]}) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            lost = events(await client.pull(leased("old/1/0", 0, timeout_ms=100)))
            assert lost
            for key, seq, _ in lost:
                checker.delivered(key, seq)
            await asyncio.sleep(0.3)  # the lease times out; its messages become ready again
            batch_no = 0
            while checker.missing(produced):
                batch_no += 1
                assert batch_no < 100
                rows = events(await client.pull(leased(f"new/{batch_no}/0", 0)))
                for key, seq, _ in rows:
                    checker.delivered(key, seq)
                # The expired lease never answers again, so a stale reader cannot reorder a key.
                assert not events(await client.pull(leased("old/1/0", 0, linger_ms=0)))
                await client.ack_leases(LeaseAck(groupId="g", leaseIds=[f"new/{batch_no}/0"]))
                for key, seq, _ in rows:
                    checker.acked(key, seq)
            assert checker.violations == []
            assert service.groups["g"].buffer.stats.timed_out == len(lost)
            assert await client.ack_leases(LeaseAck(groupId="g", leaseIds=["old/1/0"])) == 0


async def test_lease_requests_are_checked(redis_url: str) -> None:
    await produce(redis_url, keys=2, per_key=2)
    async with running_proxy(redis_url, ORDERED) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            for request in (leased("", 0), leased("x", -1), leased("x", 0, timeout_ms=0), leased("x" * 600, 0)):
                with pytest.raises(PullError) as error:
                    await client.pull(request)
                assert error.value.code == 1003
            assert events(await client.pull(leased("x", 0)))
            with pytest.raises(PullError) as error:
                await client.pull(leased("x", 5))  # must continue with index 1
            assert error.value.code == 1003
            with pytest.raises(PullError) as error:
                await client.ack_leases(LeaseAck(groupId="nope", leaseIds=["x"]))
            assert error.value.code == 1001
            # The proxy still serves and the bad calls lost nothing: the lease acks what it holds.
            assert await client.ack_leases(LeaseAck(groupId="g", leaseIds=["x"])) > 0


def runs_of(response: PullResponse) -> list[list[tuple[str, int, int]]]:
    """The reply's messages split into its runs (one run per message when it carries none)."""
    got = events(response)
    sizes = response.runs or [1] * len(got)
    assert sum(sizes) == len(got)
    out, at = [], 0
    for size in sizes:
        out.append(got[at : at + size])
        at += size
    return out


async def settled(service: ProxyService, messages: int) -> None:
    """Wait until the readers have read ``messages`` (a key's successors may still be unread)."""
    group = service.groups["g"]
    async with asyncio.timeout(5):
        while sum(c.unfinished for c in group.consumers.values()) < messages:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_a_lease_continues_the_runs_of_keys_it_holds_in_its_later_pulls(redis_url: str) -> None:
    produced = await produce(redis_url, keys=40, per_key=6)
    checker = OrderChecker()
    async with running_proxy(redis_url, ORDERED) as service:
        assert service.thrift_port is not None
        await settled(service, 240)
        async with (
            AsyncProxyClient("127.0.0.1", service.thrift_port) as client,
            AsyncProxyClient("127.0.0.1", service.thrift_port) as other,
        ):

            def request(lease: str, index: int) -> PullRequest:
                return PullRequest(
                    groupId="g", maxBatchSize=16, maxLingerTime=0, leaseId=lease, leaseIndex=index, maxPerKey=64
                )

            leases = continued = 0
            while checker.missing(produced):
                leases += 1
                assert leases <= 20
                lease = f"c/{leases}/0"
                pulls: list[PullResponse] = []
                for index in range(12):
                    response = await client.pull(request(lease, index))
                    if not response.messages:
                        break
                    pulls.append(response)
                    # Another reader never gets a key this lease holds.
                    held = {key for got in pulls for key, _, _ in events(got)}
                    stranger = await other.pull(request(f"other/{leases}/{index}", 0))
                    assert not held & {key for key, _, _ in events(stranger)}
                    if stranger.messages:
                        await other.ack_leases(LeaseAck(groupId="g", leaseIds=[f"other/{leases}/{index}"]))
                        for key, seq, _ in events(stranger):
                            checker.delivered(key, seq)
                            checker.acked(key, seq)
                seen: set[str] = set()
                for index, response in enumerate(pulls):
                    # A replay answers the same messages in the same runs.
                    again = await client.pull(request(lease, index))
                    assert events(again) == events(response) and again.runs == response.runs
                    for run in runs_of(response):
                        keys = {key for key, _, _ in run}
                        assert len(keys) == 1, run
                        assert [seq for _, seq, _ in run] == list(range(run[0][1], run[0][1] + len(run)))
                        continued += bool(keys & seen)
                    for key, seq, _ in events(response):  # the reader processes the lease's rows in order
                        checker.delivered(key, seq)
                        checker.acked(key, seq)
                        seen.add(key)
                rows = sum(len(response.messages or ()) for response in pulls)
                assert await client.ack_leases(LeaseAck(groupId="g", leaseIds=[lease])) == rows
            assert checker.violations == []
            assert checker.duplicates == 0
            # Later pulls of a lease carried on keys of its earlier pulls: 240 messages, 16 per pull and
            # 12 pulls per lease drain in two leases (a key going out once per lease would need six).
            assert continued > 0
            assert leases <= 3, leases
            assert service.groups["g"].buffer.in_flight == 0


async def test_a_continued_run_returns_to_its_key_when_the_lease_expires(redis_url: str) -> None:
    produced = await produce(redis_url, keys=8, per_key=5)
    checker = OrderChecker()
    async with running_proxy(redis_url, {**ORDERED, "retry_intervals_ms": [0]}) as service:
        assert service.thrift_port is not None
        await settled(service, 40)
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:

            def request(lease: str, index: int, size: int, timeout_ms: int) -> PullRequest:
                return PullRequest(
                    groupId="g",
                    maxBatchSize=size,
                    maxLingerTime=0,
                    leaseId=lease,
                    leaseIndex=index,
                    leaseTimeoutMs=timeout_ms,
                    maxPerKey=64,
                )

            # One message per key first (heads only), then the keys' runs continue in later pulls.
            lost: list[tuple[str, int, int]] = []
            for index in range(6):
                lost += events(await client.pull(request("old", index, 2, 300)))
            assert len({key for key, _, _ in lost}) < len(lost), "no run was continued"
            for key, seq, _ in lost:  # processed in order, but the lease is never acked
                checker.delivered(key, seq)
                checker.acked(key, seq)
            await asyncio.sleep(0.6)  # the lease times out: its heads retry, the rest waits behind them
            batch_no = 0
            while checker.missing(produced):
                batch_no += 1
                assert batch_no < 50
                lease = f"new/{batch_no}"
                rows: list[tuple[str, int, int]] = []
                for index in range(4):
                    got = events(await client.pull(request(lease, index, 16, 5000)))
                    if not got:
                        break
                    rows += got
                for key, seq, _ in rows:  # epoch 1: each key starts again from its first unacked message
                    checker.delivered(key, seq, epoch=1)
                    checker.acked(key, seq, epoch=1)
                await client.ack_leases(LeaseAck(groupId="g", leaseIds=[lease]))
            assert checker.violations == []
            assert checker.duplicates == len(lost)
            assert not events(await client.pull(request("old", 0, 2, 300)))
            assert service.groups["g"].buffer.in_flight == 0
