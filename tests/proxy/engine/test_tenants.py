"""Tenants over real Redis (``fair_key``): a tenant with most of a topic's backlog holds its share of the
window, not all of it, so the other tenants' messages, read past its backlog, finish early; every key
keeps its order, through a key whose messages name two tenants and a hand-off mid-backlog too, and
nothing is lost."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

import pytest
import redis.asyncio as aioredis

from ddmq.config.schema import TopicGroupConfig
from ddmq.protocol.produce.producer import AsyncProducer, OutgoingMessage
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.engine.tenants import NAME_CHARS, TenantShares

from ...support import OrderChecker
from ..consumers import Proxy, deliver

#: The default window (1,000) and key cap (100): the big tenant's backlog is ten times the window, and
#: an eighth of the window is what the others find free when they show up.
SETTINGS = {"order_key": "$.k"}
BIG = "A"
SMALL = [f"t{i}" for i in range(9)]


async def produce(redis_url: str, produced: dict[str, int], events: Iterable[tuple[str, str]], qid: int = 0) -> None:
    """One message per (key, tenant), each carrying its key's next sequence number."""
    batch = []
    for key, tenant in events:
        seq = produced.get(key, 0)
        produced[key] = seq + 1
        value = json.dumps({"k": key, "seq": seq, "tenant": tenant})
        batch.append(OutgoingMessage(value, key, None, None, qid))
    async with AsyncProducer(redis_url) as producer:
        await producer.send_batch("t", batch)


def big_backlog(messages: int, keys: int = 40) -> list[tuple[str, str]]:
    return [(f"a{i % keys}", BIG) for i in range(messages)]


def small_tenants(per_tenant: int, keys: int = 5) -> list[tuple[str, str]]:
    return [(f"{t}-k{i % keys}", t) for i in range(per_tenant) for t in SMALL]


async def drain(
    proxies: list[tuple[Proxy, int]], checker: OrderChecker, produced: dict[str, int], *,
    small_done_at: list[int], big_acks: int = 0, stop_after_big: int | None = None, timeout_s: float = 60,
) -> int:
    """Pull (up to 50 at a time) from every (proxy, epoch) and ack everything, until every produced
    message is acked or ``stop_after_big`` acks of the big tenant. Appends to ``small_done_at`` how many
    of the big tenant's messages had been acked when every small tenant's were. Returns the big acks."""
    small = {key: n for key, n in produced.items() if not key.startswith("a")}
    async with asyncio.timeout(timeout_s):
        while checker.missing(produced) and (stop_after_big is None or big_acks < stop_after_big):
            idle = True
            for proxy, epoch in proxies:
                batch = await proxy.pull(50)
                if not batch.messages:
                    continue
                idle = False
                deliver(proxy, batch, checker, epoch)
                big_acks += sum(1 for m in batch.messages if json.loads(m.value)["tenant"] == BIG)
                if not small_done_at and not checker.missing(small):
                    small_done_at.append(big_acks)
            if idle:
                await asyncio.sleep(0.005)
    return big_acks


async def committed(proxy: Proxy) -> int | None:
    await proxy.consumer.commits.flush()
    return await proxy.broker.committed_offset("g", "t", 0)


@pytest.mark.parametrize("fair_key", [None, "$.tenant"])
async def test_a_tenant_with_most_of_the_backlog_does_not_hold_back_the_others(
    redis_url: str, redis_client: aioredis.Redis, fair_key: str | None
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    backlog = 10_000  # ten times the window, of 20 keys: twice the window at their cap
    await produce(redis_url, produced, big_backlog(backlog, keys=20))
    await produce(redis_url, produced, small_tenants(40))
    checker = OrderChecker()
    done_at: list[int] = []
    async with Proxy(redis_client, "p1", TopicGroupConfig(fair_key=fair_key, **SETTINGS)) as proxy:
        await proxy.wait_held({0})
        await drain([(proxy, 0)], checker, produced, small_done_at=done_at)
        assert await committed(proxy) == backlog + 9 * 40 + 1
        tenants = proxy.consumer.jobs.tenants
        if fair_key is None:
            # Without tenants the others wait for nearly all of the backlog: what the test would catch.
            assert tenants is None and done_at[0] > backlog * 0.9
        else:
            assert tenants is not None
            assert done_at[0] <= backlog // 10, f"the small tenants finished after {done_at[0]} of the big one's"
            assert proxy.consumer.jobs.held.held_total > 0 and not proxy.consumer.jobs.held.keys
            assert not tenants.linked and not tenants.held and tenants.active_weight == 0
    assert checker.violations == [] and checker.missing(produced) == {}
    assert checker.duplicates == 0


async def test_a_key_whose_messages_name_two_tenants_keeps_its_order(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    # "shared" is held for the big tenant; its later messages of a small tenant wait behind it.
    mixed = [("shared", BIG if i % 2 else SMALL[0]) for i in range(300)]
    events = big_backlog(2_000)
    events[1_000:1_000] = mixed
    await produce(redis_url, produced, events)
    await produce(redis_url, produced, small_tenants(20))
    checker = OrderChecker()
    done_at: list[int] = []
    async with Proxy(redis_client, "p1", TopicGroupConfig(fair_key="$.tenant", **SETTINGS)) as proxy:
        await proxy.wait_held({0})
        await drain([(proxy, 0)], checker, produced, small_done_at=done_at)
        assert await committed(proxy) == 2_000 + 300 + 9 * 20 + 1
    assert checker.violations == [] and checker.missing(produced) == {}
    assert checker.duplicates == 0


async def test_weights_and_messages_without_a_tenant(redis_url: str, redis_client: aioredis.Redis) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    # Bodies without the tenant field are of the tenant "": a tenant of its own, never dropped.
    events = big_backlog(3_000)
    await produce(redis_url, produced, events)
    batch = []
    for i in range(50):
        seq = produced.get(f"n{i % 5}", 0)
        produced[f"n{i % 5}"] = seq + 1
        batch.append(OutgoingMessage(json.dumps({"k": f"n{i % 5}", "seq": seq}), None, None, None, 0))
    async with AsyncProducer(redis_url) as producer:
        await producer.send_batch("t", batch)
    checker = OrderChecker()
    config = TopicGroupConfig(fair_key="$.tenant", fair_weights={BIG: 3.0}, **SETTINGS)
    async with Proxy(redis_client, "p1", config) as proxy:
        await proxy.wait_held({0})
        tenants = proxy.consumer.jobs.tenants
        assert tenants is not None
        seen_shares: set[int] = set()
        async with asyncio.timeout(60):
            while checker.missing(produced):
                if BIG in tenants.linked and "" in tenants.held | tenants.linked:
                    seen_shares.add(tenants.share(BIG))
                batch_ = await proxy.pull(50)
                if batch_.messages:
                    deliver(proxy, batch_, checker)
                else:
                    await asyncio.sleep(0.005)
        # With "" beside it, the big tenant's weight of 3 gives it 3/4 of 7/8 of the window.
        assert int(1_000 * 7 / 8 * 3 / 4) in seen_shares
        assert proxy.consumer.counters["fair_key_missing"] >= 50
        assert await committed(proxy) == 3_050 + 1
    assert checker.violations == [] and checker.missing(produced) == {}


async def test_a_hand_off_mid_backlog_delivers_the_held_messages_from_redis_in_order(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, big_backlog(10_000, keys=20))
    await produce(redis_url, produced, small_tenants(30))
    checker = OrderChecker()
    done_at: list[int] = []
    config = TopicGroupConfig(fair_key="$.tenant", **SETTINGS)
    # "p2" reads first and goes away (a clean stop) while most of the big tenant's backlog is held in Redis.
    async with Proxy(redis_client, "p2", config) as old:
        await old.wait_held({0})
        big = await drain([(old, 0)], checker, produced, small_done_at=done_at, stop_after_big=1_000)
        assert old.consumer.jobs.held.per_queue[0] > 0
    async with Proxy(redis_client, "p1", config) as new:
        await new.wait_held({0})
        await drain([(new, 1)], checker, produced, small_done_at=done_at, big_acks=big)
        assert await committed(new) == 10_000 + 9 * 30 + 1
    assert checker.violations == [] and checker.missing(produced) == {}
    assert done_at and done_at[0] <= 1_000


async def test_tags_as_tenants_without_order_keys(redis_url: str, redis_client: aioredis.Redis) -> None:
    await ensure_topic(redis_client, "t", 1)
    # order_key NONE: nothing is ordered, and a big tag's messages wait in Redis under one record.
    values = [json.dumps({"k": f"m{i}", "seq": 0}) for i in range(3_360)]
    tags = [BIG] * 3_000 + [SMALL[i % 9] for i in range(360)]
    async with AsyncProducer(redis_url) as producer:
        await producer.send_batch("t", [OutgoingMessage(v, None, tag, None, 0)
                                        for v, tag in zip(values, tags, strict=True)])
    produced = {f"m{i}": 1 for i in range(3_360)}
    checker = OrderChecker()
    done_at: list[int] = []
    # Unordered, the big tag's messages in memory all go out at once: the consumer works on each pull
    # (5 ms), as a real one does, so that the reader gets on past the big tag's backlog meanwhile.
    settings = {**SETTINGS, "order_key": "NONE", "read_batch_size": 256}
    async with Proxy(redis_client, "p1", TopicGroupConfig(fair_key="TAG", **settings)) as proxy:
        await proxy.wait_held({0})
        small = {f"m{i}": 1 for i in range(3_000, 3_360)}
        async with asyncio.timeout(60):
            big = 0
            while checker.missing(produced):
                batch = await proxy.pull(10)
                if not batch.messages:
                    await asyncio.sleep(0.005)
                    continue
                await asyncio.sleep(0.005)
                deliver(proxy, batch, checker)
                big += sum(1 for m in batch.messages if int(json.loads(m.value)["k"][1:]) < 3_000)
                if not done_at and not checker.missing(small):
                    done_at.append(big)
        assert done_at[0] <= 300, f"the small tags finished after {done_at[0]} of the big one's"
        assert proxy.consumer.jobs.held.held_total > 0 and not proxy.consumer.jobs.held.keys
        assert await committed(proxy) == 3_361
    assert checker.missing(produced) == {} and checker.duplicates == 0


@pytest.mark.parametrize(("seed", "fair_key"), [(1, "$.tenant"), (2, "$.tenant"), (3, "$.tenant"), (4, None)])
async def test_random_shapes_of_tenants_and_keys_lose_nothing_and_keep_every_key_in_order(
    redis_url: str, redis_client: aioredis.Redis, seed: int, fair_key: str | None
) -> None:
    """Tenants of every size over keys of every length, a window smaller than most keys' backlogs and a
    cap smaller still, in two queues, pulled in random sizes: every message acked once, in key order,
    nothing left held, and the commit point at the end of each queue (a key whose held messages were
    never wanted again would time the test out)."""
    import random

    rng = random.Random(seed)
    await ensure_topic(redis_client, "t", 2)
    produced: dict[str, int] = {}
    ends = [0, 0]
    for qid in (0, 1):
        events: list[tuple[str, str]] = []
        while len(events) < 2_000:
            tenant = rng.choice(["A"] * 6 + ["B"] * 3 + SMALL)
            key = f"{qid}:{tenant}-{rng.randrange(3 if tenant == 'B' else 40)}"  # B: few keys, long backlogs
            # bursts of one key (past its cap, some) and now and then a message of another tenant
            events += [(key, tenant if rng.random() < 0.95 else "C") for _ in range(rng.choice([1, 1, 2, 5, 30]))]
        events = events[:2_000]
        await produce(redis_url, produced, events, qid=qid)
        ends[qid] = len(events)
    checker = OrderChecker()
    # A window of four keys at their cap: a round of held keys read again often has no room for all it wants.
    settings = {**SETTINGS, "concurrency": 12, "key_buffer": 3, "read_batch_size": 32}
    async with Proxy(redis_client, "p1", TopicGroupConfig(fair_key=fair_key, **settings)) as proxy:
        await proxy.wait_held({0, 1})
        async with asyncio.timeout(90):
            while checker.missing(produced):
                batch = await proxy.pull(rng.randrange(1, 40))
                if batch.messages:
                    deliver(proxy, batch, checker)
                else:
                    await asyncio.sleep(0.002)
        jobs = proxy.consumer.jobs
        await proxy.consumer.commits.flush()
        assert [await proxy.broker.committed_offset("g", "t", qid) for qid in (0, 1)] == [end + 1 for end in ends]
        assert jobs.held.held_total > 0 and not jobs.held.keys and not jobs.held.per_queue
        if fair_key is None:  # (with tenants their shares bound each round first)
            assert jobs.counters["resume_deferred"] > 0
        assert jobs.tenants is None or (not jobs.tenants.linked and not jobs.tenants.held)
    assert checker.violations == [] and checker.missing(produced) == {} and checker.duplicates == 0


def test_long_tenant_names_are_shown_cut_and_stay_apart() -> None:
    """A tenant is whatever a producer's message names: operators' views show at most NAME_CHARS of it
    (with a digest), and two long names alike to there stay two rows (two metric series)."""
    tenants = TenantShares(lambda: 1_000, {}, lambda key: None)
    first, second = "x" * 10_000 + "a", "x" * 10_000 + "b"
    for tenant in (first, second, "short"):
        tenants.linked_one(tenant)
    names = [view.tenant for view in tenants.views()]
    assert "short" in names and len(set(names)) == 3
    assert all(len(name) <= NAME_CHARS + 20 for name in names)
