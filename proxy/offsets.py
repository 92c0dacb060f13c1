"""OffsetTracker: the committable prefix of one queue.

The reader tracks every offset it reads, in order; jobs finish in any order. The commit point is the
first unfinished offset (or, when everything read is finished, the offset after the last one read),
so a committed offset never passes a message that has not been acked or dead-lettered: a crash
redelivers, it never loses. Offsets are "next to consume" (Kafka's convention).
"""

from __future__ import annotations

from collections import deque


class OffsetTracker:
    __slots__ = ("_done", "_next", "_pending", "committed", "dropped")

    def __init__(self, start: int) -> None:
        #: Offsets read and not yet known to be below the commit point, in read order.
        self._pending: deque[int] = deque()
        #: Finished offsets that are not at the front of ``_pending`` yet.
        self._done: set[int] = set()
        self._next = start
        #: The last commit point written to Redis.
        self.committed = start
        #: Set when this proxy gave the queue up: its jobs are discarded as they surface, and a
        #: later tracker for the same queue never sees their finish() calls.
        self.dropped = False

    def track(self, offset: int) -> None:
        if offset < self._next:
            raise ValueError(f"offset {offset} read out of order (expected >= {self._next})")
        self._pending.append(offset)
        self._next = offset + 1

    def finish(self, offset: int) -> None:
        pending = self._pending
        if pending and pending[0] == offset:
            pending.popleft()
            done = self._done
            while pending and pending[0] in done:
                done.remove(pending.popleft())
        else:
            self._done.add(offset)

    @property
    def commit_point(self) -> int:
        return self._pending[0] if self._pending else self._next

    @property
    def next_offset(self) -> int:
        """The next offset the reader will ask for."""
        return self._next

    @property
    def unfinished(self) -> int:
        return len(self._pending) - len(self._done)
