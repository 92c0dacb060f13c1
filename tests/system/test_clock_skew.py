"""Skewed clocks: one of two proxies runs under Debian's libfaketime (tests/harness/faketime.py) with its
wall clock 10 s ahead or behind, or all its clocks at half or double speed. Time between proxies is
Redis's, and leases are counted in Redis's seconds, so whatever the skew:

- a SIGSTOP of 3 x the TTL costs no overlap (no queue read by two proxies at once, by the read audit
  on Redis's clock, and nothing delivered by the woken proxy from a term another had taken over) and
  the queues are balanced again after it;
- after a kill -9 of either proxy, the survivor holds every queue within TTL + 1 s;
- every produced message is acked, each key in order.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from tests.harness.faketime import faketime_cleanup, faketime_wrap

from ..support import (
    FAULT_LEASES,
    FAULT_QUEUES,
    Delivery,
    acked_prefixes,
    check_order_by_term,
    check_single_reader,
    fault_fleet,
    produce_keyed,
    puller,
    stale_deliveries,
    until,
)

QUEUES = FAULT_QUEUES
TTL_S = FAULT_LEASES["ttl_ms"] / 1000
#: How much past the TTL a failover may take: the survivor's next rounds, a claim each.
FAILOVER_MARGIN_S = 1.0

produce = functools.partial(produce_keyed, keys=400, key_prefix="rider-", queues=QUEUES)


async def _owners(redis_client: aioredis.Redis) -> Counter[str]:
    raws = await redis_client.mget([keys.lease("g", "t", q) for q in range(QUEUES)])
    return Counter(raw.decode().rpartition(" ")[0] if raw else "" for raw in raws)


async def _wait_owners(redis_client: aioredis.Redis, wanted: dict[str, int], timeout_s: float) -> float:
    """Seconds until the leases are held as ``wanted`` (owner -> queues); fails past ``timeout_s``."""
    started = time.monotonic()
    while True:
        owners = await _owners(redis_client)
        if owners == Counter(wanted):
            return time.monotonic() - started
        assert time.monotonic() - started < timeout_s, f"leases held {dict(owners)}, wanted {wanted}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("offset_s", "rate"), [(10, 1), (-10, 1), (0, 0.5), (0, 2)],
                         ids=["ahead-10s", "behind-10s", "rate-x0.5", "rate-x2"])
async def test_a_skewed_clock_costs_no_overlap_and_failover_takes_the_ttl(
    offset_s: float, rate: float, redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    skew = faketime_wrap(offset_s=offset_s, rate=rate)
    rng = random.Random(f"{offset_s}{rate}")
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce, redis_url, 2000, produced, rng)
    fleet = fault_fleet(tmp_path, redis_url)
    log: list[Delivery] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    failovers: dict[str, float] = {}

    def pull_from(name: str) -> None:
        for i in range(2):
            rng_ = random.Random(f"{name}{i}{len(tasks)}")
            tasks.append(asyncio.create_task(puller(name, fleet.proxies[name].port, log, stop, rng_)))

    rest = threading.Thread(target=produce, args=(redis_url, 8000, produced, random.Random(2)),
                            kwargs={"pause_s": 0.4})
    try:
        await asyncio.to_thread(fleet.start, "plain")
        await asyncio.to_thread(fleet.start, "skewed", None, skew)
        pull_from("plain")
        pull_from("skewed")
        rest.start()  # a backlog through the whole run
        await _wait_owners(redis_client, {"plain": 4, "skewed": 4}, 30)

        # A pause of 3 x the TTL: the other proxy takes the queues over; the woken one serves none of
        # them (the audit would show two readers of one term's queue), then they are shared again.
        skewed = fleet.proxies["skewed"]
        os.kill(skewed.pid, signal.SIGSTOP)
        try:
            await _wait_owners(redis_client, {"plain": 8}, TTL_S * 3)
            await asyncio.sleep(TTL_S * 3)  # the pause lasts this long: a duration the test sets
        finally:
            os.kill(skewed.pid, signal.SIGCONT)
        await _wait_owners(redis_client, {"plain": 4, "skewed": 4}, 30)

        # kill -9 of either: the survivor holds everything within the TTL and a margin.
        for dead, survivor in (("plain", "skewed"), ("skewed", "plain")):
            fleet.proxies[dead].kill()
            if dead == "skewed":
                faketime_cleanup(fleet.proxies[dead].pid)
            failovers[dead] = await _wait_owners(redis_client, {survivor: 8}, TTL_S + 10)
            await asyncio.to_thread(fleet.start, dead, None, skew if dead == "skewed" else None)
            pull_from(dead)
            await _wait_owners(redis_client, {"plain": 4, "skewed": 4}, 30)

        await asyncio.to_thread(rest.join)
        await until("every message acked", lambda: acked_prefixes(log) == produced, 120)
        stop.set()
        await asyncio.gather(*tasks)
        for proxy in fleet.proxies.values():
            assert await asyncio.to_thread(proxy.stop) == 0
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if rest.is_alive():
            await asyncio.to_thread(rest.join)
        for proxy in fleet.proxies.values():
            proxy.stop()

    records = fleet.reads()
    check_single_reader(records, clock="rt")  # the skewed proxy's wall clock is off: Redis's time
    stale = stale_deliveries(records, log, clock="rt")
    assert stale == [], stale[:5]
    # A proxy's idea of Redis's time is off by up to a few tens of ms while its clock runs at another
    # rate (it is set again at each renewal); its re-reads of an offset are a lease move (seconds) apart.
    checker = check_order_by_term(records, log, clock="rt", slack_s=0.5)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    for dead, took in failovers.items():
        assert took <= TTL_S + FAILOVER_MARGIN_S, f"{dead} killed: the survivor held every queue after {took:.2f}s"
    print(f"\nclock skew {offset_s:+}s x{rate}: failover {failovers}, {len(log)} deliveries, "
          f"{checker.duplicates} redelivered")
