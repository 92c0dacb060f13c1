"""LeaseClock (cluster/lease_clock.py): a lease's age on Redis's clock, whatever this host's rate, and
nothing counts after a stall of the event loop until a renewal sent after it."""

from __future__ import annotations

import asyncio
import time

from ddmq.proxy.cluster.lease_clock import LeaseClock


async def test_a_slow_host_clock_counts_a_lease_by_redis_seconds() -> None:
    clock = LeaseClock(ttl_ms=10_000, renew_ms=3_000)
    now = asyncio.get_running_loop().time()
    # This host's clock advanced 2 s while Redis's advanced 4 s: it runs at half speed.
    clock.sample(now - 2.0, 1_000_000, now - 2.0)
    clock.sample(now, 1_004_000, now)
    assert abs(clock.rate - 0.5) < 1e-9
    assert clock.local_s(1.0) == 0.5
    # Confirmed 4.5 local seconds ago: 9 of Redis's, with the margins past a 10 s TTL... not yet.
    assert clock.valid(now - 4.5)
    # 5 local seconds: 10 of Redis's, the TTL.
    assert not clock.valid(now - 5.0)
    assert abs(clock.redis_now_ms() - 1_004_000) < 100


async def test_a_fast_host_clock_does_not_give_a_lease_up_early() -> None:
    clock = LeaseClock(ttl_ms=10_000, renew_ms=3_000)
    now = asyncio.get_running_loop().time()
    clock.sample(now - 8.0, 1_000_000, now - 8.0)
    clock.sample(now, 1_004_000, now)  # 8 local seconds per 4 of Redis's
    assert abs(clock.rate - 2.0) < 1e-9
    assert clock.valid(now - 18.0)  # 9 of Redis's seconds
    assert not clock.valid(now - 20.0)


async def test_samples_too_close_or_a_clock_that_went_back_leave_the_rate_alone() -> None:
    clock = LeaseClock(ttl_ms=10_000, renew_ms=3_000)
    now = asyncio.get_running_loop().time()
    clock.sample(now - 1.0, 1_000_000, now - 1.0)
    clock.sample(now, 1_000_500, now)  # half a second of Redis's time: too close to tell
    assert clock.rate == 1.0
    clock.sample(now + 0.1, 900_000, now + 0.1)  # Redis's clock went back (another host): start again
    assert clock.rate == 1.0 and abs(clock.redis_now_ms() - 900_000) < 200


async def test_after_a_stall_nothing_counts_until_a_renewal_sent_after_it() -> None:
    stalls: list[float] = []
    loop = asyncio.get_running_loop()
    clock = LeaseClock(ttl_ms=30_000, renew_ms=2_000, on_stall=lambda: stalls.append(loop.time()))
    clock.start()
    try:
        confirmed_at = loop.time()
        assert clock.valid(confirmed_at)
        time.sleep(clock.stall_s + 0.3)  # noqa: ASYNC251  # the loop does not run, as under a SIGSTOP
        assert not clock.valid(confirmed_at), "a lease confirmed before the stall still counted"
        assert len(stalls) == 1 and clock.stalls == 1
        assert clock.valid(loop.time()), "a renewal sent after the stall counts again"
        assert not clock.valid(confirmed_at)
    finally:
        clock.stop()
