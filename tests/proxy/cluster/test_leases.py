"""Leases against a real Redis: exclusive, renewable, reclaimable by the same instance, and fencing."""

from __future__ import annotations

import asyncio
from collections import Counter

import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from ddmq.proxy.cluster.leases import RENEW_BATCH, LeaseStore


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


async def test_a_batch_renews_every_lease_but_the_one_taken_over_in_its_middle(redis_client: aioredis.Redis) -> None:
    a, b = LeaseStore(redis_client, "proxy-a", 200), LeaseStore(redis_client, "proxy-b", 10_000)
    held = [await a.acquire("g", "t", qid) for qid in range(3)] + [await a.acquire("g2", "t", 1)]
    leases = [lease for lease in held if lease is not None]
    assert len(leases) == 4
    await asyncio.sleep(0.3)  # a "pauses" past its leases; b takes queue 1 of g over meanwhile
    taken = await b.acquire("g", "t", 1)
    assert taken is not None
    assert await a.renew_many(leases) == [True, False, True, True]
    # b's value, so its owner and fencing term, untouched (its expiry is set once to a's TTL: the script's note)
    assert await redis_client.get(keys.lease("g", "t", 1)) == taken.token.encode()
    for lease in (leases[0], leases[2], leases[3]):
        key = lease.keys()[0]
        assert await redis_client.get(key) == lease.token.encode() and 0 < await redis_client.pttl(key) <= 200
    assert not await a.commit(leases[1], 4), "the lease reported lost stays fenced off"
    assert await a.renew_many([]) == []


async def test_a_batch_larger_than_one_script_call_fences_lease_by_lease(redis_client: aioredis.Redis) -> None:
    a = LeaseStore(redis_client, "proxy-a", 60_000)
    held = [await a.acquire("g", "t", qid) for qid in range(2 * RENEW_BATCH + 3)]
    leases = [lease for lease in held if lease is not None]
    assert len(leases) == 2 * RENEW_BATCH + 3
    fenced = RENEW_BATCH + 1  # in the second script call
    # What `ddmq offsets reset` does once the lease expired: the term moves on without a lease.
    await redis_client.delete(keys.lease("g", "t", fenced))
    await redis_client.incr(keys.lease_term("g", "t", fenced))
    for lease in leases:
        await redis_client.pexpire(lease.keys()[0], 120_000)  # longer than the TTL: a renewal sets it back
    await redis_client.script_flush()  # the script is sent again where Redis does not know it
    results = await a.renew_many(leases)
    assert [qid for qid, renewed in enumerate(results) if not renewed] == [fenced]
    assert all(renewed is not None for renewed in results)
    assert await redis_client.get(keys.lease("g", "t", fenced)) is None
    ttls = [await redis_client.pttl(lease.keys()[0]) for i, lease in enumerate(leases) if i != fenced]
    assert all(0 < ttl <= 60_000 for ttl in ttls)


async def test_a_held_lease_costs_one_redis_command_per_renewal(redis_client: aioredis.Redis) -> None:
    """Renewals are most of an idle proxy's Redis work: GETEX reads the holder and sets the expiry at
    once, so a batch of held leases costs Redis one command each (plus the script's one OOM pass)."""
    a = LeaseStore(redis_client, "proxy-a", 60_000)
    held = [await a.acquire("g", "t", qid) for qid in range(40)]
    leases = [lease for lease in held if lease is not None]
    await redis_client.pexpire(leases[0].keys()[0], 1_000)  # a renewal sets it back to the TTL
    await redis_client.config_resetstat()
    assert await a.renew_many(leases) == [True] * 40
    stats = await redis_client.info("commandstats")
    ran: Counter[str] = Counter()
    for name, value in stats.items():  # Redis 7 and Valkey name subcommands: cmdstat_config|resetstat
        ran[name.removeprefix("cmdstat_").partition("|")[0]] += value["calls"]
    assert ran.pop("getex") == 40 and ran.pop("del") == 1  # the OOM pass of the one script call
    assert set(ran) <= {"evalsha", "eval", "script", "info", "config"}, ran
    assert 59_000 < await redis_client.pttl(leases[0].keys()[0]) <= 60_000


async def test_a_renewal_or_commit_arriving_after_the_release_does_not_take_the_lease_back(
    redis_client: aioredis.Redis,
) -> None:
    """A renewal batch sent before a hand-off released its lease may reach Redis after the release: it
    must not write the lease back (the queue would wait out a TTL with nobody reading it)."""
    a, b = LeaseStore(redis_client, "proxy-a", 30_000), LeaseStore(redis_client, "proxy-b", 30_000)
    lease = await a.acquire("g", "t", 0)
    assert lease is not None and await a.release(lease)
    assert await a.renew_many([lease]) == [False]
    assert not await a.renew(lease)
    assert not await a.commit(lease, 4)
    assert await redis_client.get(keys.lease("g", "t", 0)) is None
    successor = await b.acquire("g", "t", 0)
    assert successor is not None and successor.term > lease.term
