"""PullBuffer: where a group's runnable jobs wait for pull clients.

One buffer per consumer group holds:

- *ready* jobs per queue, served round-robin across queues, a batch of one queue per pull, the oldest
  offsets of the queue first (:class:`~ddmq.proxy.engine.ready_line.ReadyLine`);
- *parked* long-poll requests, answered as soon as jobs are ready or empty at their linger time;
- every unfinished job that entered the buffer, by (queue, offset), so acks and fails find it.

Deadlines of jobs in flight, the retry schedule and dead-letter writes are the group's
:class:`~ddmq.proxy.engine.redelivery.Redelivery` (:attr:`PullBuffer.redelivery`); push actions report their
failed attempts there too. A job stays the head of its order key through all of this, so its key's
order holds. The buffer reaches a job's consumer only through :class:`~ddmq.proxy.engine.job.JobOwner`.

An ack counts only for a job that was handed to a client of the group at least once
(``attempts > 0``); then it finishes the job whatever state it is in now (a late ack after a timeout
still counts: the message was processed). Any client of the group may send it, not only the one the
job went to: DDMQ clients resend a batch's results on a new connection after a reconnect. Acks for
jobs never delivered, and for offsets the buffer does not hold, are counted and ignored, so no
client can finish a backlog it never pulled. A fail counts only for a job in flight.

Ordered runs (``max_per_key`` > 1): the room a queue's ready heads leave in a reply goes, one message
per key per round, to the successors waiting behind them in their keys' chains, at most
``max_per_key`` per key; a reply's messages of a key are consecutive, in key order. Such *run members*
go in flight but stay in their key's chain, in a map of their own (``_runs``), so clients without runs
pay nothing for them. A member is finished by its own ack once it is its key's head; an ack before
that is ignored (counted unknown: what is ahead of it may still fail). When a message fails or times
out, the later members of its run return to waiting, their attempt uncounted, and go out again once
it is finished. A replayable lease's later pulls may continue the runs of the keys it holds (see
:mod:`ddmq.proxy.engine.replays`). DESIGN.md ("Engine", ordered runs) has the whole story.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Final

from ddmq.protocol.wire.pull_codec import (
    MESSAGE_OVERHEAD_BYTES,
    UTF8_MAX_BYTES,
)
from ddmq.proxy.core.types import THRIFT_REPLY, PullBatch, QueueId, ReplySize
from ddmq.proxy.engine.holds import HoldBuffer
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.ready_line import ReadyLine
from ddmq.proxy.engine.redelivery import BufferStats, Redelivery
from ddmq.proxy.engine.runs import _log_alone

log: Final = logging.getLogger(__name__)

__all__ = ["THRIFT_REPLY", "BufferStats", "PullBuffer"]

_EMPTY: Final = PullBatch(None, [])

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_READY: Final = JobState.READY
_IN_FLIGHT: Final = JobState.IN_FLIGHT
_WAITING: Final = JobState.WAITING
_FINISHED: Final = JobState.FINISHED


@dataclass(eq=False)
class _Waiter:
    topic: str | None
    max_batch: int
    future: asyncio.Future[PullBatch] = field(repr=False)
    timeout_ms: int | None = None
    max_per_key: int = 1
    reply: ReplySize = THRIFT_REPLY
    early: Callable[[PullBatch], None] | None = None


class PullBuffer(HoldBuffer):
    def __init__(self, group: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.group = group
        #: Per queue; :attr:`stats` sums them. A queue's entry lives as long as the buffer.
        self.queue_stats: defaultdict[QueueId, BufferStats] = defaultdict(BufferStats)
        self._ready: dict[QueueId, ReadyLine] = {}
        self._ready_order: deque[QueueId] = deque()  # queues with ready jobs, round-robin
        self._ready_count = 0
        self._jobs: dict[QueueId, dict[int, UpstreamJob]] = {}
        self._runs: dict[QueueId, dict[int, UpstreamJob]] = {}  # run members in flight behind their heads
        #: Offsets finished elsewhere (a replay lease acked at another proxy) that were read here but wait
        #: behind their key: finished instead of made ready when they get here (see finish_elsewhere).
        self._finished_elsewhere: dict[QueueId, set[int]] = {}
        self._waiters: deque[_Waiter] = deque()
        self._wake: asyncio.Handle | None = None  # the deferred _wake_waiters, while one is due
        self.redelivery = Redelivery(group, self.queue_stats, self._timed_out, self._make_ready, self._finish, clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("PullBuffer already started")
        self._loop = asyncio.get_running_loop()
        self.redelivery.start()

    async def close(self) -> None:
        """Answer parked pulls (empty), stop timers, wait for dead-letter writes under way."""
        self._closed = self.redelivery.closed = True
        self._answer_all_empty()
        await self.redelivery.close()

    def stop_serving(self) -> None:
        """From now on pulls answer empty at once (shutdown); acks keep working."""
        self._closed = self.redelivery.closed = True
        self._answer_all_empty()

    # jobs in -----------------------------------------------------------------------------------

    def add(self, job: UpstreamJob) -> None:
        """A runnable job reached the PullServer action."""
        queue = job.queue
        if self._finished_elsewhere:
            done = self._finished_elsewhere.get(queue)
            if done is not None and job.offset in done:
                done.discard(job.offset)
                if not done:
                    del self._finished_elsewhere[queue]
                self.queue_stats[queue].acked += 1
                self._finish(job)
                return
        jobs = self._jobs.get(queue)
        if jobs is None:
            jobs = self._jobs[queue] = {}
        jobs[job.offset] = job
        if job.consumer.key_records and (held := job.consumer.parking.arrived(job)) is not None:
            if held != "parked":  # a sequenced key: dead-lettered behind its earlier message
                self.redelivery.dead_letter(job, held)
            return
        self._make_ready(job)

    def _make_ready(self, job: UpstreamJob) -> None:
        job.state = _READY
        queue = job.queue
        ready = self._ready.get(queue)
        if ready is None:
            ready = self._ready[queue] = ReadyLine()
        if not ready:
            self._ready_order.append(queue)
        ready.append(job)
        self._ready_count += 1
        if self._waiters and self._wake is None:
            # Deferred so a reader's whole batch lands before parked pulls are answered.
            assert self._loop is not None
            self._wake = self._loop.call_soon(self._wake_waiters)

    def answer_parked(self) -> None:
        """Answer parked pulls now (a read's batch has landed), not after this loop iteration's other reads."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake_waiters()

    # pulls -------------------------------------------------------------------------------------

    async def pull(
        self,
        topic: str | None,
        max_batch: int,
        linger_ms: int,
        timeout_ms: int | None = None,
        max_per_key: int = 1,
        held: Sequence[UpstreamJob] = (),
        reply: ReplySize = THRIFT_REPLY,
        early: Callable[[PullBatch], None] | None = None,
    ) -> PullBatch:
        """Ready messages of one queue, waiting up to ``linger_ms`` for some. They stay in flight for
        ``timeout_ms`` (None: the topic's ``timeout_ms``) unless acked or failed first. With
        ``max_per_key`` > 1 the reply may carry ordered runs of up to that many messages per key.

        The reply stays within the topic's ``max_reply_bytes`` as ``reply`` counts bytes: it stops
        before the message that would pass it (which stays ready, or waiting in its key's chain, as if
        never looked at), except that it always carries one message, however large.

        ``held``: the last message of each key that this reader holds from its earlier pulls, all
        processed in order before this reply (a replayable lease's pulls, read in index order by one
        task). With runs, those keys continue their runs here with what waits behind them, at once only:
        a pull that has to wait takes fresh heads.

        ``early``: called with the batch that answers this pull after it parked, in the step that
        answers it (a read landing), before this coroutine resumes: a server writes its reply there."""
        if not self._closed:
            batch = self._take(topic, max_batch, timeout_ms, max_per_key, held, reply)
            if batch.messages or linger_ms <= 0:
                return batch
        if self._closed:
            return _EMPTY
        loop = asyncio.get_running_loop()
        waiter = _Waiter(topic, max_batch, loop.create_future(), timeout_ms, max_per_key, reply, early)
        self._waiters.append(waiter)
        expiry = loop.call_later(linger_ms / 1000, _resolve, waiter.future, _EMPTY)
        try:
            return await waiter.future
        finally:
            expiry.cancel()
            if not waiter.future.done():
                waiter.future.cancel()

    def _wake_waiters(self) -> None:
        self._wake = None
        waiters = self._waiters
        unserved: deque[_Waiter] = deque()
        while waiters and self._ready_count:
            waiter = waiters.popleft()
            if waiter.future.done():
                continue
            batch = self._take(waiter.topic, waiter.max_batch, waiter.timeout_ms, waiter.max_per_key, (), waiter.reply)
            if batch.messages:
                waiter.future.set_result(batch)
                if waiter.early is not None:
                    waiter.early(batch)
            else:
                unserved.append(waiter)
        unserved.extend(w for w in waiters if not w.future.done())
        self._waiters = unserved

    def _answer_all_empty(self) -> None:
        while self._waiters:
            _resolve(self._waiters.popleft().future, _EMPTY)

    def _take(
        self,
        topic: str | None,
        max_batch: int,
        timeout_ms: int | None = None,
        max_per_key: int = 1,
        held: Sequence[UpstreamJob] = (),
        reply: ReplySize = THRIFT_REPLY,
    ) -> PullBatch:
        order = self._ready_order
        size = reply.message
        # Thrift's bound written out for messages without properties: a call per message would cost
        # more than the rest of the check (bench/instructions.py).
        inline = reply is THRIFT_REPLY
        for _ in range(len(order)):
            queue = order.popleft()
            if topic is not None and queue.topic != topic:
                order.append(queue)
                continue
            ready = self._ready[queue]
            if ready and not ready.first().consumer.may_serve(queue.qid):
                order.append(queue)  # lease not confirmed lately: deliver nothing until it is
                continue
            batch: list[UpstreamJob] = []
            # bytes left in the reply (a queue's jobs share their topic's consumer)
            room = ready.first().consumer.config.max_reply_bytes - reply.overhead if ready else 0
            while ready and len(batch) < max_batch:
                job = ready.popleft()
                self._ready_count -= 1
                if job.state is _READY:
                    m = job.message
                    if inline and not m.properties:
                        needs = len(m.value) + (len(m.key) + len(m.tag)) * UTF8_MAX_BYTES + MESSAGE_OVERHEAD_BYTES
                    else:
                        needs = size(m)
                    if needs > room and batch:
                        ready.put_front(job)  # it stays first in line, never delivered
                        self._ready_count += 1
                        break
                    room -= needs
                    batch.append(job)
            if ready:
                order.append(queue)
            if batch:
                runs = None
                if room < 0:
                    _log_alone(batch[0], size(batch[0].message))
                elif max_per_key > 1 and len(batch) < max_batch:
                    batch, runs = self._with_runs(queue, batch, max_batch, max_per_key, held, room, reply)
                self._deliver(batch, timeout_ms)
                return PullBatch(queue, [job.message for job in batch], runs)
        if held and max_per_key > 1:
            return self._continue_runs(topic, max_batch, timeout_ms, max_per_key, held, reply)
        return _EMPTY

    def _deliver(self, batch: list[UpstreamJob], timeout_ms: int | None = None) -> None:
        if timeout_ms is None:
            timeout_ms = batch[0].consumer.config.timeout_ms
        for job in batch:
            job.state = _IN_FLIGHT
            job.attempts += 1
            job.extensions = 0
        self.redelivery.watch(batch, timeout_ms)
        self.queue_stats[batch[0].queue].delivered += len(batch)

    # results -----------------------------------------------------------------------------------

    def ack(self, queue: QueueId, offsets: Iterable[int]) -> None:
        jobs = self._jobs.get(queue)
        members = self._runs.get(queue)
        stats = self.queue_stats[queue]
        redelivery = self.redelivery  # its unwatch called directly: compiled, a bound alias goes through Python
        for offset in offsets:
            job = jobs.get(offset) if jobs is not None else None
            if job is None and members is not None:
                # A run member counts once it is its key's head (what was ahead of it finished, maybe
                # earlier in this very list); finished from here, it need not move to the heads first.
                job = members.get(offset)
                if job is not None:
                    if job.consumer.is_head(job):
                        del members[offset]
                    else:
                        job = None
            if job is None or not job.attempts or job.state is _FINISHED:
                # Never handed out (or not held): finishing it would erase a message nobody processed.
                stats.unknown_acks += 1
                log.debug("ignoring ack for undelivered offset %s@%s of group %s", queue, offset, self.group)
                continue
            if job.state is _IN_FLIGHT:
                redelivery.unwatch(job)
            else:
                stats.late_acks += 1
            stats.acked += 1
            self._finish(job)
        if members is not None and not members and self._runs.get(queue) is members:
            del self._runs[queue]

    def finish_elsewhere(self, queue: QueueId, offsets: Iterable[int]) -> int:
        """Finish read offsets of ``queue`` that a client acked at another proxy (a replay lease served
        by a proxy that died, whose queue this one took): a ready job never handed out here is finished
        at once, one still waiting behind its key when it gets here. Returns how many were handed out
        here already (too late: they are in flight or were delivered)."""
        late = 0
        for offset in offsets:
            job = self.job(queue, offset)
            if job is None:
                self._finished_elsewhere.setdefault(queue, set()).add(offset)
            elif job.attempts or job.state is not _READY:
                late += 1
            else:
                self.queue_stats[queue].acked += 1
                self._finish(job)  # its stale entry in the ready line is skipped when taken
        return late

    def fail(
        self,
        queue: QueueId,
        offsets: Iterable[int],
        reason: str = "client reported failure",
        retry_after_ms: int | None = None,
    ) -> None:
        jobs = self._jobs.get(queue)
        stats = self.queue_stats[queue]
        for offset in offsets:
            job = jobs.get(offset) if jobs is not None else None
            if job is None and queue in self._runs:
                job = self._run_head(queue, offset)
                if job is None and (member := self._runs[queue].get(offset)) is not None:
                    # Failed ahead of its turn (the client broke its run's order): it waits again
                    # behind the run's unfinished messages, this attempt counted.
                    stats.failed += 1
                    member.last_error = reason
                    self._put_back(member)
                    member.attempts += 1
                    continue
            if job is None or job.state is not JobState.IN_FLIGHT:
                stats.unknown_fails += 1
                log.debug("ignoring fail for offset %s@%s not in flight (group %s)", queue, offset, self.group)
                continue
            stats.failed += 1
            self.redelivery.unwatch(job)
            self._return_run(job)
            self.redelivery.failed_attempt(job, reason, retry_after_ms)

    def _timed_out(self, job: UpstreamJob) -> bool:
        """In-flight ``job`` passed its deadline: a failed attempt, its run's later members returned.
        False for a run member behind its key's unfinished head: the head, due with it, returns it."""
        members = self._runs.get(job.queue)
        if members is not None and job.offset in members:
            if not job.consumer.is_head(job):
                return False
            self._promote(job)
        self.queue_stats[job.queue].timed_out += 1
        self._return_run(job)
        self.redelivery.failed_attempt(job, f"not acked within {job.consumer.config.timeout_ms} ms")
        return True

    def _finish(self, job: UpstreamJob) -> None:
        job.state = _FINISHED
        jobs = self._jobs.get(job.queue)
        if jobs is not None:
            jobs.pop(job.offset, None)
        job.consumer.finish(job)

    def drop_queue(self, queue: QueueId) -> list[UpstreamJob]:
        """Forget every job of ``queue`` (the queue moved away); returns them."""
        # Heads first, then run members in their chains' order: the caller releases them in this order.
        dropped = [*self._jobs.pop(queue, {}).values(), *self._runs.pop(queue, {}).values()]
        self._finished_elsewhere.pop(queue, None)
        for job in dropped:
            if job.state is JobState.IN_FLIGHT:
                self.redelivery.unwatch(job)
            job.state = JobState.FINISHED
        ready = self._ready.pop(queue, None)
        if ready:
            self._ready_count -= len(ready)
            if queue in self._ready_order:
                self._ready_order.remove(queue)
        return dropped

    # views -------------------------------------------------------------------------------------

    @property
    def stats(self) -> BufferStats:
        """The group's totals over all queues (a snapshot, summed when read)."""
        total = BufferStats()
        for stats in self.queue_stats.values():
            for f in fields(BufferStats):
                setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))
        return total

    @property
    def ready(self) -> int:
        return self._ready_count

    @property
    def in_flight(self) -> int:
        return sum(1 for job in self.jobs() if job.state is JobState.IN_FLIGHT)

    def in_flight_of(self, topic: str) -> int:
        """Jobs of ``topic`` handed to clients and not acked or failed yet."""
        return sum(1 for job in self.jobs() if job.queue.topic == topic and job.state is JobState.IN_FLIGHT)

    @property
    def held(self) -> int:
        """Unfinished jobs in the buffer (ready, in flight, or waiting for a retry)."""
        return sum(len(jobs) for jobs in self._jobs.values()) + sum(len(m) for m in self._runs.values())

    @property
    def parked(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())


def _resolve(future: asyncio.Future[PullBatch], batch: PullBatch) -> None:
    if not future.done():
        future.set_result(batch)
