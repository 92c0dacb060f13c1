"""A rolling restart with the default leases (30 s TTL): three proxies share 8 queues holding a
backlog, clients pull from all three (per proxy a bare Thrift client and the project's SDK consumer),
and each proxy in turn is sent SIGTERM and started again under the same instance id, twice round: once
started when the others hold its queues (a hand-off on the stop and one back to it), once started at
once, as a supervisor does. A clean stop and a restart hand queues over without waiting out a lease.

Checked over the whole run: nothing lost (every message acked, committed offsets equal to produce
offsets), every key in order by lease term (the read audit), one reader per term, no message delivered
again after it was acked, and per queue the longest time without a delivery while the restarts ran
(printed with the run's figures: the hand-off's cost, 0.4-1.4 s on an idle host). The check holds it
under :data:`MAX_GAP_S`, a third of the lease TTL: what fails it is a queue waiting out a lease, not a
slow host; bench row P6d measures the same run against the 2 s target (``tests/harness/rolling.py``
holds the run for both).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from tests.harness.rolling import (
    GROUP,
    QUEUES,
    Fleet,
    Pullers,
    backlog,
    longest_gaps,
    produce,
    rolling_restarts,
    served_again,
    served_since,
)

from ..support import (
    Delivery,
    ProxyProcess,
    acked_prefixes,
    check_order_by_term,
    check_single_reader,
    until,
)

MESSAGES = 30_000
#: A queue left to wait out a released lease goes 30 s (the TTL) without a delivery; a hand-off costs
#: about a second, several on a host busy enough to take 15 s to start a proxy. The figure itself is
#: measured by bench row P6d against its target (2 s), not asserted here: timings are not a test's to hold.
MAX_GAP_S = 10.0


@pytest.mark.timeout(240)
async def test_a_rolling_restart_leaves_no_queue_waiting_out_a_lease(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    produced: dict[str, int] = {}
    rng = random.Random(46)
    await asyncio.to_thread(produce, redis_url, MESSAGES, produced, rng)
    fleet = Fleet(tmp_path, redis_url, redis_client)
    log = fleet.pullers.log
    try:
        await fleet.start()
        started, ended = await rolling_restarts(fleet, produced, rng, redis_url)
        left = await backlog(redis_client)
        assert min(left) > 0, f"a queue ran out of backlog during the restarts: {left}"
        fleet.pullers.slow = False
        await until("every message acked", lambda: acked_prefixes(log) == produced, 120)
    finally:
        codes = await fleet.stop()
    assert codes == [0, 0, 0]

    produce_next = [int(await redis_client.get(keys.sequence("t", q)) or 0) + 1 for q in range(QUEUES)]
    committed = [int(await redis_client.get(keys.committed("g", "t", q)) or 0) for q in range(QUEUES)]
    assert committed == produce_next, "lost: committed offsets short of the produced ones"
    records = fleet.reads()
    moves = check_single_reader(records)
    checker = check_order_by_term(records, log)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    gaps = longest_gaps(log, started, ended)
    print(f"\nrolling restart: {sum(produced.values())} messages, {len(log)} deliveries, {checker.duplicates} "
          f"delivered again after their ack, {moves} queue moves, backlog left {left}; stop to back in service (s): "
          f"{[(n, how, round(b - a, 2)) for n, how, a, b in fleet.restarts]}; longest gap per queue (s): "
          f"{ {q: round(g, 2) for q, g in gaps.items()} }")
    assert checker.duplicates == 0, "a message acked was delivered again"
    assert max(gaps.values()) <= MAX_GAP_S, gaps


def first_delivery_after(log: list[Delivery], since: float) -> float:
    """When the first delivery after ``since`` came (``time.time()``)."""
    return min(d.received for d in log if d.received >= since)


@pytest.mark.timeout(180)
async def test_the_embedded_default_restarted_in_place_loses_nothing_and_keeps_every_key_in_order(
    tmp_path: Path
) -> None:
    """The quick start's setup: one proxy with ``redis: embedded`` (its own redis-server, stopped with
    it, restarted from its append-only file), restarted in place twice while clients pull a backlog
    and a producer writes. What they see: a gap per restart (printed: SIGTERM to the first delivery
    again), the same Redis URL, nothing lost, no key out of order, committed offsets equal to the
    produced ones at the end."""
    folder = tmp_path / "embedded"
    folder.mkdir()
    data = folder / "ddmq-data"
    process = ProxyProcess(folder, "embedded", {"g": {"t": GROUP}}, {"t": {"queues": QUEUES}}, instance_id="solo",
                           audit_log=str(folder / "reads.jsonl"), embedded_redis={"data_dir": str(data)})
    pullers = Pullers()
    log = pullers.log
    produced: dict[str, int] = {}
    restarts: list[tuple[float, ...]] = []  # SIGTERM, exited, listening again, first delivery again
    try:
        await asyncio.to_thread(process.start)
        url = (data / "redis.url").read_text().strip()
        await asyncio.to_thread(produce, url, 8_000, produced, random.Random(47))
        await pullers.add("solo", process.port)
        await until("deliveries from every queue", lambda: served_since(log, 0), 30)
        # a producer keeps writing through the restarts, on the URL it was given before them
        producing = asyncio.create_task(asyncio.to_thread(produce, url, 6_000, produced, random.Random(48),
                                                          pause_s=1.0))
        for _ in range(2):
            stopped_at = time.time()
            assert await asyncio.to_thread(process.stop) == 0
            exited = time.time()
            await asyncio.to_thread(process.start)
            listening = time.time()
            await served_again_at(url, log, listening)
            restarts.append((stopped_at, exited, listening, first_delivery_after(log, listening)))
            assert (data / "redis.url").read_text().strip() == url, "the embedded Redis moved to another port"
        gaps = longest_gaps(log, restarts[0][0], restarts[-1][3])
        left = await backlog_at(url)
        await producing
        pullers.slow = False
        await until("every message acked", lambda: acked_prefixes(log) == produced, 120)
        produce_next, committed = await until_committed(url)
    finally:
        await pullers.close()
        code = await asyncio.to_thread(process.stop)
    assert code == 0
    assert committed == produce_next, "lost: committed offsets short of the produced ones"
    records = [json.loads(line) for line in (folder / "reads.jsonl").read_text().splitlines() if line.strip()]
    check_single_reader(records)
    checker = check_order_by_term(records, log)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    print(f"\nembedded restarted in place: {sum(produced.values())} messages, {len(log)} deliveries, "
          f"{checker.duplicates} delivered again after their ack, backlog left {left}; per restart SIGTERM to "
          f"exit / listening / first delivery (s): {[tuple(round(t - r[0], 2) for t in r[1:]) for r in restarts]}; "
          f"longest gap per queue (s): { {q: round(g, 2) for q, g in gaps.items()} }")


async def served_again_at(url: str, log: list[Delivery], since: float) -> None:
    client = aioredis.from_url(url)
    try:
        await served_again(client, log, since)
    finally:
        await client.aclose()


async def backlog_at(url: str) -> list[int]:
    client = aioredis.from_url(url)
    try:
        return await backlog(client)
    finally:
        await client.aclose()


async def until_committed(url: str) -> tuple[list[int], list[int]]:
    """Per queue (next produce offset, committed offset), once the proxy committed what was acked."""
    client = aioredis.from_url(url)
    try:
        deadline = time.monotonic() + 10
        while True:
            produce_next = [int(await client.get(keys.sequence("t", q)) or 0) + 1 for q in range(QUEUES)]
            committed = [int(await client.get(keys.committed("g", "t", q)) or 0) for q in range(QUEUES)]
            if committed == produce_next or time.monotonic() > deadline:
                return produce_next, committed
            await asyncio.sleep(0.05)
    finally:
        await client.aclose()
