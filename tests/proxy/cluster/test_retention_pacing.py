"""The trimmer's pace against a real Redis: a queue where nothing happens is probed less often (counted
in Redis's own ``INFO commandstats``, the commands inside the probe script included), its trimmer
lease costs one command a probe and stays held, and as soon as something happens again the queue is
trimmed within a bounded number of rounds, the caps as much as the consumed trim, while the group
receives every message in order."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from ddmq.config.schema import RetentionConfig
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.proxy.cluster.retention import Retention
from ddmq.proxy.cluster.trim_pacing import MAX_GAP_ROUNDS
from ddmq.proxy.store.broker import Broker
from ddmq.proxy.store.trim import StreamSize
from tests.support import OrderChecker, produce_keyed

from ..conftest import running_proxy
from ..retention_support import consume, wait_for

#: Long enough that no probe in these tests is due for the time since the last one, only by rounds.
HOUR_MS = 3_600_000


async def command_calls(client: aioredis.Redis) -> dict[str, int]:
    """command -> calls so far, from ``INFO commandstats`` (a script's commands under their own names)."""
    stats: dict[str, Any] = await client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(fields["calls"]) for name, fields in stats.items()}


async def calls_during(client: aioredis.Redis, work: Callable[[], Any]) -> dict[str, int]:
    """The commands Redis ran while ``await work()`` ran (nothing else uses this Redis meanwhile)."""
    before = await command_calls(client)
    await work()
    after = await command_calls(client)
    return {name: after[name] - before.get(name, 0) for name in after if after[name] != before.get(name, 0)}


@pytest.fixture
async def broker(redis_client: aioredis.Redis) -> AsyncIterator[Broker]:
    broker = Broker(redis_client)
    try:
        yield broker
    finally:
        await broker.close()


def trimmer(broker: Broker, owner: str, queues: int, retention: RetentionConfig | None = None) -> Retention:
    """A trimmer driven by the test's calls to ``round()`` (no task), over topic ``t``."""
    config = retention or RetentionConfig()
    return Retention(broker, owner, lambda: {"t": (queues, config)}, HOUR_MS)


async def test_an_idle_queue_is_probed_less_often_with_one_lease_command_a_probe(
    broker: Broker, redis_client: aioredis.Redis
) -> None:
    queues = 4
    retention = trimmer(broker, "me", queues)

    async def rounds(count: int) -> None:
        for _ in range(count):
            await retention.round()

    # Empty queues: probed at rounds 0 and 1, then the gap doubles up to MAX_GAP_ROUNDS.
    probed_at = [0, 1, 3, 7, 15, 23]
    assert MAX_GAP_ROUNDS == 8
    used = await calls_during(redis_client, lambda: rounds(24))
    assert used["xrange"] == queues * len(probed_at)  # 24 per queue if probed every round
    # The lease: taken once (SET NX), then renewed by one GETEX a probe; no GET (nothing to read).
    assert used["set"] == queues and used["getex"] == queues * (len(probed_at) - 1)
    assert "get" not in used
    assert [retention.pacing.gap(("t", q)) for q in range(queues)] == [MAX_GAP_ROUNDS] * queues
    for qid in range(queues):
        assert await redis_client.get(keys.trimmer("t", qid)) == b"me"
        assert await redis_client.pttl(keys.trimmer("t", qid)) > 0

    # The stream sizes: a fresh reading reads every queue; the trimmer's own (every 5 s) keeps those
    # of the queues backed off since.
    assert (await calls_during(redis_client, retention.measure))["xlen"] == queues
    assert "xlen" not in await calls_during(redis_client, lambda: retention.measure(fresh=False))
    assert retention.sizes == {"t": StreamSize(0, retention.sizes["t"].bytes)}

    # This proxy commits on queue 2: probed at the next round, the others not before they are due.
    broker.note_commit("t", 2)
    used = await calls_during(redis_client, lambda: rounds(1))
    assert used["xrange"] == 1 and used["getex"] == 1
    # Its gap starts over (and doubles once: the probe found it as empty as before).
    assert [retention.pacing.gap(("t", q)) for q in range(queues)] == [8, 8, 2, 8]


async def test_a_backed_off_queue_is_capped_again_within_the_longest_gap(
    redis_url: str, broker: Broker, redis_client: aioredis.Redis
) -> None:
    retention = trimmer(broker, "me", 1, RetentionConfig(max_len=50))
    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 1)
        producer.send_batch("t", [{"key": None, "value": f"a{i}", "qid": 0} for i in range(20)])
    for _ in range(2 * MAX_GAP_ROUNDS):
        await retention.round()
    # Under the cap, nothing trimmed and nothing changing: backed off, the entries kept.
    assert retention.pacing.gap(("t", 0)) == MAX_GAP_ROUNDS
    assert await redis_client.xlen(keys.stream("t", 0)) == 20
    with Producer(redis_url) as producer:
        producer.send_batch("t", [{"key": None, "value": f"b{i}", "qid": 0} for i in range(100)])
    rounds = 0
    while await redis_client.xlen(keys.stream("t", 0)) > 50:
        assert rounds < MAX_GAP_ROUNDS, "the cap not applied within the longest gap"
        await retention.round()
        rounds += 1
    first = await redis_client.xrange(keys.stream("t", 0), "-", "+", count=1)
    assert keys.offset_of(first[0][0]) == 120 - 50 + 1
    assert retention.trimmed["t", 0] == 70
    assert retention.pacing.gap(("t", 0)) == 1  # it changed: every round again


async def test_the_trimmer_lease_is_taken_over_when_it_lapses_and_kept_by_a_restarted_holder(
    broker: Broker, redis_client: aioredis.Redis
) -> None:
    lease = keys.trimmer("t", 0)
    first, second = trimmer(broker, "a", 1), trimmer(broker, "b", 1)
    await first.round()
    await second.round()
    assert await redis_client.get(lease) == b"a" and not second.pacing.held(("t", 0))
    # "a" stalls and its lease lapses: "b" takes the queue over at one of its next probes.
    await redis_client.delete(lease)
    rounds = 0
    while await redis_client.get(lease) != b"b":
        assert rounds < MAX_GAP_ROUNDS, "the lapsed lease not taken over within the longest gap"
        await second.round()
        rounds += 1
    assert second.pacing.held(("t", 0))
    # "a" comes back: its renewal answers "b", so it knows it no longer trims the queue.
    await first.round()
    assert await redis_client.get(lease) == b"b" and not first.pacing.held(("t", 0))
    # "b" restarted under the same instance id finds its own lease and keeps it.
    restarted = trimmer(broker, "b", 1)
    await restarted.round()
    assert restarted.pacing.held(("t", 0)) and await redis_client.get(lease) == b"b"


async def streams_empty(client: aioredis.Redis, queues: int) -> bool:
    return sum([await client.xlen(keys.stream("t", q)) for q in range(queues)]) == 0


async def all_committed(client: aioredis.Redis, queues: int) -> bool:
    """The group's committed offset is past the queue's last entry on every queue."""
    for qid in range(queues):
        end = int(await client.get(keys.sequence("t", qid)) or 0)
        if int(await client.get(keys.committed("g", "t", qid)) or 1) != end + 1:
            return False
    return True


@pytest.mark.parametrize("told", [True, False], ids=["this-proxy-commits", "another-proxy-commits"])
async def test_after_a_quiet_spell_what_the_group_consumed_is_trimmed_again_and_delivered_in_order(
    redis_url: str, redis_client: aioredis.Redis, broker: Broker, told: bool
) -> None:
    """The trimmer is the consuming proxy's own, told of its commits (the queue is looked at the round
    after), or another proxy's, which finds them at its probes (within the longest gap): either way the
    queues are trimmed again after a quiet spell, and the group got every message in order."""
    queues = 2
    produced: dict[str, int] = {}
    checker = OrderChecker()
    rng = random.Random(27)
    topics = {"t": {"queues": queues, "retention": {"interval_ms": 50, "step": 500}}}
    async with running_proxy(redis_url, queues=queues, topics=topics) as service:
        assert service.retention is not None and service.registry.broker is not None
        retention = service.retention
        if not told:
            await service.retention.close()  # gives its trimmer leases up
            config = RetentionConfig(interval_ms=50, step=500)
            retention = Retention(broker, "other", lambda: {"t": (queues, config)}, 50)  # its own Redis client
            retention.start()
        # The round under way when the commits land may have probed before them, and the polling below
        # may see the empty streams a round or two late.
        bound = (1 if told else MAX_GAP_ROUNDS) + 3
        try:
            for spell in range(2):
                await asyncio.to_thread(produce_keyed, redis_url, 300, produced, rng, keys=20)
                await consume(service, "g", checker, 300 * (spell + 1))
                await wait_for(lambda: all_committed(redis_client, queues), what="the commits written")
                landed = retention.pacing.round
                while not await streams_empty(redis_client, queues):
                    assert retention.pacing.round - landed <= bound, "not trimmed within the bound"
                    await asyncio.sleep(0.01)

                async def quiet() -> bool:
                    return all(retention.pacing.gap(("t", q)) == MAX_GAP_ROUNDS for q in range(queues))
                await wait_for(quiet, what="the empty queues backed off")
        finally:
            if not told:
                await retention.close()
        assert checker.deliveries == 600 and not checker.violations
        assert checker.missing(produced) == {}
        assert sum(service.groups["g"].consumers["t"].expired.values()) == 0
        assert sum(retention.trimmed.values()) == 600
        if not told:  # nobody took the consuming proxy's notes of its commits
            assert service.registry.broker.take_commits() == {("t", 0), ("t", 1)}


async def test_a_round_reads_the_registry_for_the_topics_with_entries_only(
    broker: Broker, redis_client: aioredis.Redis, redis_url: str
) -> None:
    """With many groups and topics registered and one topic holding entries, a round asks each group
    about that topic alone (Redis's MONITOR shows the HMGETs), and trims it as far as its groups allow."""
    topics = [f"t{i:02d}" for i in range(30)]
    for group in (f"g{i:02d}" for i in range(20)):
        await redis_client.sadd(keys.groups(), group)
        await redis_client.hset(keys.group_topics(group), mapping={topic: 10**15 for topic in topics})

    def produce() -> None:
        with Producer(redis_url) as producer:
            for topic in topics:
                producer.ensure_topic(topic, 2)
            for i in range(6):
                producer.send("t00", f"m{i}", key="k", qid=0)

    await asyncio.to_thread(produce)
    await redis_client.set(keys.committed("g00", "t00", 0), 3)
    retention = Retention(broker, "me", lambda: {t: (2, RetentionConfig()) for t in topics}, HOUR_MS)
    seen: list[list[str]] = []
    async with aioredis.Redis.from_url(redis_url, decode_responses=True) as watcher:
        async with watcher.monitor() as monitor:
            await retention.round()
            await redis_client.echo("round over")
            while True:
                command = (await asyncio.wait_for(monitor.next_command(), 10))["command"]
                if command == "ECHO round over":
                    break
                if command.startswith("HMGET "):
                    seen.append(command.split()[2:])
    assert len(seen) == 20 and all(fields == ["t00"] for fields in seen), seen[:3]
    # Only g00 committed (up to 3); the 19 others hold the queue at its head, so nothing is trimmed.
    assert await redis_client.xlen(keys.stream("t00", 0)) == 6
