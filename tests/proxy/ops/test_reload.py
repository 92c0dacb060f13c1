"""Live configuration against a real Redis and a real ProxyService: groups and topics are added,
removed and changed while a producer writes and pull clients consume; per-key order and no loss are
checked across every change, and an invalid config leaves the running one in force."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
import yaml

from ddmq.config import parse
from ddmq.config.schema import ProxyConfig
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys
from ddmq.proxy.core.errors import ConfigError, UnknownGroupError, UnknownTopicError
from ddmq.proxy.core.types import QueueResult
from ddmq.proxy.groups.changes import ConfigChange, diff
from ddmq.proxy.ops.reload import ConfigReloader
from ddmq.proxy.service import ProxyService

from ...support import OrderChecker, body

TOPICS = ("t1", "t2")
QUEUES = 4
KEYS = 40
ORDERED = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 3000}


def raw_config(redis_url: str, groups: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "instance_id": "reload-proxy",
        "redis": redis_url,
        "thrift": {"port": 0},
        "commit_interval_ms": 50,
        "shutdown_grace_ms": 0,
        # A drain shorter than the clients' slowest acks: some work is left over and delivered again.
        "leases": {"ttl_ms": 2000, "renew_ms": 500, "claim_interval_ms": 100, "handoff_drain_ms": 300},
        "topics": {topic: {"queues": QUEUES} for topic in TOPICS},
        "groups": groups,
        **extra,
    }


def config(redis_url: str, groups: dict[str, Any], **extra: Any) -> ProxyConfig:
    return parse(raw_config(redis_url, groups, **extra))


class Load:
    """A producer writing ``body(key, seq)`` to every topic, and one puller per group acking all it
    gets (one batch in 20 only after 0.5 s, so some work is in flight at every change). Each
    (group, topic) has its own OrderChecker; its epoch is the TopicConsumer that delivered (a
    replaced or re-added consumer may replay from the committed offset, nothing else may)."""

    def __init__(self, service: ProxyService, redis_url: str, groups: list[str]) -> None:
        self.service = service
        self.redis_url = redis_url
        self.produced: dict[str, dict[str, int]] = {topic: {} for topic in TOPICS}
        self.checkers: dict[tuple[str, str], OrderChecker] = defaultdict(OrderChecker)
        self.acked: dict[tuple[str, str], set[tuple[int, int]]] = defaultdict(set)
        self.consumers_seen: dict[tuple[str, str], list[object]] = defaultdict(list)
        self.unknown_group = 0
        self.largest_batch: dict[tuple[str, str], int] = defaultdict(int)
        self._producing = True
        self._pulling = True
        self._rng = random.Random(11)
        self._late_acks: set[asyncio.Task[None]] = set()
        self._tasks = [asyncio.create_task(self._produce())]
        self._tasks += [asyncio.create_task(self._pull(group)) for group in groups]

    async def _produce(self) -> None:
        rng = random.Random(7)
        async with AsyncProducer(self.redis_url) as producer:
            while self._producing:
                for topic in TOPICS:
                    batch = []
                    for _ in range(10):
                        key = f"key-{rng.randrange(KEYS)}"
                        seq = self.produced[topic].get(key, 0)
                        self.produced[topic][key] = seq + 1
                        batch.append({"key": key, "value": body(key, seq)})
                    await producer.send_batch(topic, batch)
                await asyncio.sleep(0.02)

    async def _pull(self, group: str) -> None:
        results: list[QueueResult] = []
        while self._pulling:
            try:
                batch = await self.service.api.pull(group, None, 32, 100, results)
            except UnknownGroupError:
                self.unknown_group += 1
                results = []  # applied before the error was raised (or unknown, then redelivered)
                await asyncio.sleep(0.02)
                continue
            results = []
            if batch.queue is None:
                continue
            topic, qid = batch.queue.topic, batch.queue.qid
            pair = (group, topic)
            consumer = self.service.groups[group].consumers[topic]
            seen = self.consumers_seen[pair]
            if not any(c is consumer for c in seen):
                seen.append(consumer)
            epoch = next(i for i, c in enumerate(seen) if c is consumer)
            checker = self.checkers[pair]
            self.largest_batch[pair] = max(self.largest_batch[pair], len(batch.messages))
            for message in batch.messages:
                event = json.loads(message.value)
                checker.delivered(event["k"], event["seq"], epoch)
                checker.acked(event["k"], event["seq"], epoch)
                self.acked[pair].add((qid, message.offset))
            results = [QueueResult(group, topic, str(qid), [m.offset for m in batch.messages], [])]
            if self._rng.random() < 0.05:
                task = asyncio.create_task(self._ack_late(results))
                self._late_acks.add(task)
                task.add_done_callback(self._late_acks.discard)
                results = []
        if results:
            await self.service.api.submit(results)

    async def _ack_late(self, results: list[QueueResult]) -> None:
        await asyncio.sleep(0.5)
        await self.service.api.submit(results)

    def delivered(self, group: str, topic: str) -> int:
        return self.checkers[(group, topic)].deliveries

    async def finish(self, pairs: list[tuple[str, str]], timeout_s: float = 60) -> None:
        """Stop producing; wait until every pair acked every produced message; stop pulling."""
        self._producing = False
        await self._tasks[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while any(self.checkers[p].missing(self.produced[p[1]]) for p in pairs):
                for task in self._tasks[1:]:  # a puller that died says why, rather than leave its group stuck
                    if task.done() and not task.cancelled() and task.exception() is not None:
                        raise AssertionError("a puller failed") from task.exception()
                if loop.time() > deadline:
                    missing = {p: list(self.checkers[p].missing(self.produced[p[1]]).items())[:3] for p in pairs}
                    raise AssertionError(f"not everything was delivered: {missing}")
                await asyncio.sleep(0.05)
        finally:
            await self.stop()
        for pair in pairs:
            assert self.checkers[pair].violations == [], (pair, self.checkers[pair].violations[:5])

    async def stop(self) -> None:
        self._producing = self._pulling = False
        await asyncio.gather(*self._tasks, *self._late_acks, return_exceptions=True)


async def until(predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        outcome = predicate()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def assert_released(redis: aioredis.Redis, load: Load, group: str, topic: str) -> None:
    """The removed (group, topic) holds no lease, and no committed offset passes an unacked message."""
    for qid in range(QUEUES):
        assert await redis.get(keys.lease(group, topic, qid)) is None, f"{group}/{topic}#{qid} still leased"
        committed = int(await redis.get(keys.committed(group, topic, qid)) or 1)
        unacked = [o for o in range(1, committed) if (qid, o) not in load.acked[(group, topic)]]
        assert unacked == [], f"{group}/{topic}#{qid}: committed {committed} past unacked offsets {unacked[:5]}"


# ---------------------------------------------------------------------------------------------------


def test_diff_sorts_changes_by_what_they_need(redis_url: str) -> None:
    old = config(redis_url, {"g1": {"t1": ORDERED, "t2": ORDERED}, "g2": {"t1": ORDERED}})
    new = config(
        redis_url,
        {
            "g1": {"t1": {**ORDERED, "concurrency": 5, "max_tps": 100}, "t2": {**ORDERED, "order_key": "KEY"}},
            "g3": {"t2": ORDERED},
        },
        thrift={"port": 1234},
        commit_interval_ms=70,
    )
    change = diff(old, new)
    assert change.added == (("g3", "t2"),)
    assert change.removed == (("g2", "t1"),)
    assert change.updated == (("g1", "t1"),)
    assert change.restarted == (("g1", "t2"),)
    assert change.needs_restart == ("commit_interval_ms", "thrift")
    assert "added g3/t2" in change.describe() and "restarted g1/t2" in change.describe()
    assert diff(old, old) == ConfigChange() and diff(old, old).empty
    # metrics is read at each scrape: it changes live, and is the whole change here
    per_queue = old.model_copy(update={"metrics": old.metrics.model_copy(update={"per_queue": True})})
    assert diff(old, per_queue) == ConfigChange(metrics=True) and diff(old, per_queue).describe() == "metrics"


def assert_committers_of_the_consumers(service: ProxyService) -> None:
    """The service's committer writes for exactly the consumers the groups have now."""
    serving = [c.commits for group in service.groups.values() for c in group.consumers.values()]
    on_board = service.registry.commit_board.committers()
    assert len(on_board) == len(serving) and set(on_board) == set(serving)


async def test_groups_and_topics_added_and_removed_under_load_lose_nothing(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    service = ProxyService(config(redis_url, {"g1": {"t1": ORDERED}}))
    await service.start()
    load = Load(service, redis_url, ["g1", "g2"])
    try:
        await until(lambda: load.delivered("g1", "t1") > 300)
        assert load.unknown_group > 0  # g2 is not served yet

        # Add a topic to g1 and a whole group g2.
        change = await service.reload(config(redis_url, {"g1": {"t1": ORDERED, "t2": ORDERED}, "g2": {"t1": ORDERED}}))
        assert change.added == (("g1", "t2"), ("g2", "t1"))
        await until(lambda: load.delivered("g1", "t2") > 300 and load.delivered("g2", "t1") > 300)

        # Remove g1/t2 and all of g2 while messages keep coming.
        change = await service.reload(config(redis_url, {"g1": {"t1": ORDERED}}))
        assert change.removed == (("g1", "t2"), ("g2", "t1"))
        assert "g2" not in service.groups and set(service.groups["g1"].consumers) == {"t1"}
        assert_committers_of_the_consumers(service)
        with pytest.raises(UnknownGroupError):
            await service.api.pull("g2", None, 10, 0, [])
        with pytest.raises(UnknownTopicError):
            await service.api.pull("g1", "t2", 10, 0, [])
        await assert_released(redis_client, load, "g1", "t2")
        await assert_released(redis_client, load, "g2", "t1")
        assert await redis_client.zscore(keys.members("g2"), "reload-proxy") is None
        assert await redis_client.zscore(keys.members("g1"), "reload-proxy") is not None  # g1 still consumes t1
        produced_before = sum(load.produced["t1"].values())
        await until(lambda: sum(load.produced["t1"].values()) > produced_before + 500)  # g2 misses these

        # Bring both back: they resume from their commits, and in the end everything arrives in order.
        await service.reload(config(redis_url, {"g1": {"t1": ORDERED, "t2": ORDERED}, "g2": {"t1": ORDERED}}))
        await load.finish([("g1", "t1"), ("g1", "t2"), ("g2", "t1")])
        assert len(load.consumers_seen[("g2", "t1")]) == 2 and len(load.consumers_seen[("g1", "t2")]) == 2
        assert_committers_of_the_consumers(service)
    finally:
        await load.stop()
        await service.close()


async def test_removing_a_group_answers_parked_pulls_and_counts_acks_during_its_drain(redis_url: str) -> None:
    service = ProxyService(
        config(
            redis_url,
            {"g1": {"t1": ORDERED}, "g2": {"t2": ORDERED}},
            leases={"ttl_ms": 2000, "renew_ms": 500, "claim_interval_ms": 100, "handoff_drain_ms": 60_000},
        )
    )
    await service.start()
    try:
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t1", body("a", 0), key="a")
            await producer.send("t1", body("c", 0), key="c")
            await producer.send("t2", body("b", 0), key="b")
        held = {group: await service.api.pull(group, None, 1, 5000, []) for group in ("g1", "g2")}
        assert all(len(batch.messages) == 1 for batch in held.values())
        await until(lambda: service.groups["g1"].buffer.ready == 1)  # the other t1 message
        parked = asyncio.create_task(service.api.pull("g2", None, 10, 30_000, []))
        await asyncio.sleep(0.1)
        assert not parked.done()

        # g1 stops consuming t1 (and starts t2 from its end); g2 goes away.
        latest = {**ORDERED, "start_from": "latest"}
        reload = asyncio.create_task(service.reload(config(redis_url, {"g1": {"t2": latest}})))
        # The parked long poll of the removed group is answered (empty) long before its 30 s linger.
        assert (await asyncio.wait_for(parked, 10)).messages == []
        await until(lambda: "t1" in service.groups["g1"].retiring and service.groups["g2"].removed)
        with pytest.raises(UnknownTopicError):
            await service.api.pull("g1", "t1", 10, 0, [])
        # What the removed topic had read but not handed out stays put (for its next consumer).
        assert (await service.api.pull("g1", None, 10, 200, [])).messages == []
        with pytest.raises(UnknownGroupError):
            await service.api.pull("g2", None, 10, 0, [])
        # The clients ack what they hold with their next pulls, which fail: the acks still count, and
        # they end the drain (60 s otherwise).
        acks = {}
        for (group, topic), error in [(("g1", "t1"), UnknownTopicError), (("g2", "t2"), UnknownGroupError)]:
            batch = held[group]
            assert batch.queue is not None
            acks[(group, topic)] = (batch.queue.qid, batch.messages[0].offset)
            ack = QueueResult(group, topic, str(batch.queue.qid), [batch.messages[0].offset], [])
            with pytest.raises(error):
                await service.api.pull(group, topic, 10, 0, [ack])
        change = await asyncio.wait_for(reload, 30)
        assert change.removed == (("g1", "t1"), ("g2", "t2")) and change.added == (("g1", "t2"),)
        assert "g2" not in service.groups
        async with aioredis.Redis.from_url(redis_url) as redis:
            for (group, topic), (qid, offset) in acks.items():
                assert int(await redis.get(keys.committed(group, topic, qid))) == offset + 1, (group, topic)
    finally:
        await service.close()


async def test_changed_settings_take_effect_without_loss(redis_url: str) -> None:
    """concurrency changes in place (same consumer); order_key restarts the consumer (drain, commit,
    resume). Both under load, with every message delivered in key order."""
    strict = {**ORDERED, "order_key": "QID", "concurrency": 2}
    service = ProxyService(config(redis_url, {"g1": {"t1": strict, "t2": {**ORDERED, "concurrency": 2}}}))
    await service.start()
    load = Load(service, redis_url, ["g1"])
    try:
        await until(lambda: load.delivered("g1", "t1") > 100 and load.delivered("g1", "t2") > 100)
        assert load.largest_batch[("g1", "t2")] <= 2 and load.largest_batch[("g1", "t1")] == 1
        t2_consumer = service.groups["g1"].consumers["t2"]

        change = await service.reload(
            config(
                redis_url,
                {"g1": {"t1": {**ORDERED, "concurrency": 200}, "t2": {**ORDERED, "concurrency": 200, "max_tps": 5000}}},
            )
        )
        assert change.updated == (("g1", "t2"),) and change.restarted == (("g1", "t1"),)
        assert service.groups["g1"].consumers["t2"] is t2_consumer  # in place
        assert t2_consumer.limiter is not None and t2_consumer.limiter.rate == 5000
        assert service.groups["g1"].consumers["t1"].config.order_key == "$.k"
        assert_committers_of_the_consumers(service)  # the replaced consumer's committer left the board
        # QID let one message of a queue out at a time; per-key order lets several; 200 > 2 in flight.
        await until(lambda: load.largest_batch[("g1", "t1")] > 1 and load.largest_batch[("g1", "t2")] > 2)
        await load.finish([("g1", "t1"), ("g1", "t2")])
        assert len(load.consumers_seen[("g1", "t1")]) == 2 and len(load.consumers_seen[("g1", "t2")]) == 1
    finally:
        await load.stop()
        await service.close()


async def test_invalid_configs_are_rejected_and_the_old_one_keeps_serving(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "proxy.yaml"
    good = raw_config(redis_url, {"g1": {"t1": ORDERED}})
    path.write_text(yaml.safe_dump(good))
    service = ProxyService(config(redis_url, {"g1": {"t1": ORDERED}}))
    await service.start()
    reloader = ConfigReloader(service.reload, path)
    load = Load(service, redis_url, ["g1"])
    try:
        running = service.config
        bad_field = raw_config(redis_url, {"g1": {"t1": {**ORDERED, "timeout_ms": "soon"}}, "g2": {"t1": ORDERED}})
        bad_queues = {
            **raw_config(redis_url, {"g1": {"t1": ORDERED}, "g2": {"t1": ORDERED}}),
            "topics": {"t1": {"queues": QUEUES + 1}},
        }
        for text, reason in [
            (yaml.safe_dump(bad_field), "groups.g1.t1.timeout_ms"),
            ("groups: [unclosed", "not valid YAML"),
            (yaml.safe_dump(bad_queues), "topics.t1.queues"),
        ]:
            path.write_text(text)
            caplog.clear()
            with caplog.at_level(logging.ERROR, logger="ddmq.proxy.ops.reload"):
                assert await reloader.reload() is None
            assert any("rejected" in r.message and reason in r.message for r in caplog.records), caplog.text
            assert service.config is running and set(service.groups) == {"g1"}
            before = load.delivered("g1", "t1")
            await until(lambda before=before: load.delivered("g1", "t1") > before)  # still serving
        path.write_text(yaml.safe_dump(raw_config(redis_url, {"g1": {"t1": ORDERED}, "g2": {"t1": ORDERED}})))
        change = await reloader.reload()
        assert change is not None and change.added == (("g2", "t1"),)
        await load.finish([("g1", "t1")])
    finally:
        await load.stop()
        await service.close()
    with pytest.raises(ConfigError):
        parse(raw_config(redis_url, {"g1": {}}))  # a group with no topic is refused outright


async def test_file_watch_and_process_level_fields(
    redis_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(raw_config(redis_url, {"g1": {"t1": ORDERED}})))
    service = ProxyService(config(redis_url, {"g1": {"t1": ORDERED}}))
    await service.start()
    reloader = ConfigReloader(service.reload, path, watch_interval_ms=50)
    reloader.start()
    try:
        port = service.config.thrift.port
        with caplog.at_level(logging.INFO, logger="ddmq.proxy"):
            path.write_text(
                yaml.safe_dump(
                    raw_config(redis_url, {"g1": {"t1": ORDERED}, "g2": {"t2": ORDERED}}, thrift={"port": 1})
                )
            )
            await until(lambda: "g2" in service.groups)
            await until(lambda: any("config reloaded" in r.message for r in caplog.records))
        assert any("'thrift' changed, which needs a restart" in r.message for r in caplog.records)
        assert service.config.thrift.port == port and set(service.config.groups) == {"g1", "g2"}
    finally:
        await reloader.close()
        await service.close()


def test_cli_refuses_a_negative_watch_interval(tmp_path: Path, redis_url: str) -> None:
    from ddmq.proxy.cli import main

    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(raw_config(redis_url, {"g1": {"t1": ORDERED}})))
    assert main(["--config", str(path), "--watch-interval-ms", "-1"]) == 2
