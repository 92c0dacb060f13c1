"""The client verbs in the pull buffer (a fake owner, a fake clock, no Redis): release, extend, fail
details; tests/system/test_failures.py runs them over both adapters against a real proxy."""

from __future__ import annotations

from ddmq.proxy.core.types import FailNote, QueueId, QueueResult
from ddmq.proxy.engine.job import JobState
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.verbs import GENERIC_REASON, REASON_MAX_BYTES, apply_verbs, clip_reason, noted_fails_once

from ..engine_fakes import Clock, Owner

Q = QueueId("t", 0)


async def test_extensions_restart_the_deadline_up_to_max_extensions(buffer: PullBuffer, clock: Clock) -> None:
    owner = Owner(buffer, timeout_ms=1000, max_extensions=2, max_retry=5, retry_intervals_ms=[10])
    job = owner.job("k")
    await buffer.pull(None, 1, 0)
    for _ in range(2):
        buffer.redelivery.expire(clock.advance(0.9))
        buffer.extend(Q, [job.offset])
        assert job.state is JobState.IN_FLIGHT
    buffer.extend(Q, [job.offset])  # a third: past max_extensions, ignored
    buffer.redelivery.expire(clock.advance(0.9))
    assert job.state is JobState.IN_FLIGHT  # still within the second extension
    buffer.redelivery.expire(clock.advance(0.2))
    assert job.state is JobState.RETRY_WAIT and job.attempts == 1  # then it times out as usual
    stats = buffer.stats
    assert (stats.extended, stats.ignored_verbs, stats.timed_out) == (2, 1, 1)


async def test_a_release_puts_the_head_back_first_in_its_key_uncounted(buffer: PullBuffer) -> None:
    owner = Owner(buffer, max_retry=0)
    first, second = owner.job("k"), owner.job("k")
    batch = await buffer.pull(None, 10, 0, None, 2)  # an ordered run: both go out
    assert [m.offset for m in batch.messages] == [first.offset, second.offset]
    buffer.release(Q, [first.offset])
    assert (first.state, first.attempts) == (JobState.READY, 0)
    assert second.state is JobState.WAITING and second.attempts == 0  # back behind its head
    again = await buffer.pull(None, 10, 0)
    assert [m.offset for m in again.messages] == [first.offset]
    buffer.release(Q, [first.offset, 42])
    assert buffer.stats.released == 2 and buffer.stats.ignored_verbs == 1


async def test_fail_details_set_the_delay_within_the_cap_and_the_reason(buffer: PullBuffer, clock: Clock) -> None:
    owner = Owner(buffer, max_retry=5, retry_intervals_ms=[10], max_retry_after_ms=500)
    job = owner.job("k")
    await buffer.pull(None, 1, 0)
    result = QueueResult("g", "t", "0", [], [job.offset], fail_details=[FailNote(job.offset, 60_000, "é" * 1000)])
    once = noted_fails_once(result)
    assert once.fail == []
    apply_verbs(buffer, Q, once)
    assert job.state is JobState.RETRY_WAIT and job.attempts == 1
    assert len(job.last_error.encode()) <= REASON_MAX_BYTES and job.last_error.startswith("éé")
    buffer.redelivery.expire(clock.advance(0.49))
    assert job.state is JobState.RETRY_WAIT
    buffer.redelivery.expire(clock.advance(0.02))  # 60 s asked, capped to max_retry_after_ms
    assert job.state is JobState.READY
    assert clip_reason(None) == GENERIC_REASON and clip_reason("short") == "short"
