"""Live configuration of a real ``ddmq-proxy`` process: the config file is rewritten and the process
gets SIGHUP while a producer writes and Thrift clients pull. A group added starts delivering, an
invalid file is rejected with its reason while the old config keeps serving, a group removed and
added back loses nothing and keeps every key in order, and no queue ever has two readers. Two
proxies take a group added and removed one after the other (a rolling change): its queues spread
and move between them with nothing lost, every key in order by lease term."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import yaml

from ddmq.client.thrift_client import AsyncProxyClient, PullError
from ddmq.protocol import wire
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys
from ddmq.proxy.core.errors import UnknownGroupError

from ..support import (
    Delivery,
    OrderChecker,
    ProxyProcess,
    acked_prefixes,
    body,
    check_order_by_term,
    check_single_reader,
)
from .test_cluster import QUEUES as CLUSTER_QUEUES
from .test_cluster import produce, puller

QUEUES = 4
KEYS = 50
ORDERED = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 3000}
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100, "handoff_drain_ms": 1000}


class ThriftLoad:
    """A producer on topic ``t`` and one Thrift puller per group. A puller's epoch moves on when
    its group turns unknown: the group's next incarnation may replay from its committed offsets."""

    def __init__(self, port: int, redis_url: str, groups: list[str]) -> None:
        self.port = port
        self.redis_url = redis_url
        self.produced: dict[str, int] = {}
        self.checkers: dict[str, OrderChecker] = defaultdict(OrderChecker)
        self.unknown: dict[str, int] = defaultdict(int)
        self._running = True
        self._producing = True
        self._tasks = [asyncio.create_task(self._produce())]
        self._tasks += [asyncio.create_task(self._pull(group)) for group in groups]

    async def _produce(self) -> None:
        rng = random.Random(3)
        async with AsyncProducer(self.redis_url) as producer:
            while self._producing:
                batch = []
                for _ in range(10):
                    key = f"key-{rng.randrange(KEYS)}"
                    seq = self.produced.get(key, 0)
                    self.produced[key] = seq + 1
                    batch.append({"key": key, "value": body(key, seq)})
                await producer.send_batch("t", batch)
                await asyncio.sleep(0.02)

    async def _pull(self, group: str) -> None:
        checker = self.checkers[group]
        epoch, served = 0, False
        pending: list[wire.ConsumeResult] = []
        async with AsyncProxyClient("127.0.0.1", self.port) as client:
            while self._running:
                request = wire.PullRequest(
                    groupId=group, maxBatchSize=32, maxLingerTime=200, result=wire.link_results(pending)
                )
                try:
                    response = await client.pull(request)
                except PullError as exc:
                    assert exc.code == UnknownGroupError.code, exc
                    self.unknown[group] += 1
                    if served:  # the incarnation that served us is gone; a later one starts anew
                        epoch, served = epoch + 1, False
                    await asyncio.sleep(0.05)
                    continue  # like PullConsumer: the results ride on the next pull again
                pending.clear()
                if not response.messages:
                    continue
                served = True
                for message in response.messages:
                    event = json.loads(message.value)
                    checker.delivered(event["k"], event["seq"], epoch)
                    checker.acked(event["k"], event["seq"], epoch)
                pending.append(
                    wire.ConsumeResult(
                        context=response.context,
                        successOffsets=[m.offset for m in response.messages],
                        failOffsets=[],
                    )
                )
            if pending:
                await client.submit(wire.link_results(pending))

    async def finish(self, groups: list[str], timeout_s: float = 60) -> None:
        self._producing = False
        await self._tasks[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while any(self.checkers[g].missing(self.produced) for g in groups):
                assert loop.time() < deadline, {
                    g: list(self.checkers[g].missing(self.produced).items())[:3] for g in groups
                }
                await asyncio.sleep(0.05)
        finally:
            await self.stop()
        for group in groups:
            assert self.checkers[group].violations == [], (group, self.checkers[group].violations[:5])

    async def stop(self) -> None:
        self._producing = self._running = False
        await asyncio.gather(*self._tasks)


def rewrite(proxy: ProxyProcess, base: dict[str, Any], groups: dict[str, Any]) -> None:
    """Write the config ``base`` with new ``groups`` and send SIGHUP."""
    proxy.config_path.write_text(yaml.safe_dump({**base, "groups": groups}))
    assert proxy.proc is not None
    proxy.proc.send_signal(signal.SIGHUP)


async def until(predicate: Any, timeout_s: float = 30) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def log_count(proxy: ProxyProcess, text: str) -> int:
    return proxy.log_path.read_text(errors="replace").count(text) if proxy.log_path.exists() else 0


async def test_sighup_adds_removes_and_rejects_under_load(redis_url: str, tmp_path: Path) -> None:
    proxy = ProxyProcess(
        tmp_path,
        redis_url,
        {"g1": {"t": ORDERED}},
        {"t": {"queues": QUEUES}},
        instance_id="proxy-r",
        leases=LEASES,
        audit_log=str(tmp_path / "reads.jsonl"),
    ).start()
    base = yaml.safe_load(proxy.config_path.read_text())
    load = ThriftLoad(proxy.port, redis_url, ["g1", "g2"])
    try:
        await until(lambda: load.checkers["g1"].deliveries > 200 and load.unknown["g2"] > 0)

        rewrite(proxy, base, {"g1": {"t": ORDERED}, "g2": {"t": ORDERED}})
        await until(lambda: load.checkers["g2"].deliveries > 200)
        assert log_count(proxy, "config reloaded: added g2/t") == 1

        rewrite(proxy, base, {"g1": {"t": {**ORDERED, "max_retry": -1}}, "g3": {"t": ORDERED}})
        await until(lambda: log_count(proxy, "config reload rejected") == 1)
        assert log_count(proxy, "groups.g1.t.max_retry") == 1, proxy.log()
        served = {g: load.checkers[g].deliveries for g in ("g1", "g2")}
        await until(lambda: all(load.checkers[g].deliveries > served[g] + 100 for g in served))  # old config

        unknown = load.unknown["g2"]
        rewrite(proxy, base, {"g1": {"t": ORDERED}})
        await until(lambda: log_count(proxy, "config reloaded: removed g2/t") == 1)
        assert load.unknown["g2"] > unknown
        async with aioredis.Redis.from_url(redis_url) as redis:
            assert [await redis.get(keys.lease("g2", "t", qid)) for qid in range(QUEUES)] == [None] * QUEUES
            assert await redis.zscore(keys.members("g2"), "proxy-r") is None
        produced = sum(load.produced.values())
        await until(lambda: sum(load.produced.values()) > produced + 500)  # g2 misses these meanwhile

        rewrite(proxy, base, {"g1": {"t": ORDERED}, "g2": {"t": ORDERED}})
        await load.finish(["g1", "g2"])
        assert log_count(proxy, "config reloaded") == 3
    finally:
        await load.stop()
        assert proxy.stop() == 0, proxy.log()
    # The re-added group read each queue under a new lease term, only after the old term's last read.
    records = [json.loads(line) for line in (tmp_path / "reads.jsonl").read_text().splitlines()]
    assert check_single_reader([r for r in records if r["group"] == "g2"]) >= QUEUES
    check_single_reader([r for r in records if r["group"] == "g1"])


async def test_rolling_add_and_remove_of_a_group_across_two_proxies(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    group = {"order_key": "KEY", "timeout_ms": 3000, "max_retry": 50, "retry_intervals_ms": [20, 100]}
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce, redis_url, 4000, produced, random.Random(21))
    proxies: dict[str, ProxyProcess] = {}
    bases: dict[str, dict[str, Any]] = {}
    for name in ("proxy-a", "proxy-b"):
        (tmp_path / name).mkdir()
        proxies[name] = ProxyProcess(
            tmp_path / name,
            redis_url,
            {"other": {"t": group}},
            {"t": {"queues": CLUSTER_QUEUES}},
            instance_id=name,
            leases=LEASES,
            audit_log=str(tmp_path / name / "reads.jsonl"),
        ).start()
        bases[name] = yaml.safe_load(proxies[name].config_path.read_text())
    deliveries: list[Delivery] = []
    stop = asyncio.Event()
    pullers = [
        asyncio.create_task(puller(name, proxy.port, deliveries, stop, random.Random(name)))
        for name, proxy in proxies.items()
    ]
    removed = threading.Event()

    def produce_until_removed_and_after() -> None:
        """Batches of 200 every 0.1 s until A has removed "g", then 10 more: the changes happen mid-stream."""
        rng, after = random.Random(22), 10
        while after:
            produce(redis_url, 200, produced, rng)
            time.sleep(0.1)
            after -= removed.is_set()

    later = threading.Thread(target=produce_until_removed_and_after)

    async def acked_at_least(count: int) -> None:
        await until(lambda: sum(d.acked for d in deliveries) >= count, 60)

    try:
        later.start()
        # "g" is added on A (it takes every queue), then on B (A hands half over), then removed from A
        # (A drains and leaves; B takes everything), all while messages keep arriving.
        rewrite(proxies["proxy-a"], bases["proxy-a"], {"other": {"t": group}, "g": {"t": group}})
        await acked_at_least(2000)
        rewrite(proxies["proxy-b"], bases["proxy-b"], {"other": {"t": group}, "g": {"t": group}})
        await acked_at_least(5000)
        rewrite(proxies["proxy-a"], bases["proxy-a"], {"other": {"t": group}})
        await until(lambda: log_count(proxies["proxy-a"], "config reloaded: removed g/t") == 1)
        removed.set()
        await asyncio.to_thread(later.join)
        deadline = time.monotonic() + 60
        while True:
            if acked_prefixes(deliveries) == produced:
                break
            assert time.monotonic() < deadline, "not every message was acked"
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(*pullers, return_exceptions=True)
        for proxy in proxies.values():
            assert proxy.stop() == 0, proxy.log()

    produce_next = [int(await redis_client.get(keys.sequence("t", q)) or 0) + 1 for q in range(CLUSTER_QUEUES)]
    committed = [int(await redis_client.get(keys.committed("g", "t", q)) or 0) for q in range(CLUSTER_QUEUES)]
    assert committed == produce_next
    records = [
        json.loads(line)
        for name in proxies
        for line in (tmp_path / name / "reads.jsonl").read_text().splitlines()
        if json.loads(line)["group"] == "g"
    ]
    assert check_single_reader(records) >= CLUSTER_QUEUES  # B's half moved in, then A's half
    checker = check_order_by_term(records, deliveries)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    assert {d.owner for d in deliveries} == {"proxy-a", "proxy-b"}
    print(f"\nrolling reload: {len(deliveries)} deliveries, {checker.duplicates} redelivered, {len(records)} reads")
