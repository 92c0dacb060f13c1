"""OwnedQueues (cluster/queue_state.py): one QueueState per queue, and what ownership, commits and the
readers may do with it."""

from __future__ import annotations

import asyncio

from ddmq.proxy.cluster.lease_clock import LeaseClock
from ddmq.proxy.cluster.leases import Lease
from ddmq.proxy.cluster.queue_state import OwnedQueues
from ddmq.proxy.engine.offsets import OffsetTracker


def lease(qid: int, term: int = 1) -> Lease:
    return Lease("g", "t", qid, "p1", term)


async def test_a_claimed_queue_is_held_and_confirmed_until_its_ttl_passes() -> None:
    owned = OwnedQueues(LeaseClock(200, 100))
    now = asyncio.get_running_loop().time()
    owned.claim(0, lease(0), now)
    assert owned.held() == {0: lease(0)} and owned.confirmed(0)
    assert not owned.confirmed(1)
    owned.claim(1, lease(1), now - 0.5)  # confirmed longer ago than the TTL
    assert not owned.confirmed(1)
    owned.confirm(1, lease(1), now)
    assert owned.confirmed(1)


async def test_a_renewal_of_an_older_lease_confirms_nothing() -> None:
    owned = OwnedQueues(LeaseClock(10_000, 5_000))
    loop = asyncio.get_running_loop()
    owned.claim(0, lease(0, term=2), loop.time() - 20)
    owned.confirm(0, lease(0, term=1), loop.time())
    assert not owned.confirmed(0)
    assert owned.holds(0, lease(0, term=2)) and not owned.holds(0, lease(0, term=1))


async def test_unconfirm_stops_serving_until_confirmed_again() -> None:
    owned = OwnedQueues(LeaseClock(10_000, 5_000))
    loop = asyncio.get_running_loop()
    owned.claim(0, lease(0), loop.time())
    owned.unconfirm(0)
    assert not owned.confirmed(0) and owned.lease(0) == lease(0)


def test_drop_forgets_the_hold_marks_the_tracker_and_keeps_the_rollback_count() -> None:
    owned = OwnedQueues(LeaseClock(10_000, 5_000))
    tracker = OffsetTracker(5)
    owned.claim(3, lease(3), 0.0)
    owned.open(3, tracker, None)  # type: ignore[arg-type]  # no reader needed for the state's bookkeeping
    owned.count_rollback(3)
    assert owned.tracker(3) is tracker and owned.trackers() == {3: tracker}
    assert owned.drop(3) == lease(3)
    assert tracker.dropped and owned.tracker(3) is None and owned.held() == {} and owned.lease(3) is None
    assert owned.rollbacks() == {3: 1}
    assert owned.drop(3) is None and owned.drop(7) is None  # nothing left to drop


def test_the_gap_after_a_rollback_is_taken_once_and_a_drop_clears_it() -> None:
    owned = OwnedQueues(LeaseClock(10_000, 5_000))
    owned.set_gap(2, 40)
    assert owned.take_gap(2) == 40 and owned.take_gap(2) is None
    owned.set_gap(2, 50)
    owned.drop(2)
    assert owned.take_gap(2) is None
    assert owned.take_gap(9) is None


async def test_hand_offs_are_tracked_per_queue() -> None:
    owned = OwnedQueues(LeaseClock(10_000, 5_000))
    task = asyncio.create_task(asyncio.sleep(0))
    owned.set_handoff(1, task)
    assert owned.handing_off(1) and not owned.handing_off(0) and owned.handoffs() == [task]
    await task
    owned.set_handoff(1, None)
    assert not owned.handing_off(1) and owned.handoffs() == []
