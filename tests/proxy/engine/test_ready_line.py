"""ReadyLine against a plain sorted list: whatever order jobs arrive in, the oldest offset comes first."""

from __future__ import annotations

import random

import pytest

from ddmq.proxy.core.types import QueueId, StoredMessage
from ddmq.proxy.engine.job import UpstreamJob
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.engine.ready_line import FairReadyLine, ReadyLine

from ..engine_fakes import Owner


def job(offset: int) -> UpstreamJob:
    return UpstreamJob(Owner(), QueueId("t", 0), StoredMessage(offset, b"", "k", "", {}, 0), OffsetTracker(0))


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_the_oldest_offset_comes_first_whatever_the_arrival_order(seed: int) -> None:
    rng = random.Random(seed)
    line, reference = ReadyLine(), []
    offsets = list(range(2000))
    rng.shuffle(offsets)
    # mostly ascending arrivals with some out of order, as acks release successors
    offsets.sort(key=lambda offset: offset + rng.randrange(200))
    jobs = [job(offset) for offset in offsets]
    for one in jobs:
        line.append(one)
        reference.append(one)
        if rng.random() < 0.4:
            reference.sort(key=lambda j: j.message.offset)
            assert line.first() is reference[0]
            taken = line.popleft()
            assert taken is reference.pop(0)
            if rng.random() < 0.2:  # did not fit the reply: back in front
                line.put_front(taken)
                reference.insert(0, taken)
        if rng.random() < 0.02 and reference:  # an operator takes one out
            victim = rng.choice(reference)
            assert line.remove(victim)
            reference.remove(victim)
            assert not line.remove(victim)
        assert len(line) == len(reference) and bool(line) == bool(reference)
        assert sorted(j.message.offset for j in line) == sorted(j.message.offset for j in reference)
    reference.sort(key=lambda j: j.message.offset)
    assert [line.popleft() for _ in range(len(line))] == reference
    assert not line


def test_the_same_offset_twice_goes_out_twice() -> None:
    """Not expected in one queue's line, but it must neither fail nor lose one."""
    line = ReadyLine()
    for one in (job(5), job(3), job(3), job(4)):
        line.append(one)
    assert [line.popleft().offset for _ in range(4)] == [3, 3, 4, 5]
    assert not line


def test_a_job_sharing_its_offset_can_be_taken_out_alone() -> None:
    line = ReadyLine()
    first, second, twin_of_second = job(4), job(2), job(2)
    for one in (first, second, twin_of_second, job(3)):
        line.append(one)
    assert line.remove(second) and not line.remove(second)
    assert line.first() is twin_of_second
    assert line.remove(twin_of_second) and not line.remove(twin_of_second)
    assert [line.popleft().offset for _ in range(len(line))] == [3, 4]


def tenant_job(offset: int, tenant: str) -> UpstreamJob:
    one = job(offset)
    one.tenant = tenant
    return one


def test_tenants_are_served_in_turns_each_its_oldest_first_by_weight() -> None:
    line = FairReadyLine({"big": 3.0, "half": 0.5})
    # "big" has the oldest backlog; turns give the others their share of every pull all the same.
    for offset in range(100):
        line.append(tenant_job(offset, "big"))
    for offset in range(100, 130):
        line.append(tenant_job(offset, "small" if offset % 2 else "half"))
    taken = [(j.tenant, j.offset) for j in (line.popleft() for _ in range(18))]
    # "half" (weight 0.5) is served every other turn; the turns began big, half, small
    assert [t for t, _ in taken] == (["big"] * 3 + ["small"] + ["big"] * 3 + ["half", "small"]) * 2
    for tenant in ("big", "small", "half"):
        offsets = [o for t, o in taken if t == tenant]
        assert offsets == sorted(offsets)
    assert len(line) == 130 - 18
    assert sorted(j.offset for j in line) == sorted(set(range(130)) - {o for _, o in taken})


def test_a_tenant_put_back_keeps_its_turn_and_removed_ones_leave_the_turns() -> None:
    line = FairReadyLine({})
    a0, a1, b0 = tenant_job(1, "a"), tenant_job(2, "a"), tenant_job(3, "b")
    for one in (a0, a1, b0):
        line.append(one)
    first = line.popleft()
    assert first is a0
    line.put_front(first)  # did not fit the reply: still a's turn, a0 first
    assert line.first() is a0 and line.popleft() is a0
    assert line.popleft() is b0  # then b's turn, and a's again
    assert line.remove(a1) and not line and len(line) == 0
    assert not line.remove(a1)
    line.append(b0)
    assert line.popleft() is b0 and not line
