"""Hand-offs without a gap (cluster/ownership.py) over real Redis: a queue let go hands out nothing more
at once, waits only for what clients hold of it, commits and releases; the proxy it is assigned to
claims it as soon as it is released, not at its next round; a claim cancelled mid-script gives back
what it took. Per-key order and no loss are checked across each move."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from ddmq.config.schema import LeaseConfig, TopicGroupConfig
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.cluster.leases import Lease, LeaseStore
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.groups.group import TopicConsumer
from ddmq.proxy.groups.parts import ProxyParts
from ddmq.proxy.store.broker import Broker

from ...support import OrderChecker, until
from ..consumers import Proxy, StallableMembership, consume_all, deliver, produce

#: Rounds two seconds apart: a queue claimed within a fraction of that was claimed by the retry.
SLOW_ROUNDS = LeaseConfig(ttl_ms=6000, renew_ms=2000, claim_interval_ms=2000, handoff_drain_ms=5000)


class SlowProxy(Proxy):
    """:class:`~tests.proxy.consumers.Proxy` with :data:`SLOW_ROUNDS` (or ``store``'s leases)."""

    def __init__(self, redis: aioredis.Redis, instance: str, store: LeaseStore | None = None) -> None:
        self.broker = Broker(redis)
        self.membership = StallableMembership(redis, instance, SLOW_ROUNDS.ttl_ms)
        self.buffer = PullBuffer("g")
        store = store or LeaseStore(redis, instance, SLOW_ROUNDS.ttl_ms)
        parts = ProxyParts.of(self.broker, store, SLOW_ROUNDS, self.membership)
        self.consumer = TopicConsumer("g", "t", TopicGroupConfig(order_key="KEY"), self.buffer, parts)


async def test_a_queue_let_go_serves_nothing_more_and_is_released_once_what_clients_hold_is_acked(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    await produce(redis_url, produced, [f"k{i % 6}" for i in range(18)])
    async with SlowProxy(redis_client, "p1") as first:
        await first.wait_held({0})
        first.membership.stall()  # no round interferes: the test lets the queue go itself
        await until("a first batch", lambda: first.buffer.ready >= 6, 20)
        batch = await first.pull(3)
        assert len(batch.messages) == 3
        deliver(first, batch, checker, ack=False)
        letting = asyncio.create_task(first.consumer.ownership.let_go(0, drain_ms=20_000))
        await asyncio.sleep(0)  # the hand-off's first step runs
        assert not first.consumer.jobs.may_serve(0)
        assert not (await first.pull()).messages, "a queue let go hands out nothing more"
        assert not letting.done() and await redis_client.get(keys.lease("g", "t", 0)) is not None
        deliver(first, batch, checker)  # the ack of what the client held is applied...
        assert await asyncio.wait_for(letting, 5) == 0  # ...and the queue goes at once, not after the drain
        assert await redis_client.get(keys.lease("g", "t", 0)) is None
        assert int(await redis_client.get(keys.committed("g", "t", 0)) or 0) > min(m.offset for m in batch.messages)
        async with SlowProxy(redis_client, "p2") as second:
            await second.wait_held({0})
            await consume_all([(second, 1)], checker, produced)  # the rest, read again from the commit point
    assert checker.violations == [] and checker.missing(produced) == {}


async def test_the_proxy_a_queue_is_assigned_to_claims_it_as_soon_as_it_is_released(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 2)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    await produce(redis_url, produced, [f"k{i % 8}" for i in range(64)])
    async with SlowProxy(redis_client, "p1") as first:
        await first.wait_held({0, 1})
        await until("queue 1's jobs", lambda: first.buffer.ready >= 8, 20)
        held = await first.pull(4)
        while held.queue is None or held.queue.qid != 1:  # a batch of queue 1, which moves
            deliver(first, held, checker)
            held = await first.pull(4)
        deliver(first, held, checker, ack=False)
        async with SlowProxy(redis_client, "p2") as second:
            await until("p2's share", lambda: second.consumer.assigned == range(1, 2), 10)
            second.membership.stall()  # no more rounds of p2: only its claim's retry can take queue 1
            await until("p1's hand-off", lambda: first.consumer.owned.handing_off(1), 10)
            assert 1 not in second.consumer.held  # refused: p1 still holds what a client has
            deliver(first, held, checker)
            released = asyncio.get_running_loop().time()
            await until("p2 holds queue 1", lambda: 1 in second.consumer.held, 2)
            assert asyncio.get_running_loop().time() - released < SLOW_ROUNDS.claim_interval_ms / 2000
            second.membership.resume()
            await second.wait_held({1})
            await consume_all([(first, 0), (second, 1)], checker, produced)
    assert checker.violations == [] and checker.missing(produced) == {}


class GatedStore(LeaseStore):
    """Acquires for real, then waits at a gate: a cancel lands after the script ran, before its answer."""

    def __init__(self, redis: aioredis.Redis, owner: str, ttl_ms: int) -> None:
        super().__init__(redis, owner, ttl_ms)
        self.took = asyncio.Event()
        self.gate = asyncio.Event()

    async def acquire(self, group: str, topic: str, qid: int) -> Lease | None:
        lease = await super().acquire(group, topic, qid)
        self.took.set()
        await self.gate.wait()
        return lease


async def test_a_claim_cancelled_after_its_script_ran_releases_the_lease_it_took(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    store = GatedStore(redis_client, "p1", SLOW_ROUNDS.ttl_ms)
    proxy = SlowProxy(redis_client, "p1", store)
    claim = asyncio.create_task(proxy.consumer.ownership._acquire(0))
    await asyncio.wait_for(store.took.wait(), 5)
    assert await redis_client.get(keys.lease("g", "t", 0)) is not None
    claim.cancel()
    store.gate.set()
    await asyncio.gather(claim, return_exceptions=True)
    assert claim.cancelled()
    assert await redis_client.get(keys.lease("g", "t", 0)) is None, "a lease taken and forgotten holds the queue"
    assert await LeaseStore(redis_client, "p2", 1000).acquire("g", "t", 0) is not None
    await proxy.broker.close()
