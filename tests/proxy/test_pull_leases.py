"""Replayable pulls (PullRequest.leaseId) and ackLeases, over a real proxy, real Redis and real sockets."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from ddmq.client.producer import AsyncProducer
from ddmq.client.thrift_client import AsyncProxyClient, PullError
from ddmq.protocol.wire import LeaseAck, PullRequest, PullResponse

from ..support import OrderChecker, body
from .conftest import running_proxy

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
