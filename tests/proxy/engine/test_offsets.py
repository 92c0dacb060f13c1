"""OffsetTracker: the commit point is the first unfinished offset, never past it."""

from __future__ import annotations

import random
import sys

import pytest

from ddmq.proxy.engine.offsets import (
    FINISHED_RECORD_BYTES,
    OffsetTracker,
    bounded_ranges,
    decode_ranges,
    encode_ranges,
)


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


def test_finished_offsets_round_trip_as_ranges() -> None:
    offsets = [3, 4, 5, 7, 9, 10, 20]
    text = encode_ranges(offsets)
    assert text == "3-5,7,9-10,20"
    assert decode_ranges(text) == set(offsets)
    assert encode_ranges([]) == "" and decode_ranges("") == set()


@pytest.mark.parametrize("text", ["5-3", "x", "1-2-3", "1-999999999"])
def test_malformed_or_huge_ranges_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        decode_ranges(text, limit=1000)


def test_offsets_a_previous_owner_finished_are_skipped_and_the_commit_point_moves_past_them() -> None:
    previous = OffsetTracker(start=1)
    for offset in range(1, 7):
        previous.track(offset)
    for offset in (2, 3, 5):
        previous.finish(offset)
    assert previous.commit_point == 1 and previous.finished_beyond() == "2-3,5"
    successor = OffsetTracker(previous.commit_point, decode_ranges(previous.finished_beyond()))
    skipped = [offset for offset in range(1, 7) if successor.track(offset)]
    assert skipped == [2, 3, 5]
    successor.finish(1)
    assert successor.commit_point == 4
    successor.finish(4)
    successor.finish(6)
    assert successor.commit_point == 7 and successor.finished_beyond() == ""


def test_a_tracker_that_read_nothing_yet_reports_and_skips_like_any_other() -> None:
    # Its containers are made on first use (a proxy holds thousands of queues that see no message).
    tracker = OffsetTracker(start=10)
    assert (tracker.commit_point, tracker.next_offset, tracker.unfinished, tracker.finished_beyond()) == (10, 10, 0, "")
    assert tracker.skip_ahead({3, 12, 13}) == 2  # 3 is below what is read next: out of reach
    assert tracker.skip_ahead({13, 15}) == 1 and tracker.finished_beyond() == "12-13,15"
    skipped = [offset for offset in range(10, 17) if tracker.track(offset)]
    assert skipped == [12, 13, 15] and tracker.unfinished == 4 and tracker.commit_point == 10
    for offset in (16, 14, 11):
        tracker.finish(offset)
    assert tracker.commit_point == 10 and tracker.finished_beyond() == "11-16"
    tracker.finish(10)
    assert (tracker.commit_point, tracker.unfinished, tracker.finished_beyond()) == (17, 0, "")


def test_the_record_of_finished_offsets_is_cut_to_its_bounds_keeping_the_lowest() -> None:
    holes = list(range(1, 2001, 2))  # every other offset finished: one range per offset
    assert bounded_ranges(holes, 0, 0) == (encode_ranges(holes), False)
    text, cut = bounded_ranges(holes, 100, 0)
    assert cut and len(text) <= 100 and decode_ranges(text) == set(holes[: len(decode_ranges(text))])
    text, cut = bounded_ranges([*range(1, 5001), 6000], 0, 5000)
    assert (text, cut) == ("1-5000", True)


def test_a_tracker_held_back_by_one_offset_commits_a_bounded_record_that_reads_back() -> None:
    tracker = OffsetTracker(1)
    for offset in range(1, 400_001):
        tracker.track(offset)
    for offset in range(2, 400_001, 2):  # the odd offsets (a key held back) stay unfinished
        tracker.finish(offset)
    text = tracker.finished_beyond()
    assert tracker.commit_point == 1 and tracker.records_cut == 1
    assert len(text) <= FINISHED_RECORD_BYTES
    finished = decode_ranges(text)  # what a next owner reads back: no more than it can
    assert finished and all(offset % 2 == 0 for offset in finished)
    assert sorted(finished) == list(range(2, 2 * len(finished) + 1, 2))


class _Model:
    """The tracker's contract, the plain way: sets of offsets read, finished, and to skip."""

    def __init__(self, start: int, skip: set[int]) -> None:
        self.next = start
        self.read: list[int] = []
        self.open: set[int] = set()
        self.skip = set(skip)

    def track(self, offset: int) -> bool:
        self.next = offset + 1
        self.read.append(offset)
        if offset in self.skip:
            self.skip.discard(offset)
            return True
        self.open.add(offset)
        return False

    def commit_point(self) -> int:
        return min(self.open) if self.open else self.next

    def finished_beyond(self) -> str:
        point = self.commit_point()
        finished = [offset for offset in self.read if offset > point and offset not in self.open] if self.open else []
        return bounded_ranges(sorted({*finished, *self.skip}), FINISHED_RECORD_BYTES, 0)[0]


@pytest.mark.parametrize("seed", range(6))
def test_a_long_window_with_gaps_skips_and_late_finishes_matches_the_model(seed: int) -> None:
    # Windows of thousands of offsets held open by a few (a hot key's head) while the rest finish, with
    # offsets missing from the stream, a previous owner's finished ones, finishes twice and after the
    # window moved on: the commit point, the count and the record agree with the plain model throughout.
    rng = random.Random(seed)
    skip = {offset for offset in range(1, 60_000) if rng.random() < 0.01}
    tracker, model = OffsetTracker(1, set(skip)), _Model(1, skip)
    finished: list[int] = []
    offset = 0
    for step in range(40_000):
        roll = rng.random()
        if roll < 0.5:
            missing = rng.choice((0, 0, 0, 0, 1, 5)) if rng.random() < 0.2 else 0  # entries not in the stream
            offset = max(offset + 1, tracker.next_offset) + missing
            assert tracker.track(offset) == model.track(offset)
        elif roll < 0.52:
            jump = tracker.next_offset + rng.randrange(1, 20)
            tracker.skip_to(jump)
            model.next = jump
            offset = jump - 1
        elif model.open:
            # Mostly the newest offsets finish; the oldest open ones (a held-back key) rarely, then in
            # turns often (the key drains, and the window's bits below the commit point are dropped).
            ordered = sorted(model.open)
            oldest = 0.002 if (step // 8_000) % 2 == 0 else 0.4
            chosen = ordered[0] if rng.random() < oldest else ordered[-rng.randrange(1, min(len(ordered), 50) + 1)]
            model.open.discard(chosen)
            tracker.finish(chosen)
            finished.append(chosen)
            if rng.random() < 0.05:
                tracker.finish(rng.choice(finished))  # again, or long after: nothing changes
        assert tracker.commit_point == model.commit_point()
        assert tracker.unfinished == len(model.open)
        if step % 997 == 0:
            assert tracker.finished_beyond() == model.finished_beyond(), step
    assert tracker.finished_beyond() == model.finished_beyond()


def test_a_window_held_open_by_one_offset_costs_bits_not_entries() -> None:
    tracker = OffsetTracker(1)
    for offset in range(1, 1_000_001):
        tracker.track(offset)
        if offset > 1:
            tracker.finish(offset)
    assert tracker.commit_point == 1 and tracker.unfinished == 1
    assert tracker.finished_beyond() == "2-1000000"
    assert sys.getsizeof(tracker._bits) < 200_000  # a million offsets: 125 KB of bits
    tracker.finish(1)
    assert (tracker.commit_point, tracker.unfinished, tracker.finished_beyond()) == (1_000_001, 0, "")
