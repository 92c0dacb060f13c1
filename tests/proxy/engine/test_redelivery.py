"""Redelivery on its own, with a fake clock and no Redis: deadlines, the retry schedule, dead letters."""

from __future__ import annotations

from collections import defaultdict

from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.redelivery import TICK_S, BufferStats, Redelivery

from ..engine_fakes import Clock, Owner


class Harness:
    """A Redelivery whose callbacks record what they are told; ``behind`` jobs wait for their run's head."""

    def __init__(self, **config: object) -> None:
        self.clock = Clock()
        self.owner = Owner(**config)
        self.stats: defaultdict[QueueId, BufferStats] = defaultdict(BufferStats)
        self.expired: list[UpstreamJob] = []
        self.ready: list[UpstreamJob] = []
        self.finished: list[UpstreamJob] = []
        self.behind: set[UpstreamJob] = set()
        #: head -> the run member its failed attempt returns to waiting (as the buffer does).
        self.returns: dict[UpstreamJob, UpstreamJob] = {}
        self.redelivery = Redelivery("g", self.stats, self._expired, self.ready.append, self._finish, self.clock)

    def _expired(self, job: UpstreamJob) -> bool:
        self.expired.append(job)
        if (member := self.returns.get(job)) is not None:
            member.state = JobState.WAITING
        return job not in self.behind

    def _finish(self, job: UpstreamJob) -> None:
        job.state = JobState.FINISHED
        self.finished.append(job)

    def out(self, *jobs: UpstreamJob, timeout_ms: int = 1000) -> None:
        """``jobs`` handed to a client now."""
        for job in jobs:
            job.state = JobState.IN_FLIGHT
            job.attempts += 1
        self.redelivery.watch(jobs, timeout_ms)

    def tick(self, seconds: float) -> None:
        self.redelivery.expire(self.clock.advance(seconds))


def test_a_job_in_flight_expires_at_its_deadline_not_before() -> None:
    h = Harness()
    job = h.owner.job("a")
    h.out(job, timeout_ms=1000)
    assert h.redelivery.timed == 1
    h.tick(0.9)
    assert h.expired == []
    h.tick(0.1 + TICK_S)
    assert h.expired == [job]
    assert h.redelivery.timed == 0 and h.redelivery.wheel_ticks == 0
    h.tick(10)
    assert h.expired == [job]  # expired once


def test_an_acked_job_leaves_the_wheel_and_never_expires() -> None:
    h = Harness()
    acked, kept = h.owner.job("a"), h.owner.job("b")
    h.out(acked, kept)
    h.redelivery.unwatch(acked)
    acked.state = JobState.FINISHED
    assert h.redelivery.timed == 1
    h.tick(2)
    assert h.expired == [kept]
    h.out(acked)
    h.redelivery.unwatch(acked)
    assert h.redelivery.timed == 0 and h.redelivery.wheel_ticks == 0  # an emptied tick is dropped


def test_retries_come_due_in_schedule_order_after_their_delays() -> None:
    h = Harness(retry_intervals_ms=[100, 1000], max_retry=5)
    first, second, third = h.owner.job("a"), h.owner.job("b"), h.owner.job("c")
    second.attempts = 2  # its second retry: 1000 ms
    first.attempts = 1  # its first retry: 100 ms
    third.attempts = 4  # past the schedule: its last value repeats
    for job in (second, first, third):
        h.redelivery.failed_attempt(job, "boom")
        assert job.state is JobState.RETRY_WAIT and job.last_error == "boom"
    h.tick(0.05)
    assert h.ready == []
    h.tick(0.1)
    assert h.ready == [first]
    h.tick(0.8)
    assert h.ready == [first]
    h.tick(0.1)
    assert h.ready == [first, second, third]  # same delay: in the order they failed
    assert h.stats[first.queue].retried == 3


def test_a_retry_due_for_a_pushed_topic_goes_back_to_its_action() -> None:
    h = Harness(retry_intervals_ms=[100])
    pushed: list[UpstreamJob] = []
    h.redelivery.route_retries("t", pushed.append)
    job = h.owner.job("a")
    job.attempts = 1
    h.redelivery.retry_later(job, "HTTP 503")
    assert h.stats[job.queue].failed == 1
    h.tick(0.1)
    assert pushed == [job] and h.ready == []


def test_a_job_finished_while_waiting_for_its_retry_is_not_retried() -> None:
    h = Harness(retry_intervals_ms=[100])
    job = h.owner.job("a")
    job.attempts = 1
    h.redelivery.failed_attempt(job, "boom")
    job.state = JobState.FINISHED  # a late ack
    h.tick(1)
    assert h.ready == [] and h.stats[job.queue].retried == 0


async def test_past_max_retry_a_job_is_dead_lettered_then_finished() -> None:
    h = Harness(max_retry=2)
    job = h.owner.job("a")
    job.attempts = 3  # the first delivery and two retries
    h.redelivery.failed_attempt(job, "still failing")
    assert h.redelivery.scheduled == 0
    await h.redelivery.close()  # waits for the write under way
    assert h.owner.dead_lettered == [job] and h.finished == [job]
    assert h.stats[job.queue].dead_lettered == 1 and job.last_error == "still failing"


async def test_a_dead_letter_write_that_fails_is_retried_until_it_succeeds() -> None:
    h = Harness(max_retry=0)
    h.owner.dead_letter_errors = 2
    job = h.owner.job("a")
    job.attempts = 1
    h.redelivery.failed_attempt(job, "boom")
    await h.redelivery.close()
    assert h.owner.dead_letter_errors == 0  # both failures were met
    assert h.owner.dead_lettered == [job] and h.finished == [job]
    assert h.stats[job.queue].dead_lettered == 1


async def test_a_job_acked_while_its_dead_letter_write_fails_is_not_written() -> None:
    h = Harness(max_retry=0)
    h.owner.dead_letter_errors = 1
    job = h.owner.job("a")
    job.attempts = 1
    h.redelivery.dead_letter(job, "boom")
    job.state = JobState.FINISHED  # acked late, before the retried write
    await h.redelivery.close()
    assert h.owner.dead_lettered == [] and h.finished == []
    assert h.stats[job.queue].dead_lettered == 0


def test_a_run_member_behind_its_head_is_timed_again_for_the_next_tick() -> None:
    h = Harness()
    head, member = h.owner.job("a"), h.owner.job("a")
    h.out(head, member)
    h.behind.add(member)  # its head is unfinished: the buffer answers that it waits
    h.tick(1 + TICK_S)
    assert set(h.expired) == {head, member}
    assert h.redelivery.timed == 1 and member.deadline == int(h.clock.now / TICK_S) + 1
    h.tick(TICK_S)
    assert h.expired.count(member) == 2  # due again one tick later, not forgotten


def test_a_run_member_returned_by_its_head_is_not_timed_again() -> None:
    h = Harness()
    head, member = h.owner.job("a"), h.owner.job("a")
    h.out(head, member)
    h.behind.add(member)
    h.returns[head] = member
    h.tick(1 + TICK_S)
    assert head in h.expired
    assert h.redelivery.timed == 0
