"""QueueSlot: one queue's place in its group's pull buffer.

A slot holds what the buffer keeps of one queue: its unfinished jobs by offset (the keys' heads, and
apart from them the *run members* in flight behind their heads), its
:class:`~ddmq.proxy.engine.ready_line.ReadyLine`, and the offsets finished at another proxy that wait
here behind their keys. The group's :class:`~ddmq.proxy.engine.pull_buffer.PullBuffer` holds one slot
per queue in one dict, so a queue that moves away is forgotten by dropping its slot.

The slot's own steps are the ones that need nothing but the queue: looking jobs up, moving a run member
to the heads once it is its key's head, putting a run back in its keys' chains (docs/design/engine.md,
"Ordered runs"), finishing a job. Its counters are not here: they outlive the slot (see
:attr:`PullBuffer.queue_stats <ddmq.proxy.engine.pull_buffer.PullBuffer.queue_stats>`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from ddmq.proxy.core.types import QueueId, StoredMessage
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.ready_line import FairReadyLine, ReadyLine
from ddmq.proxy.engine.redelivery import Redelivery

if TYPE_CHECKING:
    from ddmq.proxy.engine.offsets import OffsetTracker

__all__ = ["DELIVERY_FIELDS", "QueueSlot", "not_held"]

#: What :meth:`QueueSlot.deliveries` writes per message, one after another in one flat list of ints: its
#: offset, attempts, deadline tick and extensions (-1 for each of the last three when the slot does not
#: hold it). Flat: a tuple per message made every pull's record cost an allocation and GC work per
#: message, which the retry memo of every SDK pull paid for.
DELIVERY_FIELDS: Final = 4


def not_held(messages: Sequence[StoredMessage]) -> list[int]:
    """:meth:`QueueSlot.deliveries`' record of ``messages`` when no slot holds any of them."""
    sent: list[int] = []
    for message in messages:
        sent += (message.offset, -1, -1, -1)
    return sent

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_IN_FLIGHT: Final = JobState.IN_FLIGHT
_WAITING: Final = JobState.WAITING
_FINISHED: Final = JobState.FINISHED


class QueueSlot:
    """What the pull buffer holds of one queue."""

    __slots__ = ("finished_elsewhere", "heads", "members", "queue", "ready")

    def __init__(self, queue: QueueId) -> None:
        self.queue = queue
        #: Unfinished jobs by offset, run members aside: ready, in flight, waiting for a retry, parked.
        self.heads: dict[int, UpstreamJob] = {}
        #: Run members in flight behind their keys' heads, by offset. Acks and fails look at the heads
        #: first, so clients without runs never look here.
        self.members: dict[int, UpstreamJob] = {}
        #: The ready heads, oldest offset first (with tenants, in the tenants' turns).
        self.ready = ReadyLine()
        #: Offsets finished elsewhere (a replay lease acked at another proxy) that were read here but wait
        #: behind their key: finished instead of made ready when they get here (``finish_elsewhere``).
        self.finished_elsewhere: set[int] = set()

    def make_fair(self, weights: Mapping[str, float]) -> None:
        """Its jobs have tenants: serve them in turns (:class:`~ddmq.proxy.engine.ready_line.FairReadyLine`)."""
        fair = FairReadyLine(weights)
        for job in self.ready:
            fair.append(job)
        self.ready = fair

    def job(self, offset: int) -> UpstreamJob | None:
        """The unfinished job at ``offset``, if the slot holds it."""
        job = self.heads.get(offset)
        if job is None and self.members:
            job = self.members.get(offset)
        return job

    def deliveries(self, messages: Sequence[StoredMessage]) -> tuple[OffsetTracker | None, list[int]]:
        """How each of ``messages`` is delivered now (:data:`DELIVERY_FIELDS` ints each), and the tracker
        of the read they came from (None when the slot holds none of them): what a retry of the pull that
        answered them compares with."""
        heads, members = self.heads, self.members
        tracker = None
        sent: list[int] = []
        for message in messages:
            offset = message.offset
            job = heads.get(offset)
            if job is None and members:
                job = members.get(offset)
            sent.append(offset)
            if job is None:  # kept in place, never live: the runs' sizes count by position
                sent.append(-1)
                sent.append(-1)
                sent.append(-1)
            else:
                tracker = job.tracker
                sent.append(job.attempts)
                sent.append(job.deadline)
                sent.append(job.extensions)
        return tracker, sent

    def jobs(self) -> Iterator[UpstreamJob]:
        """Every unfinished job of the queue: the heads, then the run members in their chains' order."""
        yield from self.heads.values()
        yield from self.members.values()

    def held(self) -> int:
        return len(self.heads) + len(self.members)

    def in_flight(self) -> int:
        """Jobs handed to clients and not acked or failed yet (what a hand-off of the queue waits for)."""
        return sum(1 for job in self.jobs() if job.state is _IN_FLIGHT)

    def finish(self, job: UpstreamJob) -> None:
        """``job`` is done (acked, finished elsewhere, dead-lettered): its consumer releases its key."""
        job.state = _FINISHED
        self.heads.pop(job.offset, None)
        job.consumer.finish(job)

    # runs ----------------------------------------------------------------------------------------

    def run_head(self, offset: int) -> UpstreamJob | None:
        """The run member at ``offset`` when it is its key's head now (moved to the heads), else None."""
        job = self.members.get(offset)
        if job is None or not job.consumer.is_head(job):
            return None
        self.promote(job)
        return job

    def promote(self, job: UpstreamJob) -> None:
        """Run member ``job`` became its key's head: keep it with the heads from now on."""
        del self.members[job.offset]
        self.heads[job.offset] = job

    def return_run(self, job: UpstreamJob, redelivery: Redelivery) -> None:
        """``job`` failed or timed out: the rest of its run, still in flight, waits again in its key's
        chain (attempts not counted) and goes out once ``job`` is finished."""
        successor = job.next
        if successor is not None and successor.state is _IN_FLIGHT:
            self.put_back(successor, redelivery)

    def put_back(self, member: UpstreamJob, redelivery: Redelivery) -> None:
        """Run member ``member`` and the in-flight members behind it wait in their key's chain again."""
        members = self.members
        job: UpstreamJob | None = member
        while job is not None and job.state is _IN_FLIGHT:
            redelivery.unwatch(job)
            job.state = _WAITING
            job.attempts -= 1
            del members[job.offset]
            job = job.next

    def drop(self, redelivery: Redelivery) -> list[UpstreamJob]:
        """The queue moved away: its jobs leave delivery (off the timing wheel, finished for the buffer);
        returns them, heads first, then run members in their chains' order: the caller releases them in
        this order."""
        dropped = [*self.heads.values(), *self.members.values()]
        for job in dropped:
            if job.state is _IN_FLIGHT:
                redelivery.unwatch(job)
            job.state = _FINISHED
        return dropped
