"""The pull buffer's answers to what clients and operators say beside acks and fails: a message given
back (release) or still being worked on (extend), and a key's head taken out of delivery and put back
(hold, unhold, drop_head: :mod:`ddmq.proxy.engine.parking`); and the lookups of the jobs the buffer
holds. A base class of :class:`~ddmq.proxy.engine.pull_buffer.PullBuffer`, as
:class:`~ddmq.proxy.engine.runs.RunBuffer` is; the verbs' rules are in :mod:`ddmq.proxy.engine.verbs`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from typing import Final

from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.ready_line import ReadyLine
from ddmq.proxy.engine.redelivery import BufferStats
from ddmq.proxy.engine.runs import RunBuffer

__all__ = ["HoldBuffer"]

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_READY: Final = JobState.READY
_IN_FLIGHT: Final = JobState.IN_FLIGHT


class HoldBuffer(RunBuffer):
    """Release, extend and the parking steps, over the maps the pull buffer shares with it."""

    _ready: dict[QueueId, ReadyLine]
    _ready_count: int
    queue_stats: defaultdict[QueueId, BufferStats]

    def _make_ready(self, job: UpstreamJob) -> None:
        raise NotImplementedError

    def job(self, queue: QueueId, offset: int) -> UpstreamJob | None:
        """The unfinished job of ``queue`` at ``offset``, if the buffer holds it."""
        jobs = self._jobs.get(queue)
        job = jobs.get(offset) if jobs is not None else None
        if job is None and queue in self._runs:
            job = self._runs[queue].get(offset)
        return job

    def jobs(self) -> Iterator[UpstreamJob]:
        """Every unfinished job the buffer holds (ready, in flight, waiting for a retry)."""
        for jobs in self._jobs.values():
            yield from jobs.values()
        for members in self._runs.values():
            yield from members.values()

    # parking (engine/parking.py) ---------------------------------------------------------------

    def hold(self, job: UpstreamJob) -> None:
        """Take head ``job`` out of delivery (to park it): off the wheel or the ready line, its run's
        later members back in their key chain."""
        if job.state is _IN_FLIGHT:
            self.redelivery.unwatch(job)
            self._return_run(job)
        elif job.state is _READY:
            self._unready(job)
        job.state = JobState.PARKED

    def unhold(self, job: UpstreamJob) -> None:
        """Deliver held or failing head ``job`` again now."""
        if job.state is _READY:
            self._unready(job)
        self._make_ready(job)

    def drop_head(self, job: UpstreamJob, reason: str) -> None:
        """Dead-letter head ``job`` now (an operator's skip); its key moves on once it is written."""
        self.hold(job)
        self.redelivery.dead_letter(job, reason)

    def _unready(self, job: UpstreamJob) -> None:
        ready = self._ready.get(job.queue)
        if ready is not None and ready.remove(job):  # an operator's action: O(n) once, not on the delivery path
            self._ready_count -= 1


    # client verbs (engine/verbs.py) ---------------------------------------------------------

    def release(self, queue: QueueId, offsets: Iterable[int]) -> None:
        """Messages given back unprocessed: each waits again as its key's head (first of its key),
        with this delivery's attempt uncounted; the rest of its run waits behind it."""
        stats = self.queue_stats[queue]
        for offset in offsets:
            job = self._jobs.get(queue, {}).get(offset)
            if job is None and queue in self._runs:
                job = self._run_head(queue, offset)
                if job is None and (member := self._runs[queue].get(offset)) is not None:
                    stats.released += 1
                    self._put_back(member)  # behind its run's unfinished head, uncounted
                    continue
            if job is None or job.state is not _IN_FLIGHT:
                stats.ignored_verbs += 1
                continue
            stats.released += 1
            self.redelivery.unwatch(job)
            self._return_run(job)
            job.attempts -= 1
            self._make_ready(job)

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
