"""The breaker's state machine on a fake clock, and the breakers and pauses of a group on a real pull
buffer (a fake owner, no Redis): what they hand out, that they count no attempts, and key order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ddmq.config.schema import BreakerConfig
from ddmq.protocol.redis.pauses import Pause
from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.breaker import Breaker, BreakerState
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.groups.breaker import GroupBreakers
from ddmq.proxy.groups.pausing import PauseWatch

from ..engine_fakes import Clock, Owner

Q0 = QueueId("t", 0)
SETTINGS = BreakerConfig(enabled=True, window=10, failure_share=0.5, min_attempts=4, probe=2, open_ms=100,
                         max_open_ms=300)


def breaker(clock: Clock, allowance: dict[str, int] | None = None) -> tuple[Breaker, list[BreakerState]]:
    seen: list[BreakerState] = []
    made = Breaker("g", "t", SETTINGS, lambda b: seen.append(b.state), {} if allowance is None else allowance,
                   clock)
    return made, seen


def test_it_opens_once_the_window_holds_min_attempts_and_enough_failures() -> None:
    made, seen = breaker(Clock())
    for _ in range(3):
        made.failed("boom")
    assert made.state is BreakerState.CLOSED  # 3 of 3 failed, but fewer than min_attempts
    made.failed("boom")
    assert made.state is BreakerState.OPEN and seen == [BreakerState.OPEN]
    assert made.transitions == {"open": 1}


def test_successes_keep_the_failure_share_under_the_threshold() -> None:
    made, _ = breaker(Clock())
    for _ in range(20):
        made.succeeded(2)
        made.failed()  # a third of the window
    assert made.state is BreakerState.CLOSED and 0.3 <= made.failure_share <= 0.4


def test_the_window_forgets_outcomes_older_than_its_size() -> None:
    made, _ = breaker(Clock())
    made.failed()
    made.failed()
    made.failed()
    made.succeeded(7)  # the window of 10 is full: 3 failures
    made.succeeded(3)  # the 3 failures fell out
    assert made.failure_share == 0.0
    for _ in range(4):
        made.failed()
    assert made.state is BreakerState.CLOSED  # 4 of 10
    made.failed()
    assert made.state is BreakerState.OPEN  # 5 of 10


def test_open_then_half_open_then_closed_after_probe_successes() -> None:
    clock = Clock()
    allowance: dict[str, int] = {}
    made, seen = breaker(clock, allowance)
    for _ in range(4):
        made.failed()
    made.tick(clock.advance(0.05))
    assert made.state is BreakerState.OPEN and "t" not in allowance
    made.succeeded()  # an ack of what went out before: no news while open
    made.tick(clock.advance(0.06))
    assert made.state is BreakerState.HALF_OPEN and allowance == {"t": 2}
    allowance["t"] = 0  # the delivery handed both probes out
    made.succeeded()
    assert made.state is BreakerState.HALF_OPEN and allowance == {"t": 1}  # one more may go out
    made.succeeded()
    assert made.state is BreakerState.CLOSED and allowance == {} and made.failure_share == 0.0
    assert seen == [BreakerState.OPEN, BreakerState.HALF_OPEN, BreakerState.HALF_OPEN, BreakerState.CLOSED]


def test_a_failed_probe_opens_it_again_for_twice_as_long_up_to_max_open_ms() -> None:
    clock = Clock()
    made, _ = breaker(clock)
    for _ in range(4):
        made.failed()
    spans = []
    for _ in range(3):
        made.tick(clock.advance(made.open_for_ms / 1000))
        assert made.state is BreakerState.HALF_OPEN
        made.failed("still down")
        assert made.state is BreakerState.OPEN
        spans.append(made.open_for_ms)
    assert spans == [200, 300, 300]
    made.tick(clock.advance(0.299))
    assert made.state is BreakerState.OPEN
    made.tick(clock.advance(0.002))
    made.succeeded(2)
    assert made.state is BreakerState.CLOSED and made.open_for_ms == 100  # the backoff starts again


def test_bad_settings_are_refused_with_their_field() -> None:
    for bad, field in (({"failure_share": 1.5}, "failure_share"), ({"probe": 0}, "probe"),
                       ({"window": 0}, "window")):
        with pytest.raises(ValueError, match=field):
            BreakerConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_attempts"):
        BreakerConfig(window=10, min_attempts=11)
    with pytest.raises(ValueError, match="max_open_ms"):
        BreakerConfig(open_ms=1000, max_open_ms=999)


# on a pull buffer (the clock and buffer fixtures: tests/proxy/conftest.py) ----------------------


@pytest.fixture
async def held(buffer: PullBuffer) -> AsyncIterator[PauseWatch]:
    breakers = GroupBreakers("g", buffer)
    breakers.configure("t", SETTINGS)
    watch = PauseWatch("g", buffer, None, 1000, breakers)  # type: ignore[arg-type]  # never started: no reads
    watch.pauses = []
    watch.hold()
    yield watch
    breakers.close()


async def pull(buffer: PullBuffer, max_batch: int = 10) -> list[UpstreamJob]:
    batch = await buffer.pull(None, max_batch, 0)
    return [buffer.job(Q0, m.offset) for m in batch.messages]  # type: ignore[misc]


async def test_an_open_breaker_counts_no_attempts_and_its_probes_bring_every_key_through_in_order(
    buffer: PullBuffer, held: PauseWatch, clock: Clock
) -> None:
    owner = Owner(buffer, retry_intervals_ms=[0], max_retry=1)
    jobs = [owner.job(f"k{i % 20}") for i in range(40)]
    first = await pull(buffer)
    assert len(first) == 10
    buffer.fail(Q0, [job.offset for job in first])  # the 4th failure opens it: it and the rest count nothing
    assert held.breakers.state("t") == "open"
    counted = [job for job in first if job.attempts]
    assert counted == first[:3] and all(job.state is JobState.RETRY_WAIT for job in counted)
    assert all(job.state is JobState.READY and job.attempts == 0 for job in first[3:])
    buffer.redelivery.expire(clock.advance(0.01))
    assert await pull(buffer) == []  # open: nothing goes out, the retries due wait ready
    await asyncio.sleep(SETTINGS.open_ms / 1000 + 0.05)  # the breaker's own timer half-opens it
    assert held.breakers.state("t") == "half_open"
    probes = await pull(buffer)
    assert len(probes) == 2 and len({job.order_key for job in probes}) == 2  # heads only, probe at a time
    assert await pull(buffer) == []
    buffer.fail(Q0, [probes[0].offset])  # still failing: open again, uncounted
    assert held.breakers.state("t") == "open" and probes[0].attempts in (0, 1)
    buffer.ack(Q0, [probes[1].offset])  # acks still count while open
    assert probes[1] in owner.finished
    await asyncio.sleep(0.25)
    delivered: list[UpstreamJob] = [probes[1]]
    while len(owner.finished) < len(jobs):
        out = await pull(buffer)
        if not out:
            await asyncio.sleep(0.01)
            continue
        for job in out:
            buffer.ack(Q0, [job.offset])
            held.breakers.breakers["t"].succeeded()
        delivered += out
    assert held.breakers.state("t") == "closed"
    assert owner.dead_lettered == [] and buffer.stats.retried <= 3
    for key in {job.order_key for job in jobs}:
        assert [j.offset for j in owner.finished if j.order_key == key] == \
            [j.offset for j in jobs if j.order_key == key]


async def test_a_deadline_that_runs_out_while_paused_counts_no_attempt(
    buffer: PullBuffer, held: PauseWatch, clock: Clock
) -> None:
    owner = Owner(buffer, timeout_ms=1000, max_retry=0)
    jobs = [owner.job("k") for _ in range(3)]
    out = await pull(buffer, 1)
    assert out == [jobs[0]]
    held.breakers.configure("t", BreakerConfig())  # no breaker: the pause alone
    held._apply([Pause("t", "test", 1, None)])
    buffer.redelivery.expire(clock.advance(1.1))
    assert jobs[0].state is JobState.READY and jobs[0].attempts == 0 and owner.dead_lettered == []
    assert await pull(buffer) == []
    buffer.fail(Q0, [jobs[0].offset])  # not in flight any more: ignored
    held._apply([])
    for job in jobs:
        assert await pull(buffer) == [job]
        buffer.ack(Q0, [job.offset])
    assert owner.finished == jobs and owner.dead_lettered == []
