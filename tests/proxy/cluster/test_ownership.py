"""QueueOwnership (cluster/ownership.py) over real Redis: claiming the assigned queues, dropping and
releasing one, handing queues to a second proxy, with per-key order and no loss throughout."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.cluster.leases import LeaseStore

from ...support import OrderChecker
from ..consumers import LEASES, Proxy, consume_all, produce


async def test_a_lone_proxy_claims_every_queue_and_opens_each(redis_url: str, redis_client: aioredis.Redis) -> None:
    await ensure_topic(redis_client, "t", 3)
    async with Proxy(redis_client, "p1") as proxy:
        await proxy.wait_held({0, 1, 2})
        consumer = proxy.consumer
        assert all(consumer.jobs.may_serve(qid) for qid in range(3))
        assert {lease.owner for lease in consumer.held.values()} == {"p1"}
        # A queue is held from its claim; its reader opens once its offset is read back.
        deadline = asyncio.get_running_loop().time() + 10
        while len(consumer.owned.readers()) < 3 and asyncio.get_running_loop().time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        assert len(consumer.owned.readers()) == 3 and set(consumer.trackers) == {0, 1, 2}



async def test_proxies_started_one_after_another_in_one_process_each_open_every_queue(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    # A consumer's ownership task is cancelled when its proxy stops; a later proxy of the same process
    # (an embedding application, a test) must still open what it claims. A compiled ownership task
    # once left the second one holding leases it never read, so nothing was delivered.
    await ensure_topic(redis_client, "t", 3)
    checker = OrderChecker()
    produced: dict[str, int] = {}
    for epoch, instance in enumerate(("p1", "p2", "p3")):
        await produce(redis_url, produced, [f"k{i}" for i in range(12)])
        async with Proxy(redis_client, instance) as proxy:
            await proxy.wait_held({0, 1, 2})
            await consume_all([(proxy, epoch)], checker, produced)
    assert checker.violations == [] and checker.missing(produced) == {}

async def test_drop_with_release_frees_the_lease_and_forgets_the_jobs(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i}" for i in range(6)])
    async with Proxy(redis_client, "p1") as proxy:
        await proxy.wait_held({0})
        proxy.membership.stall()  # the lease loop claims nothing back meanwhile
        batch = await proxy.buffer.pull("t", 100, 20_000)  # answered at the reader's first read
        assert batch.messages  # handed out, not acked
        tracker = proxy.consumer.commits.tracker(0)
        await proxy.consumer.ownership.drop_queue(0, release=True)
        assert tracker is not None and tracker.dropped
        assert proxy.consumer.held == {} and proxy.consumer.owned.readers() == []
        assert await redis_client.get(keys.lease("g", "t", 0)) is None  # a successor may take it at once
        assert proxy.consumer.unfinished == 0  # its jobs were finished as dropped


async def test_queues_move_to_a_second_proxy_without_loss_or_disorder(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 4)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    async with Proxy(redis_client, "p1") as first:
        await first.wait_held({0, 1, 2, 3})
        await produce(redis_url, produced, [f"k{i % 12}" for i in range(120)])
        await consume_all([(first, 0)], checker, produced)
        async with Proxy(redis_client, "p2") as second:
            await produce(redis_url, produced, [f"k{i % 12}" for i in range(120)])
            await consume_all([(first, 0), (second, 0)], checker, produced)
            held = set(first.consumer.held) | set(second.consumer.held)
            assert held <= {0, 1, 2, 3}
            assert not set(first.consumer.held) & set(second.consumer.held)
    assert checker.violations == [] and checker.missing(produced) == {}


async def test_a_renewal_round_drops_the_queue_taken_over_and_renews_the_others(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 4)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    async with Proxy(redis_client, "p1") as proxy:
        await proxy.wait_held({0, 1, 2, 3})
        consumer = proxy.consumer
        proxy.membership.stall()  # the upkeep's rounds wait: the test runs the renewal itself
        tracker = consumer.commits.tracker(2)
        # Another proxy took queue 2 over (say this one was paused past its lease).
        await redis_client.delete(keys.lease("g", "t", 2))
        other = await LeaseStore(redis_client, "p2", 60_000).acquire("g", "t", 2)
        assert other is not None
        for qid in (0, 1, 3):
            await redis_client.pexpire(keys.lease("g", "t", qid), 120_000)  # a renewal sets the TTL back
        await consumer.upkeep.renew()
        assert set(consumer.held) == {0, 1, 3} and set(consumer.trackers) == {0, 1, 3}
        assert tracker is not None and tracker.dropped and not consumer.jobs.may_serve(2)
        assert all(consumer.jobs.may_serve(qid) for qid in (0, 1, 3))
        assert await redis_client.get(keys.lease("g", "t", 2)) == other.token.encode()
        for qid in (0, 1, 3):
            assert 0 < await redis_client.pttl(keys.lease("g", "t", qid)) <= LEASES.ttl_ms
        # The queues it kept go on in order; queue 2's messages stay for its new owner (whose lease
        # keeps this proxy's next claims of it away).
        proxy.membership.resume()
        await produce(redis_url, produced, [f"k{i}" for i in range(40)])
        kept = {key: count for key, count in produced.items() if queue_for_key(key, 4) != 2}
        await consume_all([(proxy, 0)], checker, kept)
        assert 2 not in consumer.held
    assert checker.violations == [] and checker.missing(kept) == {}


async def test_a_settled_proxy_claims_back_a_queue_it_let_go_and_loses_nothing(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    # Rounds of a proxy holding exactly its assignment skip the rebalance; letting a lease go must end
    # that, so the queue is claimed again (here by the same proxy, the only member) and read on in order.
    await ensure_topic(redis_client, "t", 4)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    async with Proxy(redis_client, "p1") as proxy:
        await proxy.wait_held({0, 1, 2, 3})
        consumer = proxy.consumer
        await asyncio.sleep(5 * LEASES.claim_interval_ms / 1000)  # a few settled rounds
        await produce(redis_url, produced, [f"k{i % 16}" for i in range(160)])
        await consume_all([(proxy, 0)], checker, produced)
        version = consumer.owned.leases_version
        await consumer.ownership.drop_queue(1, release=True)
        assert 1 not in consumer.held and consumer.owned.leases_version > version
        await proxy.wait_held({0, 1, 2, 3})
        await produce(redis_url, produced, [f"k{i % 16}" for i in range(160)])
        await consume_all([(proxy, 1)], checker, produced)
    assert checker.violations == [] and checker.missing(produced) == {}
