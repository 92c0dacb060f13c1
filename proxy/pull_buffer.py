"""PullBuffer: where a group's runnable jobs wait for pull clients.

One buffer per consumer group holds:

- *ready* jobs per queue, served round-robin across queues, a batch of one queue per pull;
- *parked* long-poll requests, answered as soon as jobs are ready or empty at their linger time;
- every unfinished job that entered the buffer, by (queue, offset), so acks and fails find it;
- one timer task (not a handle per message) that redelivers pulled jobs not acked within
  ``timeout_ms`` and makes failed jobs ready again after their retry interval. Pulled jobs wait in
  a timing wheel of ``_TICK_S`` buckets and leave it when acked or failed, so the wheel holds only
  what is in flight, whatever the throughput.

A failed attempt (client fail, or timeout) is retried after ``retry_intervals_ms``; after
``max_retry`` retries the job is written to the group's dead-letter stream and then finished. A job
stays the head of its order key through all of this, so its key's order holds. Push actions
(``AsyncHttp``, ``Redis``) report their failed attempts through :meth:`PullBuffer.retry_later`, so they
share this schedule and dead-letter path; their retries go back to them (:meth:`route_retries`).

An ack counts only for a job that was handed to a client of the group at least once
(``attempts > 0``); then it finishes the job whatever state it is in now (a late ack after a timeout
still counts: the message was processed). Any client of the group may send it, not only the one the
job went to: DDMQ clients resend a batch's results on a new connection after a reconnect. Acks for
jobs never delivered, and for offsets the buffer does not hold, are counted and ignored, so no
client can finish a backlog it never pulled. A fail counts only for a job in flight.

Ordered runs (``max_per_key`` > 1): after a pull has taken the ready heads of one queue, the room left
in the reply goes, round-robin over those heads, to the successors waiting behind each head in its
key's chain (same queue, nothing left to run but PullServer), at most ``max_per_key`` messages per key;
a head out again after a failed attempt goes alone.
A reply's messages of a key are consecutive, in key order. Such *run members* go in flight with their
head but stay in the key's chain; they are kept apart from the heads (``_runs``), so acks and fails of
clients without runs pay nothing for them. When the message ahead of a member finishes, the member is
its key's head and is finished by its own ack like any other job. When the message ahead fails or
times out, every later member still in flight goes back to waiting in the chain, its attempt not
counted, and is delivered again once the failed message is finished. An ack for a member whose
predecessor is unfinished is ignored (counted with the unknown acks): finishing it could not be
undone if the predecessor then fails.

A reader that holds a key's earlier messages and reads its pulls in order (a replayable lease, see
:mod:`ddmq.proxy.pull_leases`) may have that key's run continued in a later pull: the successors of
the last message it holds join that reply as run members, after the queue's ready heads and their
runs, or alone when no queue has ready heads.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields

from ddmq.proxy.errors import DdmqError
from ddmq.proxy.job import JobState, UpstreamJob
from ddmq.proxy.types import PullBatch, QueueId

log = logging.getLogger(__name__)

_TICK_S = 0.02
_EMPTY = PullBatch(None, [])

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
_READY = JobState.READY
_IN_FLIGHT = JobState.IN_FLIGHT
_WAITING = JobState.WAITING
_FINISHED = JobState.FINISHED


@dataclass
class BufferStats:
    """Counts of what happened to a queue's messages (monotonic: exported as Prometheus counters)."""

    delivered: int = 0
    acked: int = 0
    failed: int = 0
    timed_out: int = 0
    retried: int = 0
    dead_lettered: int = 0
    unknown_acks: int = 0
    unknown_fails: int = 0
    late_acks: int = 0


@dataclass(eq=False)
class _Waiter:
    topic: str | None
    max_batch: int
    future: asyncio.Future[PullBatch] = field(repr=False)
    timeout_ms: int | None = None
    max_per_key: int = 1


class PullBuffer:
    def __init__(self, group: str) -> None:
        self.group = group
        #: Per queue; :attr:`stats` sums them. A queue's entry lives as long as the buffer.
        self.queue_stats: defaultdict[QueueId, BufferStats] = defaultdict(BufferStats)
        self._ready: dict[QueueId, deque[UpstreamJob]] = {}
        self._ready_order: deque[QueueId] = deque()  # queues with ready jobs, round-robin
        self._ready_count = 0
        self._jobs: dict[QueueId, dict[int, UpstreamJob]] = {}
        self._runs: dict[QueueId, dict[int, UpstreamJob]] = {}  # run members in flight behind their heads
        self._waiters: deque[_Waiter] = deque()
        self._wake_scheduled = False
        self._wheel: dict[int, set[UpstreamJob]] = {}  # tick number -> jobs in flight due then
        self._wheel_cursor = 0  # the first tick not expired yet
        self._retries: list[tuple[float, int, UpstreamJob]] = []
        self._seq = itertools.count()
        self._timer: asyncio.Task[None] | None = None
        self._dead_letter_tasks: set[asyncio.Task[None]] = set()
        self._requeue: dict[str, Callable[[UpstreamJob], None]] = {}  # topic -> its push action
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._timer is not None:
            raise RuntimeError("PullBuffer already started")
        self._loop = asyncio.get_running_loop()
        self._wheel_cursor = int(self._loop.time() / _TICK_S)
        self._timer = asyncio.create_task(self._run_timers(), name=f"pull-buffer-timers:{self.group}")

    async def close(self) -> None:
        """Answer parked pulls (empty), stop timers, wait for dead-letter writes under way."""
        self._closed = True
        self._answer_all_empty()
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
        if self._dead_letter_tasks:
            await asyncio.gather(*self._dead_letter_tasks, return_exceptions=True)

    def stop_serving(self) -> None:
        """From now on pulls answer empty at once (shutdown); acks keep working."""
        self._closed = True
        self._answer_all_empty()

    # jobs in -----------------------------------------------------------------------------------

    def add(self, job: UpstreamJob) -> None:
        """A runnable job reached the PullServer action."""
        queue = job.queue
        jobs = self._jobs.get(queue)
        if jobs is None:
            jobs = self._jobs[queue] = {}
        jobs[job.offset] = job
        self._make_ready(job)

    def _make_ready(self, job: UpstreamJob) -> None:
        job.state = _READY
        queue = job.queue
        ready = self._ready.get(queue)
        if ready is None:
            ready = self._ready[queue] = deque()
        if not ready:
            self._ready_order.append(queue)
        ready.append(job)
        self._ready_count += 1
        if self._waiters and not self._wake_scheduled:
            # Deferred so a reader's whole batch lands before parked pulls are answered.
            self._wake_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._wake_waiters)

    # pulls -------------------------------------------------------------------------------------

    async def pull(
        self,
        topic: str | None,
        max_batch: int,
        linger_ms: int,
        timeout_ms: int | None = None,
        max_per_key: int = 1,
        held: Sequence[UpstreamJob] = (),
    ) -> PullBatch:
        """Ready messages of one queue, waiting up to ``linger_ms`` for some. They stay in flight for
        ``timeout_ms`` (None: the topic's ``timeout_ms``) unless acked or failed first. With
        ``max_per_key`` > 1 the reply may carry ordered runs of up to that many messages per key.

        ``held``: the last message of each key that this reader holds from its earlier pulls, all
        processed in order before this reply (a replayable lease's pulls, read in index order by one
        task). With runs, those keys continue their runs here with what waits behind them, at once only:
        a pull that has to wait takes fresh heads."""
        if not self._closed:
            batch = self._take(topic, max_batch, timeout_ms, max_per_key, held)
            if batch.messages or linger_ms <= 0:
                return batch
        if self._closed:
            return _EMPTY
        loop = asyncio.get_running_loop()
        waiter = _Waiter(topic, max_batch, loop.create_future(), timeout_ms, max_per_key)
        self._waiters.append(waiter)
        expiry = loop.call_later(linger_ms / 1000, _resolve, waiter.future, _EMPTY)
        try:
            return await waiter.future
        finally:
            expiry.cancel()
            if not waiter.future.done():
                waiter.future.cancel()

    def _wake_waiters(self) -> None:
        self._wake_scheduled = False
        waiters = self._waiters
        unserved: deque[_Waiter] = deque()
        while waiters and self._ready_count:
            waiter = waiters.popleft()
            if waiter.future.done():
                continue
            batch = self._take(waiter.topic, waiter.max_batch, waiter.timeout_ms, waiter.max_per_key)
            if batch.messages:
                waiter.future.set_result(batch)
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
    ) -> PullBatch:
        order = self._ready_order
        for _ in range(len(order)):
            queue = order.popleft()
            if topic is not None and queue.topic != topic:
                order.append(queue)
                continue
            ready = self._ready[queue]
            if ready and not ready[0].consumer.may_serve(queue.qid):
                order.append(queue)  # lease not confirmed lately: deliver nothing until it is
                continue
            batch: list[UpstreamJob] = []
            while ready and len(batch) < max_batch:
                job = ready.popleft()
                self._ready_count -= 1
                if job.state is _READY:
                    batch.append(job)
            if ready:
                order.append(queue)
            if batch:
                runs = None
                if max_per_key > 1 and len(batch) < max_batch:
                    batch, runs = self._with_runs(queue, batch, max_batch, max_per_key, held)
                self._deliver(batch, timeout_ms)
                return PullBatch(queue, [job.message for job in batch], runs)
        if held and max_per_key > 1:
            return self._continue_runs(topic, max_batch, timeout_ms, max_per_key, held)
        return _EMPTY

    def _continue_runs(
        self, topic: str | None, max_batch: int, timeout_ms: int | None, max_per_key: int, held: Sequence[UpstreamJob]
    ) -> PullBatch:
        """No queue has ready heads: continue the runs of ``held`` keys, in one queue."""
        tried: set[QueueId] = set()
        for job in held:
            queue = job.queue
            if queue in tried or (topic is not None and queue.topic != topic) or not _may_continue(job):
                continue
            tried.add(queue)
            if not job.consumer.may_serve(queue.qid):
                continue
            batch, runs = self._with_runs(queue, [], max_batch, max_per_key, held)
            if batch:
                self._deliver(batch, timeout_ms)
                return PullBatch(queue, [job.message for job in batch], runs)
        return _EMPTY

    def _with_runs(
        self,
        queue: QueueId,
        heads: list[UpstreamJob],
        max_batch: int,
        max_per_key: int,
        held: Sequence[UpstreamJob] = (),
    ) -> tuple[list[UpstreamJob], list[int] | None]:
        """``heads`` with their keys' waiting successors behind them, then the ``held`` keys' runs
        continued: one more message per key per round, while the reply has room, so no key's run crowds
        out the others'. Also returns the runs' sizes (None when no successor joined)."""
        runs = [[head] for head in heads]
        # A head out again after a failed attempt goes alone: its key's later messages wait until it is
        # finished, not sent along again and again with a message that keeps failing.
        growing = [(run, max_per_key) for run in runs if run[0].next is not None and run[0].attempts == 0]
        # A held key's run starts behind the message held (not sent again): one more allowed for it.
        continued = [[job] for job in held if job.queue == queue and _may_continue(job)]
        growing += [(run, max_per_key + 1) for run in continued]
        room = max_batch - len(heads)
        while room and growing:
            still = []
            for run, limit in growing:
                successor = run[-1].next
                if successor is None or not _may_join(successor, queue):
                    continue
                run.append(successor)
                room -= 1
                if not room:
                    break
                if len(run) < limit:
                    still.append((run, limit))
            growing = still
        if len(heads) + room == max_batch:  # no successor joined
            return heads, None
        members = self._runs.get(queue)
        if members is None:
            members = self._runs[queue] = {}
        batch: list[UpstreamJob] = []
        sizes: list[int] = []
        for run in runs:
            batch += run
            sizes.append(len(run))
            for member in run[1:]:
                members[member.offset] = member
        for run in continued:
            if len(run) > 1:
                batch += run[1:]
                sizes.append(len(run) - 1)
                for member in run[1:]:
                    members[member.offset] = member
        return batch, sizes

    def _deliver(self, batch: list[UpstreamJob], timeout_ms: int | None = None) -> None:
        assert self._loop is not None
        if timeout_ms is None:
            timeout_ms = batch[0].consumer.config.timeout_ms
        due = self._loop.time() + timeout_ms / 1000
        tick = max(math.ceil(due / _TICK_S), self._wheel_cursor)
        slot = self._wheel.get(tick)
        if slot is None:
            slot = self._wheel[tick] = set()
        for job in batch:
            job.state = _IN_FLIGHT
            job.attempts += 1
            job.deadline = tick
            slot.add(job)
        self.queue_stats[batch[0].queue].delivered += len(batch)

    def _time(self, job: UpstreamJob, tick: int) -> None:
        slot = self._wheel.get(tick)
        if slot is None:
            slot = self._wheel[tick] = set()
        job.deadline = tick
        slot.add(job)

    def _untime(self, job: UpstreamJob) -> None:
        """``job`` leaves the in-flight state: take it off the wheel."""
        slot = self._wheel.get(job.deadline)
        if slot is not None:
            slot.discard(job)
            if not slot:
                # A set never shrinks as it empties: dropped here, its table does not sit in memory until
                # the tick passes (timeout_ms later), which grew RSS with throughput x timeout_ms.
                del self._wheel[job.deadline]

    # results -----------------------------------------------------------------------------------

    def ack(self, queue: QueueId, offsets: Iterable[int]) -> None:
        jobs = self._jobs.get(queue)
        stats = self.queue_stats[queue]
        for offset in offsets:
            job = jobs.get(offset) if jobs is not None else None
            if job is None and queue in self._runs:
                job = self._run_head(queue, offset)
            if job is None or not job.attempts or job.state is _FINISHED:
                # Never handed out (or not held): finishing it would erase a message nobody processed.
                stats.unknown_acks += 1
                log.debug("ignoring ack for undelivered offset %s@%s of group %s", queue, offset, self.group)
                continue
            if job.state is _IN_FLIGHT:
                self._untime(job)
            else:
                stats.late_acks += 1
            stats.acked += 1
            self._finish(job)

    def fail(self, queue: QueueId, offsets: Iterable[int], reason: str = "client reported failure") -> None:
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
            self._untime(job)
            self._return_run(job)
            self._failed_attempt(job, reason)

    def _run_head(self, queue: QueueId, offset: int) -> UpstreamJob | None:
        """The run member at ``offset`` when it is its key's head now (moved to the heads), else None."""
        members = self._runs[queue]
        job = members.get(offset)
        if job is None or not job.consumer.blocking_queue.is_head(job):
            return None
        self._promote(job)
        return job

    def _promote(self, job: UpstreamJob) -> None:
        """Run member ``job`` became its key's head: keep it with the heads from now on."""
        queue = job.queue
        members = self._runs[queue]
        del members[job.offset]
        if not members:
            del self._runs[queue]
        jobs = self._jobs.get(queue)
        if jobs is None:
            jobs = self._jobs[queue] = {}
        jobs[job.offset] = job

    def _return_run(self, job: UpstreamJob) -> None:
        """``job`` failed or timed out: the rest of its run, still in flight, waits again in its key's
        chain (attempts not counted) and goes out once ``job`` is finished."""
        successor = job.next
        if successor is not None and successor.state is _IN_FLIGHT:
            self._put_back(successor)

    def _put_back(self, member: UpstreamJob) -> None:
        """Run member ``member`` and the in-flight members behind it wait in their key's chain again."""
        members = self._runs[member.queue]
        job: UpstreamJob | None = member
        while job is not None and job.state is _IN_FLIGHT:
            self._untime(job)
            job.state = _WAITING
            job.attempts -= 1
            del members[job.offset]
            job = job.next
        if not members:
            del self._runs[member.queue]

    def route_retries(self, topic: str, requeue: Callable[[UpstreamJob], None]) -> None:
        """Jobs of ``topic`` are pushed, not pulled: when a retry is due, hand the job to ``requeue``."""
        self._requeue[topic] = requeue

    def retry_later(self, job: UpstreamJob, reason: str) -> None:
        """A push attempt of ``job`` failed: retry on schedule, or dead-letter after the last retry."""
        self.queue_stats[job.queue].failed += 1
        self._failed_attempt(job, reason)

    def _failed_attempt(self, job: UpstreamJob, reason: str) -> None:
        job.last_error = reason
        config = job.consumer.config
        if job.attempts > config.max_retry:
            self.dead_letter(job, reason)
            return
        job.state = JobState.RETRY_WAIT
        assert self._loop is not None
        due = self._loop.time() + config.retry_delay_ms(job.attempts) / 1000
        heapq.heappush(self._retries, (due, next(self._seq), job))

    def dead_letter(self, job: UpstreamJob, reason: str) -> None:
        """Write ``job`` to the dead-letter stream, then finish it (its key's successor runs next)."""
        job.last_error = reason
        job.state = JobState.RETRY_WAIT  # neither ready nor in flight while the write is under way
        task = asyncio.create_task(self._dead_letter(job), name=f"dead-letter:{job.queue}@{job.offset}")
        self._dead_letter_tasks.add(task)
        task.add_done_callback(self._dead_letter_tasks.discard)

    async def _dead_letter(self, job: UpstreamJob) -> None:
        delay = 0.1
        while True:
            if job.state is JobState.FINISHED:  # acked late while we were trying
                return
            if self._closed and delay > 1:
                return  # shutting down with Redis away: unfinished, so redelivered after restart
            try:
                await job.consumer.dead_letter(job)
                break
            except DdmqError as exc:
                # Not finishing keeps the offset uncommitted: nothing is lost if we never succeed.
                log.warning("dead-letter write for %r failed (%s); retrying in %.1fs", job, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        if not _finished(job):  # an ack may have come in during the write
            self.queue_stats[job.queue].dead_lettered += 1
            log.info("dead-lettered %r after %d attempts: %s", job, job.attempts, job.last_error)
            self._finish(job)

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
        for job in dropped:
            if job.state is JobState.IN_FLIGHT:
                self._untime(job)
            job.state = JobState.FINISHED
        ready = self._ready.pop(queue, None)
        if ready:
            self._ready_count -= len(ready)
            try:
                self._ready_order.remove(queue)
            except ValueError:
                pass
        return dropped

    # timers ------------------------------------------------------------------------------------

    async def _run_timers(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_TICK_S)
            try:
                self._expire(loop.time())
            except Exception:  # a bug here must not stop redelivery forever
                log.exception("pull buffer timer failed for group %s", self.group)

    def _expire(self, now: float) -> None:
        current = int(now / _TICK_S)
        wheel = self._wheel
        for tick in range(self._wheel_cursor, current + 1):
            slot = wheel.pop(tick, None)
            if not slot:
                continue
            behind: list[UpstreamJob] = []
            for job in slot:
                if job.state is JobState.IN_FLIGHT:
                    if job.queue in self._runs and job.offset in self._runs[job.queue]:
                        if not job.consumer.blocking_queue.is_head(job):
                            behind.append(job)  # its run's unfinished head, due with it, returns it
                            continue
                        self._promote(job)
                    self.queue_stats[job.queue].timed_out += 1
                    self._return_run(job)
                    self._failed_attempt(job, f"not acked within {job.consumer.config.timeout_ms} ms")
            for job in behind:
                if job.state is _IN_FLIGHT:  # not returned by its head: must not stay in flight untimed
                    self._time(job, current + 1)
        self._wheel_cursor = current + 1
        retries = self._retries
        while retries and retries[0][0] <= now:
            _, _, job = heapq.heappop(retries)
            if job.state is JobState.RETRY_WAIT:
                self.queue_stats[job.queue].retried += 1
                requeue = self._requeue.get(job.queue.topic)
                if requeue is None:
                    self._make_ready(job)
                else:
                    requeue(job)

    # views -------------------------------------------------------------------------------------

    def job(self, queue: QueueId, offset: int) -> UpstreamJob | None:
        """The unfinished job of ``queue`` at ``offset``, if the buffer holds it."""
        jobs = self._jobs.get(queue)
        job = jobs.get(offset) if jobs is not None else None
        if job is None and queue in self._runs:
            job = self._runs[queue].get(offset)
        return job

    @property
    def stats(self) -> BufferStats:
        """The group's totals over all queues (a snapshot, summed when read)."""
        total = BufferStats()
        for stats in self.queue_stats.values():
            for f in fields(BufferStats):
                setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))
        return total

    def jobs(self) -> Iterator[UpstreamJob]:
        """Every unfinished job the buffer holds (ready, in flight, waiting for a retry)."""
        for jobs in self._jobs.values():
            yield from jobs.values()
        for members in self._runs.values():
            yield from members.values()

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
    def timed(self) -> int:
        """Jobs on the timing wheel: equals in-flight jobs, however many were delivered before."""
        return sum(len(slot) for slot in self._wheel.values())

    @property
    def wheel_ticks(self) -> int:
        """Ticks of the timing wheel holding jobs (a tick whose jobs were all acked is dropped)."""
        return len(self._wheel)

    @property
    def parked(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())


def _may_join(successor: UpstreamJob, queue: QueueId) -> bool:
    """Whether ``successor`` may go out in its head's run: waiting, of the reply's queue, and with
    nothing left to run but PullServer (a chain with actions after Order runs them on the head only)."""
    return (
        successor.state is _WAITING
        and successor.queue == queue
        and successor.index == len(successor.consumer.chain) - 1
    )


def _may_continue(held: UpstreamJob) -> bool:
    """Whether a reader holding ``held`` may get the messages behind it: still in flight on its first
    delivery (a message out again after a failed attempt goes alone, as a head does)."""
    return held.state is _IN_FLIGHT and held.attempts == 1 and held.next is not None


def _finished(job: UpstreamJob) -> bool:
    return job.state is JobState.FINISHED


def _resolve(future: asyncio.Future[PullBatch], batch: PullBatch) -> None:
    if not future.done():
        future.set_result(batch)
