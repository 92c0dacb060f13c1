"""A proxy cluster under churn: three proxies share 8 queues while clients pull from all of them; one
is killed with SIGKILL mid-stream, a fourth joins, one is stopped gracefully.

Checked over the whole run:
- every produced message is acked, and committed offsets end equal to produce offsets;
- per-key order: no message is delivered before its key's predecessor was acked, and within one lease
  term a key is only ever redelivered from its current head (a new term may replay from the
  committed point: that is the at-least-once cost of a move);
- no queue ever had two readers: every proxy records its stream reads with its lease term
  (``audit_log``); each term has one owner, and a term's reads all precede the next term's.
"""

from __future__ import annotations

import asyncio
import functools
import random
import threading
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.redis import keys

from ..support import (
    Delivery,
    ProxyFleet,
    acked_prefixes,
    check_order_by_term,
    check_single_reader,
    produce_keyed,
    puller,
)

QUEUES = 8
KEYS = 1200
MESSAGES = 60_000
PRE_PRODUCED = 10_000
LEASES = {"ttl_ms": 1500, "renew_ms": 400, "claim_interval_ms": 100, "handoff_drain_ms": 1500}
GROUP = {"order_key": "KEY", "timeout_ms": 3000, "max_retry": 50, "retry_intervals_ms": [20, 100]}
FAIL_RATE = 0.01
PULLERS_PER_PROXY = 2


produce = functools.partial(produce_keyed, keys=KEYS, key_prefix="rider-", queues=QUEUES)


@pytest.mark.timeout(300)
async def test_three_proxies_kill_join_and_stop_lose_nothing_and_keep_every_key_in_order(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    rng = random.Random(11)
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce, redis_url, PRE_PRODUCED, produced, rng)
    cluster = ProxyFleet(tmp_path, redis_url, {"g": {"t": GROUP}}, {"t": {"queues": QUEUES}}, LEASES)
    log: list[Delivery] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def add_pullers(name: str) -> None:
        port = cluster.proxies[name].port
        for i in range(PULLERS_PER_PROXY):
            rng = random.Random(f"{name}{i}")
            tasks.append(asyncio.create_task(puller(name, port, log, stop, rng, fail_rate=FAIL_RATE)))

    async def wait_for_acks(count: int, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while sum(d.acked for d in log) < count:
            assert time.monotonic() < deadline, f"stuck at {sum(d.acked for d in log)} acks (waiting for {count})"
            await asyncio.sleep(0.05)

    try:
        for name in ("proxy-1", "proxy-2", "proxy-3"):
            await asyncio.to_thread(cluster.start, name)
            add_pullers(name)
        # The rest arrives steadily through the whole run, so every event below happens mid-stream.
        rest = threading.Thread(target=produce, args=(redis_url, MESSAGES - PRE_PRODUCED, produced, random.Random(12)),
                                kwargs={"pause_s": 0.1})
        rest.start()
        await wait_for_acks(15_000)
        cluster.proxies["proxy-2"].kill()  # SIGKILL mid-stream: its queues move once its leases expire
        await wait_for_acks(30_000)
        await asyncio.to_thread(cluster.start, "proxy-4")  # joins: the others hand queues over
        add_pullers("proxy-4")
        await wait_for_acks(45_000)
        assert await asyncio.to_thread(cluster.proxies["proxy-1"].stop) == 0  # graceful: drains, releases
        await asyncio.to_thread(rest.join)
        # Drain: until every key's last message was acked.
        deadline = time.monotonic() + 120
        while acked_prefixes(log) != produced:
            assert time.monotonic() < deadline, "not every message was acked"
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.gather(*tasks)
        for name in ("proxy-3", "proxy-4"):
            assert await asyncio.to_thread(cluster.proxies[name].stop) == 0
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for proxy in cluster.proxies.values():
            proxy.stop()

    # Nothing lost: committed offsets reached the end of every queue.
    produce_next = [int(await redis_client.get(keys.sequence("t", q)) or 0) + 1 for q in range(QUEUES)]
    committed = [int(await redis_client.get(keys.committed("g", "t", q)) or 0) for q in range(QUEUES)]
    assert committed == produce_next

    # No two readers, ever.
    records = cluster.reads()
    moves = check_single_reader(records)
    assert moves >= 3, "the churn should have moved queues (kill, join, stop)"

    # Per-key order across the whole run, with each delivery's epoch = the lease term it was read under.
    checker = check_order_by_term(records, log)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    assert sum(produced.values()) == MESSAGES and len(produced) >= 1000
    print(f"\ncluster churn: {MESSAGES} messages, {len(produced)} keys, {len(log)} deliveries, "
          f"{checker.duplicates} redelivered, {moves} queue moves, {len(records)} reads audited")
