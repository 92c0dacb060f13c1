"""End-to-end latency in the pull buffer (a fake owner, fake clocks): what counts as a first delivery,
what an ack and a dead letter record, and the buckets' quantiles. The metric on a real proxy process:
tests/system/test_end_to_end_latency.py."""

from __future__ import annotations

import pytest

from ddmq.proxy.core.types import PullBatch, QueueId
from ddmq.proxy.engine.end_to_end import _LATENCY_BOUNDS_MS, LATENCY_BOUNDS_S, Distribution, EndToEnd
from ddmq.proxy.engine.job import UpstreamJob
from ddmq.proxy.engine.pull_buffer import PullBuffer

from ..engine_fakes import Clock, Owner

Q0 = QueueId("t", 0)
PRODUCED_MS = 1_700_000_000_000


class WallClock:
    """Milliseconds since the epoch that move only when told to."""

    def __init__(self) -> None:
        self.now_ms = PRODUCED_MS

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def wall(buffer: PullBuffer) -> WallClock:
    wall = WallClock()
    buffer.use_wall_clock(wall)
    return wall


def produced(job: UpstreamJob, at_ms: int = PRODUCED_MS) -> UpstreamJob:
    job.message = job.message._replace(produce_ms=at_ms)
    return job


async def pull(buffer: PullBuffer) -> PullBatch:
    return await buffer.pull(None, 10, 0)


def counts(distribution: Distribution) -> dict[str, int]:
    """Bucket label -> observations in it (not cumulative), those with any."""
    return {le: count for le, count in zip(distribution.les, distribution.counts, strict=True) if count}


async def test_first_delivery_and_ack_land_in_the_buckets_of_their_ages(
        buffer: PullBuffer, clock: Clock, wall: WallClock) -> None:
    owner = Owner(buffer, retry_intervals_ms=[100], max_retry=3)
    a, b = produced(owner.job("a")), produced(owner.job("b"), PRODUCED_MS + 20)
    wall.now_ms = PRODUCED_MS + 30
    assert len((await pull(buffer)).messages) == 2
    wall.now_ms = PRODUCED_MS + 700
    buffer.ack(Q0, [a.offset, b.offset])
    figures = buffer.end_to_end["t"]
    assert counts(figures.delivered) == {"0.01": 1, "0.05": 1}  # 10 ms and 30 ms
    assert counts(figures.acked) == {"1.0": 2}  # 680 ms and 700 ms
    assert figures.delivered.total == 40 and figures.acked.total == 1380
    assert counts(figures.attempts_acked) == {"1.0": 2}
    assert figures.ahead == 0


async def test_a_redelivery_is_not_a_first_delivery_and_the_ack_counts_its_attempts(
        buffer: PullBuffer, clock: Clock, wall: WallClock) -> None:
    owner = Owner(buffer, retry_intervals_ms=[100], max_retry=3)
    failing, released = produced(owner.job("a")), produced(owner.job("b"))
    await pull(buffer)
    buffer.fail(Q0, [failing.offset])
    buffer.release(Q0, [released.offset])  # given back uncounted: its next delivery is no first one either
    clock.advance(0.2)
    buffer.redelivery.expire(clock())
    wall.now_ms = PRODUCED_MS + 300
    assert sorted(m.offset for m in (await pull(buffer)).messages) == [failing.offset, released.offset]
    buffer.ack(Q0, [failing.offset, released.offset])
    figures = buffer.end_to_end["t"]
    assert figures.delivered.count() == 2
    assert counts(figures.attempts_acked) == {"1.0": 1, "2.0": 1}
    assert figures.acked.count() == 2


async def test_a_dead_letter_records_its_attempts(buffer: PullBuffer, clock: Clock, wall: WallClock) -> None:
    owner = Owner(buffer, retry_intervals_ms=[10], max_retry=1)
    job = produced(owner.job("a"))
    for _ in range(2):
        await pull(buffer)
        buffer.fail(Q0, [job.offset])
        clock.advance(0.1)
        buffer.redelivery.expire(clock())
    await buffer.close()  # waits for the dead-letter write
    assert owner.dead_lettered == [job]
    figures = buffer.end_to_end["t"]
    assert counts(figures.attempts_dead) == {"2.0": 1}
    assert figures.acked.count() == 0 and figures.delivered.count() == 1


async def test_a_produce_time_ahead_of_now_counts_as_zero_and_is_counted(
        buffer: PullBuffer, wall: WallClock) -> None:
    owner = Owner(buffer)
    ahead = produced(owner.job("a"), PRODUCED_MS + 2_000)  # the producer's clock 2 s ahead
    unknown = produced(owner.job("b"), 0)  # no produce time: not observed
    await pull(buffer)
    buffer.ack(Q0, [ahead.offset, unknown.offset])
    figures = buffer.end_to_end["t"]
    assert counts(figures.delivered) == {"0.005": 1} and counts(figures.acked) == {"0.005": 1}
    assert figures.ahead == 2
    assert figures.attempts_acked.count() == 2  # attempts need no clock


def test_quantiles_interpolate_in_their_bucket_as_histogram_quantile_does() -> None:
    figures = EndToEnd()
    assert figures.acked.quantile(0.5) is None
    for age_ms in (1, 2, 3, 4, 30, 40, 60, 70):  # 4 in (0, 5 ms], 2 in (25, 50], 2 in (50, 100]
        figures.acked.observe(0, age_ms)
    assert figures.acked.quantile(0.5) == pytest.approx(0.005)
    assert figures.acked.quantile(0.75) == pytest.approx(0.05)
    assert figures.acked.quantile(0.99) == pytest.approx(0.05 + 0.05 * (7.92 - 6) / 2)
    figures.acked.observe(0, 10_000_000)  # above every bound: the highest bound
    assert figures.acked.quantile(1.0) == LATENCY_BOUNDS_S[-1]
    assert figures.acked.les[-2:] == ["3600.0", "+Inf"]
    assert _LATENCY_BOUNDS_MS == tuple(round(bound * 1000) for bound in LATENCY_BOUNDS_S)
    for attempts in (1, 1, 1, 2, 7):
        figures.attempts_acked.observe(0, attempts)
    # Attempts are counts: a quantile is its bucket's bound.
    assert [figures.attempts_acked.quantile(q) for q in (0.5, 0.7, 0.99)] == [1.0, 2.0, 8.0]
