"""Delivery: how a group's ready jobs reach its pull clients, and what comes back unanswered.

One :class:`Delivery` per consumer group, inside its :class:`~ddmq.proxy.engine.pull_buffer.PullBuffer`,
holds:

- the *round-robin* of the queues with ready jobs (their :class:`~ddmq.proxy.engine.queue_slot.QueueSlot`,
  each with its ready line) and how many jobs are ready in all. A pull takes one queue's ready heads,
  oldest first, up to its count and the topic's ``max_reply_bytes``, and with ``max_per_key`` > 1 their
  keys' runs behind them (:mod:`ddmq.proxy.engine.runs`);
- the *parked* pulls, answered as soon as jobs are ready (once a reader's whole batch has landed, or in
  the next loop step) or empty at their linger time;
- the group's :class:`~ddmq.proxy.engine.redelivery.Redelivery`: the jobs handed out are timed there,
  and it reports back here when one is due (a timeout), when a retry is due (ready again) and when a
  dead letter was written (finished).

The slots are the buffer's (one dict, shared): delivery finds a job's queue there.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final

from ddmq.proxy.core.pull_codec import MESSAGE_OVERHEAD_BYTES, UTF8_MAX_BYTES
from ddmq.proxy.core.types import THRIFT_REPLY, PullBatch, QueueId, ReplySize
from ddmq.proxy.engine.end_to_end import EndToEnd
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.queue_slot import QueueSlot
from ddmq.proxy.engine.ready_line import FairReadyLine
from ddmq.proxy.engine.redelivery import BufferStats, Redelivery
from ddmq.proxy.engine.runs import log_alone, may_continue, with_runs

__all__ = ["EMPTY", "Delivery"]

#: The answer of a pull that got nothing.
EMPTY: Final = PullBatch(None, [])

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_READY: Final = JobState.READY
_IN_FLIGHT: Final = JobState.IN_FLIGHT
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


class Delivery:
    """The ready side of a group's pull buffer: the queues with ready jobs, the parked pulls, and the
    redelivery of what went out."""

    def __init__(
        self,
        group: str,
        queues: dict[QueueId, QueueSlot],
        stats: defaultdict[QueueId, BufferStats],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._queues = queues
        self._stats = stats
        self.order: deque[QueueSlot] = deque()  # queues with ready jobs, round-robin
        #: Ready jobs of all queues.
        self.count = 0
        self._waiters: deque[_Waiter] = deque()
        self._wake: asyncio.Handle | None = None  # the deferred _wake_waiters, while one is due
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Set at shutdown: pulls answer empty at once from then on.
        self.closed = False
        #: An operator's pause (``ddmq groups pause``): nothing is handed out of every topic, or of
        #: these; what is in flight keeps its deadline and its results count.
        self.all_paused = False
        self.paused: frozenset[str] = frozenset()
        #: Topics whose breaker is half-open: how many more messages each may hand out.
        self.probes: dict[str, int] = {}
        #: Set (and replaced) at every change of the pauses: push workers of a paused topic wait on it.
        self._pauses_changed: asyncio.Event | None = None
        self.redelivery = Redelivery(group, stats, self._timed_out, self.make_ready, self._finish, clock)
        #: topic -> end-to-end latency and attempts (from its first delivery, ack or dead letter here).
        self.end_to_end: dict[str, EndToEnd] = {}
        #: Wall-clock milliseconds the end-to-end figures are measured with: Redis's time once the group
        #: is wired to its lease clock, this host's until then.
        self.wall_ms: Callable[[], int] = _host_ms

    def start(self) -> None:
        if self._loop is not None:
            raise RuntimeError("PullBuffer already started")
        self._loop = asyncio.get_running_loop()
        self.redelivery.start()

    def stop(self) -> None:
        """Pulls answer empty from now on, the parked ones at once."""
        self.closed = self.redelivery.closed = True
        while self._waiters:
            _resolve(self._waiters.popleft().future, EMPTY)

    # ready jobs ----------------------------------------------------------------------------------

    def make_ready(self, job: UpstreamJob) -> None:
        """``job`` waits for a pull again (a retry due, a head let go by parking)."""
        slot = self._queues.get(job.queue)
        if slot is None:
            slot = self._queues[job.queue] = QueueSlot(job.queue)
        self.ready_in(slot, job)

    def ready_in(self, slot: QueueSlot, job: UpstreamJob) -> None:
        """``job``, of ``slot``'s queue, waits for a pull."""
        job.state = _READY
        ready = slot.ready
        if job.tenant is not None and not isinstance(ready, FairReadyLine):
            slot.make_fair(job.consumer.config.fair_weights)
            ready = slot.ready
        if not ready:
            self.order.append(slot)
        ready.append(job)
        self.count += 1
        if self._waiters and self._wake is None:
            # Deferred so a reader's whole batch lands before parked pulls are answered.
            assert self._loop is not None
            self._wake = self._loop.call_soon(self._wake_waiters)

    def unready(self, job: UpstreamJob) -> None:
        """Ready ``job`` waits for pulls no more (an operator's action: O(n) once, not on the delivery path)."""
        slot = self._queues.get(job.queue)
        if slot is not None and slot.ready.remove(job):
            self.count -= 1

    def drop(self, slot: QueueSlot) -> None:
        """``slot``'s queue moved away: its ready jobs are no longer served."""
        self.count -= len(slot.ready)
        # Wherever it stands: a ready line emptied by an operator's action leaves its queue in the order.
        while slot in self.order:
            self.order.remove(slot)

    # pulls ---------------------------------------------------------------------------------------

    def take(
        self,
        topic: str | None,
        max_batch: int,
        timeout_ms: int | None = None,
        max_per_key: int = 1,
        held: Sequence[UpstreamJob] = (),
        reply: ReplySize = THRIFT_REPLY,
    ) -> PullBatch:
        """The ready jobs of the next queue in turn (of ``topic``, unless None), in flight from now on;
        :data:`EMPTY` when no queue has any (nor a ``held`` key's run anything to continue with)."""
        if self.all_paused:
            return EMPTY
        order = self.order
        size = reply.message
        # Thrift's bound written out for messages without properties: a call per message would cost
        # more than the rest of the check (bench/instructions.py).
        inline = reply is THRIFT_REPLY
        for _ in range(len(order)):
            slot = order.popleft()
            queue = slot.queue
            ready = slot.ready
            most = self._most(slot, topic, max_batch)
            if not most:
                order.append(slot)
                continue
            batch: list[UpstreamJob] = []
            # bytes left in the reply (a queue's jobs share their topic's consumer)
            room = ready.first().consumer.config.max_reply_bytes - reply.overhead if ready else 0
            while ready and len(batch) < most:
                job = ready.popleft()
                self.count -= 1
                if job.state is _READY:
                    m = job.message
                    if inline and not m.properties:
                        needs = len(m.value) + (len(m.key) + len(m.tag)) * UTF8_MAX_BYTES + MESSAGE_OVERHEAD_BYTES
                    else:
                        needs = size(m)
                    if needs > room and batch:
                        ready.put_front(job)  # it stays first in line, never delivered
                        self.count += 1
                        break
                    room -= needs
                    batch.append(job)
            if ready:
                order.append(slot)
            if batch:
                runs = None
                if room < 0:
                    log_alone(batch[0], size(batch[0].message))
                elif max_per_key > 1 and len(batch) < most:
                    batch, runs = with_runs(slot, batch, most, max_per_key, held, room, reply)
                self._deliver(batch, timeout_ms)
                return PullBatch(queue, [job.message for job in batch], runs)
        if held and max_per_key > 1:
            return self._continue_runs(topic, max_batch, timeout_ms, max_per_key, held, reply)
        return EMPTY

    def _most(self, slot: QueueSlot, topic: str | None, max_batch: int) -> int:
        """How many of ``slot``'s ready jobs a pull of ``topic`` (None: any) may take now: 0 for another
        topic, a paused one or a queue whose lease is not confirmed lately; a half-open breaker's probes left."""
        queue = slot.queue
        if (topic is not None and queue.topic != topic) or (self.paused and queue.topic in self.paused):
            return 0
        ready = slot.ready
        if ready and not ready.first().consumer.may_serve(queue.qid):
            return 0  # deliver nothing until it is
        probes = self.probes
        return min(max_batch, probes[queue.topic]) if probes and queue.topic in probes else max_batch

    def _continue_runs(
        self,
        topic: str | None,
        max_batch: int,
        timeout_ms: int | None,
        max_per_key: int,
        held: Sequence[UpstreamJob],
        reply: ReplySize,
    ) -> PullBatch:
        """No queue has ready heads: continue the runs of ``held`` keys, in one queue."""
        tried: set[QueueId] = set()
        for job in held:
            queue = job.queue
            if queue in tried or (topic is not None and queue.topic != topic) or not may_continue(job):
                continue
            tried.add(queue)
            slot = self._queues.get(queue)
            if slot is None or queue.topic in self.paused or queue.topic in self.probes \
                    or not job.consumer.may_serve(queue.qid):
                continue
            room = job.consumer.config.max_reply_bytes - reply.overhead
            batch, runs = with_runs(slot, [], max_batch, max_per_key, held, room, reply)
            if batch:
                self._deliver(batch, timeout_ms)
                return PullBatch(queue, [job.message for job in batch], runs)
        return EMPTY

    def use_wall_clock(self, wall_ms: Callable[[], int]) -> None:
        """Measure end-to-end latency with ``wall_ms`` (milliseconds since the epoch): Redis's time."""
        self.wall_ms = wall_ms

    def figures(self, topic: str) -> EndToEnd:
        """``topic``'s end-to-end figures, made at their first use."""
        figures = self.end_to_end.get(topic)
        if figures is None:
            figures = self.end_to_end[topic] = EndToEnd()
        return figures

    def _deliver(self, batch: list[UpstreamJob], timeout_ms: int | None = None) -> None:
        first = batch[0]
        topic = first.queue.topic
        if timeout_ms is None:
            timeout_ms = first.consumer.config.timeout_ms
        probes = self.probes
        if probes and topic in probes:
            probes[topic] -= len(batch)
        figures = self.figures(topic)
        now_ms = self.wall_ms()
        for job in batch:
            job.state = _IN_FLIGHT
            job.attempts += 1
            job.extensions = 0
            # A job's deadline stays 0 until it is first timed: only a first delivery counts (a retry,
            # a release's or a run's return and an operator's retry each go out again, not for the first time).
            if not job.deadline:
                figures.first_delivery(job.message.produce_ms, now_ms)
        self.redelivery.watch(batch, timeout_ms)
        self._stats[first.queue].delivered += len(batch)

    # parked pulls --------------------------------------------------------------------------------

    async def park(
        self,
        topic: str | None,
        max_batch: int,
        linger_ms: int,
        timeout_ms: int | None,
        max_per_key: int,
        reply: ReplySize,
        early: Callable[[PullBatch], None] | None,
    ) -> PullBatch:
        """Wait up to ``linger_ms`` for ready jobs to answer a pull with (see ``PullBuffer.pull``)."""
        loop = asyncio.get_running_loop()
        waiter = _Waiter(topic, max_batch, loop.create_future(), timeout_ms, max_per_key, reply, early)
        self._waiters.append(waiter)
        expiry = loop.call_later(linger_ms / 1000, _resolve, waiter.future, EMPTY)
        try:
            return await waiter.future
        finally:
            expiry.cancel()
            if not waiter.future.done():
                waiter.future.cancel()

    def pause(self, everything: bool, topics: frozenset[str], probes: dict[str, int] | None = None) -> None:
        """Hand out nothing (``everything``) or nothing of ``topics``, and of ``probes``' topics (a
        half-open breaker) at most their count more; parked pulls get what a lift frees."""
        lifted = (self.all_paused and not everything) or not topics >= self.paused or bool(probes)
        self.all_paused, self.paused = everything, topics
        self.probes = probes if probes is not None else {}
        if lifted and self._pauses_changed is not None:
            self._pauses_changed.set()
            self._pauses_changed = None
        if lifted and self._waiters and self.count and self._wake is None and self._loop is not None:
            self._wake = self._loop.call_soon(self._wake_waiters)

    def push_hold(self, topic: str) -> asyncio.Event | None:
        """None when ``topic``'s messages may be pushed; else an event set when a pause is lifted (a
        push worker waits on it, then asks again): an operator's pause holds push chains as it holds
        pulls, with nothing pushed and so no attempt counted."""
        if not self.all_paused and topic not in self.paused:
            return None
        if self._pauses_changed is None:
            self._pauses_changed = asyncio.Event()
        return self._pauses_changed

    def answer_parked(self) -> None:
        """Answer parked pulls now, if jobs were made ready since they parked."""
        if self._wake is not None:
            self._wake.cancel()
            self._wake_waiters()

    def _wake_waiters(self) -> None:
        self._wake = None
        waiters = self._waiters
        unserved: deque[_Waiter] = deque()
        while waiters and self.count:
            waiter = waiters.popleft()
            if waiter.future.done():
                continue
            batch = self.take(waiter.topic, waiter.max_batch, waiter.timeout_ms, waiter.max_per_key, (), waiter.reply)
            if batch.messages:
                waiter.future.set_result(batch)
                if waiter.early is not None:
                    waiter.early(batch)
            else:
                unserved.append(waiter)
        unserved.extend(w for w in waiters if not w.future.done())
        self._waiters = unserved

    @property
    def parked(self) -> int:
        return sum(1 for w in self._waiters if not w.future.done())

    # back from redelivery ------------------------------------------------------------------------

    def _timed_out(self, job: UpstreamJob) -> bool:
        """In-flight ``job`` passed its deadline: a failed attempt, its run's later members returned.
        False for a run member behind its key's unfinished head: the head, due with it, returns it."""
        slot = self._queues.get(job.queue)
        if slot is not None and job.offset in slot.members:
            if not job.consumer.is_head(job):
                return False
            slot.promote(job)
        self._stats[job.queue].timed_out += 1
        if slot is not None:
            slot.return_run(job, self.redelivery)
        self.redelivery.failed_attempt(job, f"not acked within {job.consumer.config.timeout_ms} ms")
        return True

    def _finish(self, job: UpstreamJob) -> None:
        """``job`` was dead-lettered."""
        self.figures(job.queue.topic).dead_lettered(job.attempts)
        slot = self._queues.get(job.queue)
        if slot is not None:
            slot.finish(job)
        else:  # a pushed job: never held by the buffer
            job.state = _FINISHED
            job.consumer.finish(job)


def _host_ms() -> int:
    return int(time.time() * 1000)


def _resolve(future: asyncio.Future[PullBatch], batch: PullBatch) -> None:
    if not future.done():
        future.set_result(batch)
