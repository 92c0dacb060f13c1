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
from collections.abc import Iterator, Mapping

from ddmq.proxy.engine.job import UpstreamJob

__all__ = ["FairReadyLine", "ReadyLine"]


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


class FairReadyLine(ReadyLine):
    """A queue's ready heads with tenants (``fair_key``): a :class:`ReadyLine` per tenant, served in
    turns, each tenant's oldest first, ``weight`` messages per turn (deficit round-robin: a weight of
    0.5 is served every other turn, one of 3 three in a row). Oldest first across tenants would hand a
    big tenant's messages out before the others' every time, as its backlog is older; in turns, while
    several tenants have ready messages each gets its weighted share of every pull.

    :meth:`first` gives a job of the line (the next tenant's oldest), which is what the buffer asks it
    for: the consumer its jobs share. A subclass, its own storage unused, so that the compiled buffer
    calls either line through the same native methods rather than a union's generic calls."""

    __slots__ = ("_count", "_credit", "_lines", "_turns", "_weights")

    def __init__(self, weights: Mapping[str, float]) -> None:
        super().__init__()
        self._weights = weights
        self._lines: dict[str | None, ReadyLine] = {}
        #: Tenants with ready jobs, the one whose turn it is first.
        self._turns: deque[str | None] = deque()
        #: What each tenant in turn may still take (messages; fractions carry to its next turn).
        self._credit: dict[str | None, float] = {}
        self._count = 0

    def _weight(self, tenant: str | None) -> float:
        return self._weights.get(tenant, 1.0) if tenant is not None else 1.0

    def append(self, job: UpstreamJob) -> None:
        tenant = job.tenant
        line = self._lines.get(tenant)
        if line is None:
            line = self._lines[tenant] = ReadyLine()
            self._turns.append(tenant)
        line.append(job)
        self._count += 1

    def put_front(self, job: UpstreamJob) -> None:
        """Put back the job :meth:`popleft` just returned: its tenant's turn again, its credit back."""
        tenant = job.tenant
        turns = self._turns
        line = self._lines.get(tenant)
        if line is None:
            line = self._lines[tenant] = ReadyLine()
            turns.appendleft(tenant)
        elif turns[0] != tenant:
            turns.remove(tenant)  # O(tenants), on a reply full by bytes only
            turns.appendleft(tenant)
        line.put_front(job)
        self._credit[tenant] = self._credit.get(tenant, 0.0) + 1.0
        self._count += 1

    def popleft(self) -> UpstreamJob:
        turns = self._turns
        credits = self._credit
        while True:
            tenant = turns[0]
            credit = credits.get(tenant, 0.0)
            if credit < 1.0:
                credit += self._weight(tenant)  # its turn begins
                if credit < 1.0:
                    credits[tenant] = credit
                    turns.rotate(-1)
                    continue
            line = self._lines[tenant]
            job = line.popleft()
            self._count -= 1
            credit -= 1.0
            if not line:  # nothing ready left: its turn ends, and so does its credit
                del self._lines[tenant]
                credits.pop(tenant, None)
                turns.popleft()
            else:
                credits[tenant] = credit
                if credit < 1.0:
                    turns.rotate(-1)
            return job

    def first(self) -> UpstreamJob:
        return self._lines[self._turns[0]].first()

    def remove(self, job: UpstreamJob) -> bool:
        tenant = job.tenant
        line = self._lines.get(tenant)
        if line is None or not line.remove(job):
            return False
        self._count -= 1
        if not line:
            del self._lines[tenant]
            self._credit.pop(tenant, None)
            self._turns.remove(tenant)
        return True

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __iter__(self) -> Iterator[UpstreamJob]:
        for line in self._lines.values():
            yield from line
