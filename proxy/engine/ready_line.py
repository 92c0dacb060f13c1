"""ReadyLine: a queue's runnable heads in the pull buffer, oldest offset first (one per
:class:`~ddmq.proxy.engine.queue_slot.QueueSlot`).

Each order key has at most one runnable message (its head), so the order among a queue's ready jobs is
free; serving the oldest first is the queue's own order with blocked keys skipped. A successor that
waited behind its key, or a message back from a retry, is older than the heads read after it, so it
goes out before them instead of waiting again behind newer keys (DDMQ's reactivation queue meant the
same), and the committed offset, which stops at the first unfinished message, moves sooner.

The reader's batches arrive in offset order and go to a plain deque in O(1). A job older than the
deque's last one (a successor, a retry) goes to a heap beside it: successors come in the order their
heads were acked, but their own offsets are wherever their keys next appear, so a second deque for
them would rarely stay sorted. The front of the line is the older of the two fronts.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator

from ddmq.proxy.engine.job import UpstreamJob

__all__ = ["ReadyLine"]


class ReadyLine:
    __slots__ = ("_late", "_late_jobs", "_sorted", "_twins")

    def __init__(self) -> None:
        self._sorted: deque[UpstreamJob] = deque()  # ascending offsets
        # What came after a younger job: a heap of offsets (ints compare in C, and no tuple per job)
        # and the jobs by offset. A second job with an offset already there waits in _twins.
        self._late: list[int] = []
        self._late_jobs: dict[int, UpstreamJob] = {}
        self._twins: list[UpstreamJob] = []

    def append(self, job: UpstreamJob) -> None:
        ordered = self._sorted
        offset = job.offset
        if not ordered or ordered[-1].offset < offset:
            ordered.append(job)
            return
        heapq.heappush(self._late, offset)
        if offset in self._late_jobs:
            self._twins.append(job)
        else:
            self._late_jobs[offset] = job

    def put_front(self, job: UpstreamJob) -> None:
        """Put back the job :meth:`popleft` just returned: it is still the oldest."""
        self._sorted.appendleft(job)

    def popleft(self) -> UpstreamJob:
        late = self._late
        if late and (not self._sorted or late[0] < self._sorted[0].offset):
            offset = heapq.heappop(late)
            if self._twins:
                twin = self._twin(offset)
                if twin >= 0:
                    return self._twins.pop(twin)
            return self._late_jobs.pop(offset)
        return self._sorted.popleft()

    def first(self) -> UpstreamJob:
        late = self._late
        if late and (not self._sorted or late[0] < self._sorted[0].offset):
            return self._late_jobs[late[0]]
        return self._sorted[0]

    def remove(self, job: UpstreamJob) -> bool:
        """Take ``job`` out wherever it is (an operator's action: O(n)); False if it is not here."""
        if job in self._sorted:
            self._sorted.remove(job)
            return True
        offset = job.offset
        if self._late_jobs.get(offset) is job:
            twin = self._twin(offset)
            if twin >= 0:  # the twin takes its place
                self._late_jobs[offset] = self._twins.pop(twin)
            else:
                del self._late_jobs[offset]
        elif any(entry is job for entry in self._twins):
            self._twins = [entry for entry in self._twins if entry is not job]
        else:
            return False
        self._late.remove(offset)
        heapq.heapify(self._late)
        return True

    def _twin(self, offset: int) -> int:
        for index, entry in enumerate(self._twins):
            if entry.offset == offset:
                return index
        return -1

    def __len__(self) -> int:
        return len(self._sorted) + len(self._late)

    def __bool__(self) -> bool:
        return bool(self._sorted) or bool(self._late)

    def __iter__(self) -> Iterator[UpstreamJob]:
        """Every job in the line, in no particular order."""
        yield from self._sorted
        yield from self._late_jobs.values()
        yield from self._twins
