"""A burst of one key ahead of 1,000 other keys, through real proxy processes and a Thrift client, with
the default ``concurrency`` and ``key_buffer``: the other keys (in the burst's queue and in the topic's
other queue) are all done within the first 10 % of the burst's drain; then the proxy is killed with -9
mid-burst and restarted, and every message arrives, each key in order, with the committed offsets at
the end of every queue. Four times the default window one message per pull, and twenty times the
window in ordered runs with work on the hot key, keyed by ``$.rider_id``, through a kill -9 and a
hand-off to a second proxy."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ddmq.client import Producer
from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys

from ..support import OrderChecker, ProxyProcess, body, check_and_ack

HOT = "hot"
BURST = 4_000  # four times the default concurrency (1,000), forty times the default key_buffer (100)
BIG_BURST = 20_000  # twenty times the default concurrency
OTHERS = 1_000
HOT_WORK_S = 0.0005  # the client's work per hot message
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100}


def produce(redis_url: str, produced: dict[str, int], burst: int = BURST, *, riders: bool = False) -> list[int]:
    """The burst in queue 0, then the other keys, half in queue 0 and half in queue 1; returns the
    last offset of each queue. With ``riders`` the bodies name their key as ``rider_id`` too and the
    message keys are others, so that only ordering by ``$.rider_id`` keeps each key in order."""
    def message(key: str, qid: int) -> dict[str, object]:
        seq = produced.get(key, 0)
        produced[key] = seq + 1
        if not riders:
            return {"key": key, "value": body(key, seq), "qid": qid}
        value = json.dumps({"k": key, "seq": seq, "rider_id": key})
        return {"key": f"m{seq % 7}", "value": value, "qid": qid}

    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 2)
        for start in range(0, burst, 500):
            producer.send_batch("t", [message(HOT, 0) for _ in range(min(500, burst - start))])
        producer.send_batch("t", [message(f"k{i}", i % 2) for i in range(OTHERS)])
    return [burst + OTHERS // 2, OTHERS // 2]


def shows_the_held_burst(redis_url: str, http_url: str) -> int:
    """The admin API and ``ddmq status --http`` both show one key at its cap and its messages held in
    Redis, all in queue 0; returns how many are held."""
    with urllib.request.urlopen(http_url + "/admin/groups/g", timeout=30) as answer:
        view = json.load(answer)
    (topic,) = view["topics"]
    rows = {row["qid"]: row for row in view["queues"]}
    held = topic["held_in_redis"]
    assert (topic["keys_at_cap"], rows[0]["keys_at_cap"], rows[1]["keys_at_cap"]) == (1, 1, 0), view
    assert (rows[0]["held_in_redis"], rows[1]["held_in_redis"]) == (held, 0), view
    env = {**os.environ, "DDMQ_REDIS": redis_url}
    env.pop("DDMQ_ADMIN_TOKEN", None)
    status = subprocess.run([sys.executable, "-m", "ddmq.client.cli", "status", "--group", "g", "--http", http_url],
                            capture_output=True, text=True, timeout=60, env=env, check=True)
    assert f"t: 1 key(s) at their key_buffer cap, {held:,} message(s) held in Redis to read again (#0: {held:,})" \
        in status.stdout, status.stdout
    return int(held)


async def pull_until(client: AsyncProxyClient, checker: OrderChecker, epoch: int, produced: dict[str, int],
                     done: Callable[[], bool], timeout_s: float, *, max_per_key: int | None = None,
                     hot_work_s: float = 0.0) -> None:
    """Pull and ack (piggy-backed) until ``done()`` or everything produced is acked; the last acks go
    in a submit. ``max_per_key`` asks for ordered runs; each hot message costs ``hot_work_s``."""
    pending: list[wire.ConsumeResult] = []
    deadline = time.monotonic() + timeout_s
    while checker.missing(produced) and not done():
        assert time.monotonic() < deadline, f"not drained: {list(checker.missing(produced).items())[:5]}"
        response = await client.pull(wire.PullRequest(
            groupId="g", topic="t", maxBatchSize=64, maxLingerTime=200, result=wire.link_results(pending),
            maxPerKey=max_per_key))
        if hot_work_s:
            hot = sum(1 for message in response.messages if json.loads(message.value)["k"] == HOT)
            await asyncio.sleep(hot * hot_work_s)
        pending = check_and_ack(response, checker, epoch)
    if pending:
        await client.submit(wire.link_results(pending))


async def all_delivered_in_order(checker: OrderChecker, produced: dict[str, int], redis_client: aioredis.Redis,
                                  ends: list[int]) -> None:
    """Every key in order, every produced message acked, and group g's committed offsets of topic t at
    the end of each queue."""
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    await until_committed(redis_client, ends)


async def until_committed(redis_client: aioredis.Redis, ends: list[int], timeout_s: float = 30) -> None:
    """Until group g's committed offsets of topic t are one past each queue's last offset in ``ends``."""
    async def committed() -> list[int]:
        return [int(raw or 0) for raw in await redis_client.mget([keys.committed("g", "t", q)
                                                                   for q in range(len(ends))])]

    deadline = time.monotonic() + timeout_s
    while await committed() != [end + 1 for end in ends]:
        assert time.monotonic() < deadline, f"committed {await committed()}, produced up to {ends}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("order_key", ["KEY", "$.k"])
async def test_a_burst_of_one_key_through_a_kill_9_holds_back_no_other_key_and_loses_nothing(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path, order_key: str
) -> None:
    produced: dict[str, int] = {}
    ends = produce(redis_url, produced)
    others = {key: n for key, n in produced.items() if key != HOT}
    checker = OrderChecker()
    config = {"actions": ["Json", "Order", "PullServer"], "order_key": order_key}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port()}
    proxy = ProxyProcess(tmp_path, redis_url, {"g": {"t": config}}, {"t": {"queues": 2}}, leases=LEASES,
                         http=http).start()
    try:
        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            await pull_until(client, checker, 1, produced, lambda: not checker.missing(others), 120)
        hot_done = checker.acked_upto.get(HOT, 0)
        assert hot_done <= BURST // 10, f"the other keys were done after {hot_done} of the burst"
        # Nobody pulls now, so nothing drains: what the operator sees of the burst held in Redis.
        held = shows_the_held_burst(redis_url, f"http://127.0.0.1:{http['port']}")
        assert BURST // 2 < held < BURST, held
        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            await pull_until(client, checker, 1, produced, lambda: checker.acked_upto.get(HOT, 0) >= BURST // 4, 120)
        proxy.kill()  # mid-burst: most of it held in Redis, the commit point at the hot key's head
        proxy.start()
        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            await pull_until(client, checker, 2, produced, lambda: False, 180)
        await all_delivered_in_order(checker, produced, redis_client, ends)
        assert proxy.stop() == 0
    finally:
        proxy.stop()


@pytest.mark.timeout(300)
async def test_a_burst_of_twenty_windows_in_ordered_runs_through_a_kill_9_and_a_hand_off_loses_nothing(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    """20,000 messages of rider ``hot`` (0.5 ms of the client's work each) ahead of 1,000 other riders,
    ``order_key: $.rider_id``, a client asking for runs of up to 64: the others are done within the
    first 10 % of the burst; proxy A is killed with -9 mid-burst and restarted, proxy B joins, A stops
    (its queues hand off to B mid-burst), and B's client drains the rest."""
    produced: dict[str, int] = {}
    ends = produce(redis_url, produced, BIG_BURST, riders=True)
    others = {key: n for key, n in produced.items() if key != HOT}
    checker = OrderChecker()
    groups = {"g": {"t": {"actions": ["Json", "Order", "PullServer"], "order_key": "$.rider_id"}}}
    topics = {"t": {"queues": 2}}
    a = ProxyProcess(tmp_path / "a", redis_url, groups, topics, leases=LEASES, instance_id="proxy-a").start()
    b = ProxyProcess(tmp_path / "b", redis_url, groups, topics, leases=LEASES, instance_id="proxy-b")
    runs = {"max_per_key": 64, "hot_work_s": HOT_WORK_S}

    def hot_acked() -> int:
        return checker.acked_upto.get(HOT, 0)

    try:
        async with AsyncProxyClient("127.0.0.1", a.port) as client:
            await pull_until(client, checker, 1, produced, lambda: not checker.missing(others), 120, **runs)
        print(f"the other keys were done after {hot_acked():,} of the burst's {BIG_BURST:,}")
        assert hot_acked() <= BIG_BURST // 10, f"the other keys were done after {hot_acked()} of the burst"
        async with AsyncProxyClient("127.0.0.1", a.port) as client:
            await pull_until(client, checker, 1, produced, lambda: hot_acked() >= BIG_BURST // 4, 120, **runs)
        a.kill()  # mid-burst, most of it held in Redis
        a.start()
        async with AsyncProxyClient("127.0.0.1", a.port) as client:
            await pull_until(client, checker, 2, produced, lambda: hot_acked() >= BIG_BURST // 2, 120, **runs)
        b.start()
        assert a.stop() == 0  # a clean stop: its leases go to B, the hot queue mid-burst
        assert hot_acked() < BIG_BURST
        async with AsyncProxyClient("127.0.0.1", b.port) as client:
            await pull_until(client, checker, 3, produced, lambda: False, 180, **runs)
        await all_delivered_in_order(checker, produced, redis_client, ends)
        assert b.stop() == 0
    finally:
        a.stop()
        b.stop()
