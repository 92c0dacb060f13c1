"""The pull buffer on its own (a fake owner, a fake clock, no Redis): queues, long polls, results, runs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

from ddmq.proxy.core.pull_codec import encode_pull_reply
from ddmq.proxy.core.types import PullBatch, QueueId
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.pull_buffer import PullBuffer

from ..engine_fakes import Clock, Owner

Q0 = QueueId("t", 0)


@pytest.fixture
def owner(buffer: PullBuffer) -> Owner:
    return Owner(buffer, retry_intervals_ms=[100], max_retry=3)


def picked(batch: PullBatch) -> list[tuple[int, int]]:
    """(qid, offset) of each message of ``batch``."""
    assert batch.queue is not None
    return [(batch.queue.qid, m.offset) for m in batch.messages]


def keys(batch: PullBatch) -> list[str]:
    return [m.key for m in batch.messages]


async def pull(
    buffer: PullBuffer, max_batch: int = 10, per_key: int = 1, held: Sequence[UpstreamJob] = ()
) -> PullBatch:
    return await buffer.pull(None, max_batch, 0, None, per_key, held)


async def test_pulls_go_round_robin_over_the_queues_with_ready_jobs(buffer: PullBuffer, owner: Owner) -> None:
    for i in range(3):
        owner.job(f"a{i}", qid=0)
    for i in range(2):
        owner.job(f"b{i}", qid=1)
    assert picked(await pull(buffer, max_batch=2)) == [(0, 0), (0, 1)]
    assert picked(await pull(buffer, max_batch=2)) == [(1, 0), (1, 1)]
    assert picked(await pull(buffer, max_batch=2)) == [(0, 2)]
    assert (await pull(buffer)).messages == []


async def test_a_parked_pull_is_answered_when_a_job_arrives(buffer: PullBuffer, owner: Owner) -> None:
    parked = asyncio.create_task(buffer.pull(None, 10, 60_000))
    while not buffer.parked:  # noqa: ASYNC110  (the pull parks on its first step)
        await asyncio.sleep(0)
    job = owner.job("a")
    assert picked(await parked) == [(0, job.offset)]
    assert job.state is JobState.IN_FLIGHT


async def test_answer_parked_answers_at_once_with_every_job_that_landed(buffer: PullBuffer, owner: Owner) -> None:
    """A read's batch lands, then answer_parked: the first parked pull gets the whole batch before the
    loop runs anything else, and the deferred wake it replaces does not run."""
    first = asyncio.create_task(buffer.pull(None, 10, 60_000))
    second = asyncio.create_task(buffer.pull(None, 10, 60_000))
    while buffer.parked < 2:  # noqa: ASYNC110  (each pull parks on its first step)
        await asyncio.sleep(0)
    jobs = [owner.job(f"k{i}") for i in range(3)]
    buffer.answer_parked()
    assert all(job.state is JobState.IN_FLIGHT for job in jobs)  # taken now, in this very step
    assert buffer.parked == 1
    assert picked(await first) == [(0, job.offset) for job in jobs]
    await asyncio.sleep(0)  # past where the cancelled deferred wake would have run
    assert not second.done() and buffer.parked == 1
    later = owner.job("later")  # the next landing wakes the remaining pull as before
    assert picked(await second) == [(0, later.offset)]
    buffer.answer_parked()  # nothing due: nothing happens
    assert buffer.parked == 0


async def test_a_parked_pull_answers_empty_at_its_linger(buffer: PullBuffer, owner: Owner) -> None:
    batch = await buffer.pull(None, 10, 10)
    assert batch.queue is None and batch.messages == []
    assert buffer.parked == 0


async def test_nothing_of_a_queue_goes_out_while_it_may_not_be_served(buffer: PullBuffer, owner: Owner) -> None:
    owner.unconfirmed.add(0)
    owner.job("a", qid=0)
    owner.job("b", qid=1)
    assert picked(await pull(buffer)) == [(1, 0)]
    assert (await pull(buffer)).messages == []
    owner.unconfirmed.clear()
    assert picked(await pull(buffer)) == [(0, 0)]


async def test_results_for_offsets_not_out_are_counted_and_ignored(buffer: PullBuffer, owner: Owner) -> None:
    out = owner.job("a")
    await pull(buffer)
    ready = owner.job("b")
    buffer.ack(Q0, [999, ready.offset])
    buffer.fail(Q0, [998, ready.offset])
    stats = buffer.queue_stats[Q0]
    assert (stats.unknown_acks, stats.unknown_fails, stats.acked, stats.failed) == (2, 2, 0, 0)
    assert ready.state is JobState.READY and owner.finished == []
    buffer.ack(Q0, [out.offset])
    assert owner.finished == [out] and stats.acked == 1


async def test_a_fail_makes_the_job_ready_again_after_its_retry_delay(
    buffer: PullBuffer, owner: Owner, clock: Clock
) -> None:
    job = owner.job("a")
    await pull(buffer)
    buffer.fail(Q0, [job.offset])
    assert job.state is JobState.RETRY_WAIT and (await pull(buffer)).messages == []
    buffer.redelivery.expire(clock.advance(0.1))
    assert picked(await pull(buffer)) == [(0, job.offset)] and job.attempts == 2


async def test_a_run_carries_a_keys_messages_consecutively_in_key_order(buffer: PullBuffer, owner: Owner) -> None:
    for key in ("a", "b", "a", "c", "b", "a", "a"):
        owner.job(key)
    batch = await pull(buffer, per_key=3)
    assert keys(batch) == ["a", "a", "a", "b", "b", "c"]
    assert [m.offset for m in batch.messages] == [0, 2, 5, 1, 4, 3]
    assert batch.runs == [3, 2, 1]
    assert (await pull(buffer, per_key=3)).messages == []  # a's fourth waits behind its run


async def test_a_reply_without_room_for_runs_carries_heads_only(buffer: PullBuffer, owner: Owner) -> None:
    for key in ("a", "b", "a"):
        owner.job(key)
    batch = await pull(buffer, max_batch=2, per_key=3)
    assert keys(batch) == ["a", "b"] and batch.runs is None


async def test_a_fail_inside_a_run_returns_the_rest_behind_the_failed_message(
    buffer: PullBuffer, owner: Owner, clock: Clock
) -> None:
    first, second, third = owner.job("a"), owner.job("a"), owner.job("a")
    await pull(buffer, per_key=3)
    buffer.ack(Q0, [first.offset])
    buffer.fail(Q0, [second.offset])
    assert second.state is JobState.RETRY_WAIT
    assert third.state is JobState.WAITING and third.attempts == 0  # not an attempt of its own
    assert buffer.redelivery.timed == 0
    buffer.ack(Q0, [third.offset])  # not out any more: ignored
    assert third.state is JobState.WAITING
    buffer.redelivery.expire(clock.advance(0.1))
    batch = await pull(buffer, per_key=3)
    assert [m.offset for m in batch.messages] == [second.offset]  # out again after a fail: alone
    buffer.ack(Q0, [second.offset])
    assert [m.offset for m in (await pull(buffer, per_key=3)).messages] == [third.offset]
    buffer.ack(Q0, [third.offset])
    assert owner.finished == [first, second, third]


async def test_a_timeout_inside_a_run_returns_the_rest(buffer: PullBuffer, owner: Owner, clock: Clock) -> None:
    first, second = owner.job("a"), owner.job("a")
    await buffer.pull(None, 10, 0, 1000, 2)
    buffer.redelivery.expire(clock.advance(2))
    assert first.state is JobState.RETRY_WAIT and second.state is JobState.WAITING
    assert buffer.queue_stats[Q0].timed_out == 1 and buffer.redelivery.timed == 0


async def test_a_held_keys_run_continues_in_a_later_pull(buffer: PullBuffer, owner: Owner) -> None:
    first = owner.job("a")
    owner.job("a")
    owner.job("a")
    owner.job("b")
    batch = await pull(buffer, max_batch=1, per_key=3)
    assert [m.offset for m in batch.messages] == [first.offset]
    assert keys(await pull(buffer, max_batch=1, per_key=3)) == ["b"]
    assert (await pull(buffer, per_key=3)).messages == []  # without what it holds: nothing
    batch = await pull(buffer, per_key=3, held=[first])
    assert [m.offset for m in batch.messages] == [1, 2] and batch.runs == [2]
    buffer.ack(Q0, [0, 1, 2])
    assert [job.offset for job in owner.finished] == [0, 1, 2]


# -- max_reply_bytes: a reply stops before the message that would pass it ---------------------------
# 10,000 bytes leave 8,976 for messages after the Thrift frame's overhead (1,024); a message of a
# one-character key and a value of n bytes counts n + 52.


async def test_a_reply_stops_before_the_message_that_would_pass_max_reply_bytes(buffer: PullBuffer) -> None:
    owner = Owner(buffer, max_reply_bytes=10_000)
    jobs = [owner.job(f"{i}", size=3000) for i in range(5)]
    first = await pull(buffer)
    assert [m.offset for m in first.messages] == [0, 1]
    assert len(encode_pull_reply(0xFFFFFFFF, "g", "t", "0", first.messages)) <= 10_000
    # The rest is not delivered: ready, first in line, no attempt, no deadline.
    assert [job.state for job in jobs[2:]] == [JobState.READY] * 3 and {job.attempts for job in jobs[2:]} == {0}
    assert buffer.in_flight == 2 and buffer.queue_stats[Q0].delivered == 2 and buffer.ready == 3
    assert [m.offset for m in (await pull(buffer)).messages] == [2, 3]
    assert [m.offset for m in (await pull(buffer)).messages] == [4]
    assert {job.attempts for job in jobs} == {1}


async def test_a_message_larger_than_max_reply_bytes_goes_alone_with_a_warning(
    buffer: PullBuffer, caplog: pytest.LogCaptureFixture
) -> None:
    owner = Owner(buffer, max_reply_bytes=10_000)
    owner.job("a", size=10)
    big = owner.job("b", size=20_000)
    owner.job("c", size=10)
    assert keys(await pull(buffer)) == ["a"]  # b would pass the limit: it waits for a reply of its own
    assert not caplog.records
    assert keys(await pull(buffer)) == ["b"]  # alone, however large
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert f"t#0@{big.offset} takes 20052 bytes" in warning.getMessage()
    assert "max_reply_bytes (10000)" in warning.getMessage()
    assert keys(await pull(buffer)) == ["c"]


async def test_a_run_stops_at_max_reply_bytes_and_its_rest_waits_uncounted(buffer: PullBuffer) -> None:
    owner = Owner(buffer, max_reply_bytes=10_000)
    jobs = [owner.job("a", size=3000) for _ in range(4)]
    batch = await pull(buffer, per_key=10)
    assert [m.offset for m in batch.messages] == [0, 1] and batch.runs == [2]
    assert [(job.state, job.attempts) for job in jobs[2:]] == [(JobState.WAITING, 0)] * 2
    buffer.ack(Q0, [0, 1])
    batch = await pull(buffer, per_key=10)
    assert [m.offset for m in batch.messages] == [2, 3] and batch.runs == [2]
    buffer.ack(Q0, [2, 3])
    assert owner.finished == jobs


async def test_runs_of_several_keys_fill_a_reply_across_keys_up_to_max_reply_bytes(buffer: PullBuffer) -> None:
    owner = Owner(buffer, max_reply_bytes=10_000)
    for key in "ababab":
        owner.job(key, size=2000)
    batch = await pull(buffer, per_key=10)
    # heads a and b, then one more of each (8,208 bytes); a's third would pass the limit
    assert keys(batch) == ["a", "a", "b", "b"] and [m.offset for m in batch.messages] == [0, 2, 1, 3]
    assert batch.runs == [2, 2]


async def test_a_released_successor_goes_out_before_the_heads_read_after_it(buffer: PullBuffer, owner: Owner) -> None:
    """It waited behind its key; it does not wait again behind newer keys: a queue's oldest ready first."""
    a0, x, a1, y, z = (owner.job(key) for key in ("a", "x", "a", "y", "z"))
    assert picked(await pull(buffer, max_batch=1)) == [(0, a0.offset)]
    buffer.ack(Q0, [a0.offset])
    assert picked(await pull(buffer)) == [(0, job.offset) for job in (x, a1, y, z)]


async def test_a_retried_message_goes_out_before_younger_heads(
    buffer: PullBuffer, owner: Owner, clock: Clock
) -> None:
    a, b, c = (owner.job(key) for key in "abc")
    assert picked(await pull(buffer, max_batch=1)) == [(0, a.offset)]
    buffer.fail(Q0, [a.offset])
    buffer.redelivery.expire(clock.advance(0.1))
    assert picked(await pull(buffer)) == [(0, a.offset), (0, b.offset), (0, c.offset)]


async def test_acks_in_any_order_deliver_every_message_once_in_key_order_oldest_ready_first(
    buffer: PullBuffer, owner: Owner
) -> None:
    rng = random.Random(7)
    keys_of = [f"k{rng.randrange(40)}" for _ in range(600)]
    jobs: list[UpstreamJob] = []
    delivered: dict[str, list[tuple[int, int]]] = {}
    out: list[tuple[int, int]] = []  # (qid, offset) in flight

    async def pull_checked(max_batch: int) -> None:
        ready = sorted((job.queue.qid, job.offset) for job in buffer.jobs() if job.state is JobState.READY)
        batch = await pull(buffer, max_batch=max_batch)
        if batch.messages:
            got = picked(batch)
            # the reply is the oldest ready messages of its queue
            assert got == [entry for entry in ready if entry[0] == got[0][0]][: len(got)]
            out.extend(got)
            for entry, m in zip(got, batch.messages, strict=True):
                delivered.setdefault(m.key, []).append(entry)

    def ack(entries: list[tuple[int, int]]) -> None:
        for qid, offset in entries:
            buffer.ack(QueueId("t", qid), [offset])

    for start in range(0, len(keys_of), 100):  # the reader's batches land between pulls
        jobs += [owner.job(key, qid=start // 100 % 2) for key in keys_of[start : start + 100]]
        for _ in range(30):
            await pull_checked(rng.randrange(1, 8))
            rng.shuffle(out)  # acks come back in any order
            cut = rng.randrange(len(out) + 1)
            ack(out[:cut])
            del out[:cut]
    while out or buffer.ready:
        await pull_checked(10)
        ack(out)
        out.clear()
    expected: dict[str, list[tuple[int, int]]] = {}
    for job in jobs:
        expected.setdefault(job.message.key, []).append((job.queue.qid, job.offset))
    assert delivered == expected  # per key: every message exactly once, in queue order
    assert len(owner.finished) == len(jobs)


async def test_a_dropped_queue_leaves_nothing_of_it_and_the_other_queues_serve_on(
    buffer: PullBuffer, owner: Owner
) -> None:
    q1 = QueueId("t", 1)
    out, parked = owner.job("a", qid=1), owner.job("b", qid=1)
    other = owner.job("c", qid=0)
    assert picked(await pull(buffer, max_batch=1)) == [(1, out.offset)]
    buffer.hold(parked)  # its queue's ready line is empty now, the queue still in the round-robin
    dropped = buffer.drop_queue(q1)
    assert dropped == [out, parked] and all(job.state is JobState.FINISHED for job in dropped)
    assert buffer.job(q1, out.offset) is None and buffer.redelivery.timed == 0 and buffer.ready == 1
    assert picked(await pull(buffer)) == [(0, other.offset)]
    assert (await pull(buffer)).messages == []
    buffer.ack(q1, [out.offset])  # a late ack of the queue gone: ignored
    assert buffer.queue_stats[q1].unknown_acks == 1 and owner.finished == []
    assert buffer.drop_queue(q1) == []
