"""Leases against a real Redis: exclusive, renewable, reclaimable by the same instance, and fencing."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from ddmq.protocol import keys
from ddmq.proxy.cluster.leases import LeaseStore


async def test_only_one_owner_at_a_time(redis_client: aioredis.Redis) -> None:
    a, b = LeaseStore(redis_client, "proxy-a", 10_000), LeaseStore(redis_client, "proxy-b", 10_000)
    lease = await a.acquire("g", "t", 0)
    assert lease is not None and lease.term == 1
    assert await b.acquire("g", "t", 0) is None
    assert await b.acquire("g", "t", 1) is not None  # other queues are independent
    holder = await b.holder("g", "t", 0)
    assert holder is not None and (holder.owner, holder.term) == ("proxy-a", 1)
    assert 0 < holder.expires_in_ms <= 10_000


async def test_expiry_lets_another_owner_in_and_fences_the_old_one(redis_client: aioredis.Redis) -> None:
    a, b = LeaseStore(redis_client, "proxy-a", 200), LeaseStore(redis_client, "proxy-b", 10_000)
    old = await a.acquire("g", "t", 0)
    assert old is not None and await a.commit(old, 5)
    await asyncio.sleep(0.3)  # a "pauses" past its lease
    new = await b.acquire("g", "t", 0)
    assert new is not None and new.term == old.term + 1
    assert await b.commit(new, 7)
    # a wakes up: nothing it writes lands, and it learns it lost the queue
    assert not await a.commit(old, 6)
    assert not await a.renew(old)
    assert not await a.release(old)
    assert await redis_client.get(keys.committed("g", "t", 0)) == b"7"


async def test_an_expired_lease_nobody_took_is_still_ours(redis_client: aioredis.Redis) -> None:
    a = LeaseStore(redis_client, "proxy-a", 150)
    lease = await a.acquire("g", "t", 0)
    assert lease is not None
    await asyncio.sleep(0.25)
    assert await redis_client.get(keys.lease("g", "t", 0)) is None
    assert await a.commit(lease, 3)  # no newer term exists, so no one else can have read the queue
    assert await a.renew(lease)
    assert await redis_client.get(keys.lease("g", "t", 0)) == lease.token.encode()


async def test_the_same_instance_reclaims_at_once_with_a_new_term(redis_client: aioredis.Redis) -> None:
    first = LeaseStore(redis_client, "proxy-a", 60_000)
    old = await first.acquire("g", "t", 0)
    restarted = LeaseStore(redis_client, "proxy-a", 60_000)
    new = await restarted.acquire("g", "t", 0)
    assert old is not None and new is not None and new.term == old.term + 1
    assert not await first.commit(old, 9), "the previous incarnation is fenced off"
    assert await restarted.commit(new, 9)


async def test_release_frees_the_queue(redis_client: aioredis.Redis) -> None:
    a, b = LeaseStore(redis_client, "proxy-a", 60_000), LeaseStore(redis_client, "proxy-b", 60_000)
    lease = await a.acquire("g", "t", 0)
    assert lease is not None and await a.release(lease)
    assert await b.acquire("g", "t", 0) is not None


async def test_scripts_survive_a_flushed_script_cache(redis_client: aioredis.Redis) -> None:
    a = LeaseStore(redis_client, "proxy-a", 60_000)
    lease = await a.acquire("g", "t", 0)
    assert lease is not None
    await redis_client.script_flush()  # what a Redis restart does
    assert await a.renew(lease)
