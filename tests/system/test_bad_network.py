"""A bad network between one proxy and Redis: blackhole, reset, one-way and silent cuts of 3 x the
lease TTL, and a link that resets every 2 s, while two proxies (one behind the project's relay,
``tests/harness/relay.py``, one direct) serve a backlog, on uvloop and on asyncio's loop.

Whatever the fault: every produced message is delivered and acked, each key in order, no queue has two
readers at once (the read audit), the committed offsets reach the end of every queue (no reader or
upkeep was lost on the way), no task fails unexpectedly, the cut-off proxy says once that Redis is
unreachable, and it answers again within 2 s of the heal."""

from __future__ import annotations

import asyncio
import functools
import random
import re
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from tests.harness.relay import Relay
from tests.harness.stack import LOOP_ENV

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
CUT_S = 3 * FAULT_LEASES["ttl_ms"] / 1000
#: What every fault is followed by: the network heals within this of it.
RECOVERY_S = 2.0
#: Lines that mean a task died or had to be restarted: what the mapping of foreign errors prevents.
DEATHS = ("stopped on an unexpected error", "stopped by an unexpected error", "failed unexpectedly")

produce = functools.partial(produce_keyed, keys=400, key_prefix="rider-", queues=QUEUES)


def _log_time(line: str) -> float:
    stamp = line[:23]  # logging's asctime: "2026-12-01 23:59:59,123", local time
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _first_after(log: str, pattern: str, after: float) -> float | None:
    for line in log.splitlines():
        if re.search(pattern, line):
            try:
                at = _log_time(line)
            except ValueError:
                continue
            if at >= after:
                return at
    return None


def _cut(relay: Relay, fault: str) -> None:
    """Put the relay into the fault (its heal is ``_heal``)."""
    if fault == "flap":
        relay.mode("flap", 2.0)
    elif fault == "silent":
        relay.mode("blackhole")  # nothing gets through for the cut; its connections then stay dead
    else:
        relay.mode(fault)


def _heal(relay: Relay, fault: str) -> None:
    if fault == "silent":
        relay.mode("silent")  # the connections of before never carry a byte again; new ones work
    relay.mode("pass")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
@pytest.mark.parametrize("fault", ["blackhole", "reset", "oneway-up", "oneway-down", "silent", "flap"])
async def test_a_proxy_cut_off_from_redis_loses_nothing_keeps_order_and_comes_back(
    fault: str, loop: str, redis_url: str, redis_client: aioredis.Redis, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LOOP_ENV, loop)
    rng = random.Random(f"{fault}{loop}")
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce, redis_url, 3000, produced, rng)
    fleet = fault_fleet(tmp_path, redis_url)
    log: list[Delivery] = []
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with Relay(port) as relay:
        try:
            await asyncio.to_thread(fleet.start, "near")
            await asyncio.to_thread(fleet.start, "far", relay.url(redis_url))
            for name, proxy in fleet.proxies.items():
                for i in range(2):
                    tasks.append(asyncio.create_task(puller(name, proxy.port, log, stop, random.Random(f"{name}{i}"))))
            # More arrives until after the fault, so the queues have a backlog all along.
            rest = threading.Thread(target=produce, args=(redis_url, 7000, produced, random.Random(1)),
                                    kwargs={"pause_s": CUT_S / 8})
            rest.start()
            # Both serve before the fault: the far one holds queues whose story must survive it.
            await until("both proxies delivering", lambda: {"near", "far"} <= {d.owner for d in log}, 60)
            cut_at = time.time()
            _cut(relay, fault)
            await asyncio.sleep(CUT_S)  # the fault lasts this long: a duration the test sets, not a wait for state
            _heal(relay, fault)
            healed_at = time.time()
            await asyncio.to_thread(rest.join)
            await until("every message acked", lambda: acked_prefixes(log) == produced, 120)
            stop.set()
            await asyncio.gather(*tasks)
            sequences = [keys.sequence("t", q) for q in range(QUEUES)]
            committed = [keys.committed("g", "t", q) for q in range(QUEUES)]

            async def at_end() -> bool:
                ends = [int(raw or 0) + 1 for raw in await redis_client.mget(sequences)]
                return [int(raw or 0) for raw in await redis_client.mget(committed)] == ends

            deadline = time.monotonic() + 30
            while not await at_end():  # every queue's reader and committer went on to the end
                assert time.monotonic() < deadline, "the committed offsets did not reach the end of every queue"
                await asyncio.sleep(0.1)
            for proxy in fleet.proxies.values():
                assert await asyncio.to_thread(proxy.stop) == 0
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for proxy in fleet.proxies.values():
                proxy.stop()

    far_log = fleet.proxies["far"].log()
    for name, proxy in fleet.proxies.items():
        died = [line for line in proxy.log().splitlines() if any(death in line for death in DEATHS)]
        assert not died, f"{name}: {died[:3]}"
    records = fleet.reads()
    check_single_reader(records)
    stale = stale_deliveries(records, log)
    assert stale == [], stale[:5]
    checker = check_order_by_term(records, log)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    warned = _first_after(far_log, r"WARNING .*redis at .* unreachable", cut_at - 1)
    back = None
    if fault != "flap":  # a reset link is reconnected at once: it may never miss a round
        assert warned is not None, f"no warning that Redis is unreachable:\n{far_log[-3000:]}"
    if warned is not None:
        back = _first_after(far_log, r"INFO .*redis at .* answers again", warned)
        assert back is not None, f"never said Redis answers again:\n{far_log[-3000:]}"
        assert back - max(healed_at, warned) <= RECOVERY_S, (
            f"answered again {back - healed_at:.2f}s after the heal (limit {RECOVERY_S}s)")
    recovered = None if warned is None or back is None else round(back - healed_at, 2)
    print(f"\n{fault} on {loop}: {len(log)} deliveries, {checker.duplicates} redelivered, "
          f"warned {None if warned is None else round(warned - cut_at, 2)}s after the cut, "
          f"answered again {recovered}s after the heal")
