"""OffsetTracker: the commit point is the first unfinished offset, never past it."""

from __future__ import annotations

import random

import pytest

from ddmq.proxy.offsets import OffsetTracker


def test_commit_point_stops_at_first_unfinished() -> None:
    tracker = OffsetTracker(start=5)
    assert tracker.commit_point == 5
    for offset in (5, 6, 7, 9):  # 8 was trimmed / never read
        tracker.track(offset)
    tracker.finish(6)
    tracker.finish(9)
    assert tracker.commit_point == 5
    tracker.finish(5)
    assert tracker.commit_point == 7
    tracker.finish(7)
    assert tracker.commit_point == 10
    assert tracker.unfinished == 0


def test_reading_out_of_order_is_refused() -> None:
    tracker = OffsetTracker(start=3)
    tracker.track(3)
    with pytest.raises(ValueError):
        tracker.track(3)


def test_random_finish_order_matches_a_model() -> None:
    rng = random.Random(11)
    tracker = OffsetTracker(start=1)
    read: list[int] = []
    finished: set[int] = set()
    offset = 0
    for _ in range(20_000):
        if rng.random() < 0.55:
            offset += rng.choice((1, 1, 1, 2))
            tracker.track(offset)
            read.append(offset)
        else:
            open_offsets = [o for o in read[-50:] if o not in finished]
            if open_offsets:
                chosen = rng.choice(open_offsets)
                finished.add(chosen)
                tracker.finish(chosen)
        unfinished = [o for o in read if o not in finished]
        expected = unfinished[0] if unfinished else (read[-1] + 1 if read else 1)
        assert tracker.commit_point == expected
