"""PullBuffer: where a group's runnable jobs wait for pull clients.

One buffer per consumer group. It holds, in one dict, a
:class:`~ddmq.proxy.engine.queue_slot.QueueSlot` per queue: that queue's unfinished jobs by offset (so
acks and fails find them), its ready line and its run members. A queue that moves away drops its slot.
Beside the slots, the buffer's :class:`~ddmq.proxy.engine.delivery.Delivery` serves ready jobs to pulls
(round-robin across queues, one queue's batch per pull, oldest offsets first), parks long polls until
jobs are ready, and holds the group's :class:`~ddmq.proxy.engine.redelivery.Redelivery`
(:attr:`PullBuffer.redelivery`: deadlines of jobs in flight, the retry schedule, dead-letter writes;
push actions report their failed attempts there too). What clients and operators say about the jobs
(acks, fails, releases, extensions, holds) is applied here. A job stays the head of its order key
through all of this, so its key's order holds. The buffer reaches a job's consumer only through
:class:`~ddmq.proxy.engine.job.JobOwner`.

An ack counts only for a job that was handed to a client of the group at least once
(``attempts > 0``); then it finishes the job whatever state it is in now (a late ack after a timeout
still counts: the message was processed). Any client of the group may send it, not only the one the
job went to: DDMQ clients resend a batch's results on a new connection after a reconnect. Acks for
jobs never delivered, and for offsets the buffer does not hold, are counted and ignored, so no
client can finish a backlog it never pulled. A fail counts only for a job in flight.

Ordered runs (``max_per_key`` > 1): the room a queue's ready heads leave in a reply goes, one message
per key per round, to the successors waiting behind them in their keys' chains, at most
``max_per_key`` per key; a reply's messages of a key are consecutive, in key order
(:mod:`ddmq.proxy.engine.runs`). Such *run members* go in flight but stay in their key's chain, kept
by their slot apart from the heads, so clients without runs pay nothing for them. A member is finished
by its own ack once it is its key's head; an ack before that is ignored (counted unknown: what is
ahead of it may still fail). When a message fails or times out, the later members of its run return
to waiting, their attempt uncounted, and go out again once it is finished. A replayable lease's later
pulls may continue the runs of the keys it holds (see :mod:`ddmq.proxy.engine.replays`). docs/design/engine.md
("Ordered runs") has the whole story.

Client verbs (:mod:`ddmq.proxy.engine.verbs`): a message given back (release) or still being worked on
(extend). Parking (:mod:`ddmq.proxy.engine.parking`): a key's head taken out of delivery and put back
(hold, unhold, drop_head).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields
from typing import Final

from ddmq.proxy.core.types import THRIFT_REPLY, PullBatch, QueueId, ReplySize
from ddmq.proxy.engine.delivery import EMPTY, Delivery
from ddmq.proxy.engine.end_to_end import EndToEnd
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.queue_slot import QueueSlot
from ddmq.proxy.engine.redelivery import BufferStats

log: Final = logging.getLogger(__name__)

__all__ = ["THRIFT_REPLY", "BufferStats", "PullBuffer"]

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_READY: Final = JobState.READY
_IN_FLIGHT: Final = JobState.IN_FLIGHT
_FINISHED: Final = JobState.FINISHED
_PARKED: Final = JobState.PARKED


class PullBuffer:
    """A consumer group's pull buffer: a :class:`QueueSlot` per queue, in one dict; the group's
    :class:`Delivery`, which serves the slots' ready jobs and holds the group's redelivery; and the
    counters per queue."""

    def __init__(self, group: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.group = group
        #: Per queue; :attr:`stats` sums them. Counters, exported as such: a queue's entry lives as long
        #: as the buffer (its slot does not: a queue that moves away and back counts on), from the
        #: queue's first delivery, ack or fail.
        self.queue_stats: defaultdict[QueueId, BufferStats] = defaultdict(BufferStats)
        self._queues: dict[QueueId, QueueSlot] = {}
        self._delivery = Delivery(group, self._queues, self.queue_stats, clock)
        self.redelivery = self._delivery.redelivery
        #: An operator's pause, ``pause(everything, topics)``: from then on pulls get nothing of every topic
        #: or of ``topics``; acks, fails and the deadlines of what is in flight go on.
        self.pause = self._delivery.pause
        #: ``push_hold(topic)``: None while ``topic`` may be pushed, else an event set when a pause lifts.
        self.push_hold = self._delivery.push_hold
        #: topic -> end-to-end latency and attempts of its messages here (:mod:`ddmq.proxy.engine.end_to_end`).
        self.end_to_end: dict[str, EndToEnd] = self._delivery.end_to_end
        #: ``use_wall_clock(wall_ms)``: measure end-to-end latency with ``wall_ms`` (ms since the epoch).
        self.use_wall_clock = self._delivery.use_wall_clock

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._delivery.start()

    async def close(self) -> None:
        """Answer parked pulls (empty), stop timers, wait for dead-letter writes under way."""
        self._delivery.stop()
        await self.redelivery.close()

    def stop_serving(self) -> None:
        """From now on pulls answer empty at once (shutdown); acks keep working."""
        self._delivery.stop()

    # jobs in -----------------------------------------------------------------------------------

    def add(self, job: UpstreamJob) -> None:
        """A runnable job reached the PullServer action."""
        queue = job.queue
        slot = self._queues.get(queue)
        if slot is None:
            slot = self._queues[queue] = QueueSlot(queue)
        done = slot.finished_elsewhere
        if done and job.offset in done:
            done.discard(job.offset)
            self.queue_stats[queue].acked += 1
            slot.finish(job)
            return
        slot.heads[job.offset] = job
        if job.consumer.key_records and (held := job.consumer.parking.arrived(job)) is not None:
            if held != "parked":  # a sequenced key: dead-lettered behind its earlier message
                self.redelivery.dead_letter(job, held)
            return
        self._delivery.ready_in(slot, job)

    def answer_parked(self) -> None:
        """Answer parked pulls now (a read's batch has landed), not after this loop iteration's other reads."""
        self._delivery.answer_parked()

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
        delivery = self._delivery
        if not delivery.closed:
            batch = delivery.take(topic, max_batch, timeout_ms, max_per_key, held, reply)
            if batch.messages or linger_ms <= 0:
                return batch
        if delivery.closed:
            return EMPTY
        return await delivery.park(topic, max_batch, linger_ms, timeout_ms, max_per_key, reply, early)

    # results -----------------------------------------------------------------------------------

    def ack(self, queue: QueueId, offsets: Iterable[int]) -> None:
        # A queue not held here (moved away, or never read here): an empty slot, which finds nothing.
        slot = self._queues.get(queue) or QueueSlot(queue)
        jobs = slot.heads
        members = slot.members
        stats = self.queue_stats[queue]
        redelivery = self.redelivery  # its unwatch called directly: compiled, a bound alias goes through Python
        delivery = self._delivery
        figures = delivery.figures(queue.topic)
        now_ms = delivery.wall_ms()  # once per call: the end-to-end figures of the acks below
        for offset in offsets:
            job = jobs.get(offset)
            if job is None and members:
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
            figures.ack(job.message.produce_ms, job.attempts, now_ms)
            slot.finish(job)

    def finish_elsewhere(self, queue: QueueId, offsets: Iterable[int]) -> int:
        """Finish read offsets of ``queue`` that a client acked at another proxy (a replay lease served
        by a proxy that died, whose queue this one took): a ready job never handed out here is finished
        at once, one still waiting behind its key when it gets here. Returns how many were handed out
        here already (too late: they are in flight or were delivered)."""
        slot = self._queues.get(queue) or QueueSlot(queue)
        late = 0
        for offset in offsets:
            job = slot.job(offset)
            if job is None:
                slot.finished_elsewhere.add(offset)
                self._queues[queue] = slot  # kept, now that it holds something
            elif job.attempts or job.state is not _READY:
                late += 1
            else:
                self.queue_stats[queue].acked += 1
                slot.finish(job)  # its stale entry in the ready line is skipped when taken
        return late

    def fail(
        self,
        queue: QueueId,
        offsets: Iterable[int],
        reason: str = "client reported failure",
        retry_after_ms: int | None = None,
    ) -> None:
        slot = self._queues.get(queue) or QueueSlot(queue)
        stats = self.queue_stats[queue]
        redelivery = self.redelivery
        for offset in offsets:
            job = slot.heads.get(offset)
            if job is None and slot.members:
                job = slot.run_head(offset)
                if job is None and (member := slot.members.get(offset)) is not None:
                    # Failed ahead of its turn (the client broke its run's order): it waits again
                    # behind the run's unfinished messages, this attempt counted.
                    stats.failed += 1
                    member.last_error = reason
                    slot.put_back(member, redelivery)
                    member.attempts += 1
                    continue
            if job is None or job.state is not _IN_FLIGHT:
                stats.unknown_fails += 1
                log.debug("ignoring fail for offset %s@%s not in flight (group %s)", queue, offset, self.group)
                continue
            stats.failed += 1
            redelivery.unwatch(job)
            slot.return_run(job, redelivery)
            redelivery.failed_attempt(job, reason, retry_after_ms)

    def drop_queue(self, queue: QueueId) -> list[UpstreamJob]:
        """Forget every job of ``queue`` (the queue moved away); returns them, heads first, then run
        members in their chains' order: the caller releases them in this order."""
        slot = self._queues.pop(queue, None)
        if slot is None:
            return []
        self._delivery.drop(slot)
        return slot.drop(self.redelivery)

    # client verbs (engine/verbs.py) ------------------------------------------------------------

    def release(self, queue: QueueId, offsets: Iterable[int]) -> None:
        """Messages given back unprocessed: each waits again as its key's head (first of its key),
        with this delivery's attempt uncounted; the rest of its run waits behind it."""
        slot = self._queues.get(queue) or QueueSlot(queue)
        stats = self.queue_stats[queue]
        redelivery = self.redelivery
        for offset in offsets:
            job = slot.heads.get(offset)
            if job is None and slot.members:
                job = slot.run_head(offset)
                if job is None and (member := slot.members.get(offset)) is not None:
                    stats.released += 1
                    slot.put_back(member, redelivery)  # behind its run's unfinished head, uncounted
                    continue
            if job is None or job.state is not _IN_FLIGHT:
                stats.ignored_verbs += 1
                continue
            stats.released += 1
            redelivery.unwatch(job)
            slot.return_run(job, redelivery)
            job.attempts -= 1
            self._delivery.ready_in(slot, job)

    def extend(self, queue: QueueId, offsets: Iterable[int]) -> None:
        """Messages still being worked on: each one's deadline restarts (``timeout_ms`` from now), at
        most ``max_extensions`` times per delivery."""
        stats = self.queue_stats[queue]
        for offset in offsets:
            job = self.job(queue, offset)
            if job is None or job.state is not _IN_FLIGHT or job.extensions >= job.consumer.config.max_extensions:
                stats.ignored_verbs += 1
                continue
            job.extensions += 1
            stats.extended += 1
            self.redelivery.unwatch(job)
            self.redelivery.watch((job,), job.consumer.config.timeout_ms)

    # parking (engine/parking.py) ---------------------------------------------------------------

    def hold(self, job: UpstreamJob) -> None:
        """Take head ``job`` out of delivery (to park it): off the wheel or the ready line, its run's
        later members back in their key chain."""
        if job.state is _IN_FLIGHT:
            self.redelivery.unwatch(job)
            slot = self._queues.get(job.queue)
            if slot is not None:
                slot.return_run(job, self.redelivery)
        elif job.state is _READY:
            self._delivery.unready(job)
        job.state = _PARKED

    def unhold(self, job: UpstreamJob) -> None:
        """Deliver held or failing head ``job`` again now."""
        if job.state is _READY:
            self._delivery.unready(job)
        self._delivery.make_ready(job)

    def drop_head(self, job: UpstreamJob, reason: str) -> None:
        """Dead-letter head ``job`` now (an operator's skip); its key moves on once it is written."""
        self.hold(job)
        self.redelivery.dead_letter(job, reason)

    # views -------------------------------------------------------------------------------------

    def job(self, queue: QueueId, offset: int) -> UpstreamJob | None:
        """The unfinished job of ``queue`` at ``offset``, if the buffer holds it."""
        slot = self._queues.get(queue)
        return slot.job(offset) if slot is not None else None

    def slot(self, queue: QueueId) -> QueueSlot | None:
        """What the buffer holds of ``queue``, if anything (for many lookups in one queue at once)."""
        return self._queues.get(queue)

    def jobs(self) -> Iterator[UpstreamJob]:
        """Every unfinished job the buffer holds (ready, in flight, waiting for a retry, parked)."""
        for slot in self._queues.values():
            yield from slot.jobs()

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
        return self._delivery.count

    @property
    def in_flight(self) -> int:
        return sum(1 for job in self.jobs() if job.state is _IN_FLIGHT)

    def in_flight_of(self, topic: str) -> int:
        """Jobs of ``topic`` handed to clients and not acked or failed yet."""
        return sum(1 for job in self.jobs() if job.queue.topic == topic and job.state is _IN_FLIGHT)

    @property
    def held(self) -> int:
        """Unfinished jobs in the buffer (ready, in flight, or waiting for a retry)."""
        return sum(slot.held() for slot in self._queues.values())

    @property
    def parked(self) -> int:
        return self._delivery.parked
