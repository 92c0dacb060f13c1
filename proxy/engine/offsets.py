"""OffsetTracker: the committable prefix of one queue.

The reader tracks every offset it reads, in order; jobs finish in any order. The commit point is the
first unfinished offset (or, when everything read is finished, the offset after the last one read),
so a committed offset never passes a message that has not been acked or dead-lettered: a crash
redelivers, it never loses. Offsets are "next to consume" (Kafka's convention).

The offsets finished *past* the commit point are committed too, as ranges (:func:`encode_ranges`),
so the queue's next owner skips them instead of delivering them again: after a crash only what was
unfinished (in flight, waiting) is redelivered.
"""

from __future__ import annotations

from collections import deque

from ddmq.proxy.core.types import StoredMessage


class OffsetTracker:
    __slots__ = (
        "_done", "_next", "_pending", "_skip", "committed", "committed_version", "dropped", "fresh", "last_read",
        "records_cut", "version",
    )

    def __init__(self, start: int, skip: set[int] | None = None) -> None:
        # The containers below are made when first needed (None until then): a proxy may hold thousands
        # of queues that see no message, and an empty deque costs ~0.7 KB, an empty set ~0.2 KB.
        #: Offsets read and not yet known to be below the commit point, in read order.
        self._pending: deque[int] | None = None
        #: Finished offsets that are not at the front of ``_pending`` yet.
        self._done: set[int] | None = None
        self._next = start
        #: The last commit point written to Redis.
        self.committed = start
        #: Set when this proxy gave the queue up: its jobs are discarded as they surface, and a
        #: later tracker for the same queue never sees their finish() calls.
        self.dropped = False
        #: Offsets a previous owner finished past ``start``: finished again as soon as they are read.
        self._skip: set[int] | None = skip or None
        #: Bumped by every finish(); the committer writes when it differs from ``committed_version``.
        self.version = 0
        self.committed_version = 0
        #: The last entry the reader took from the stream: commits and the reader check that the
        #: stream still holds it (a Redis that rolled back does not).
        self.last_read: StoredMessage | None = None
        #: The group had no offset on the queue before this tracker's start: entries trimmed below its
        #: first read were never the group's (a trim racing the group's start), not a loss.
        self.fresh = False
        #: Commits whose record of finished offsets was cut to its bound (see :meth:`finished_beyond`).
        self.records_cut = 0

    def track(self, offset: int) -> bool:
        """Record a read offset. True when an earlier owner already finished it (skip the message)."""
        if offset < self._next:
            raise ValueError(f"offset {offset} read out of order (expected >= {self._next})")
        pending = self._pending
        if pending is None:
            pending = self._pending = deque()
        pending.append(offset)
        self._next = offset + 1
        skip = self._skip
        if skip and offset in skip:
            skip.discard(offset)
            self.finish(offset)
            return True
        return False

    def skip_to(self, offset: int) -> None:
        """No entry exists below ``offset`` past what was read (offsets skipped by the producers)."""
        if offset > self._next:
            self._next = offset
            self.version += 1

    def finish(self, offset: int) -> None:
        self.version += 1
        pending = self._pending
        if pending and pending[0] == offset:
            pending.popleft()
            done = self._done
            if done:
                while pending and pending[0] in done:
                    done.remove(pending.popleft())
        elif self._done is None:
            self._done = {offset}
        else:
            self._done.add(offset)

    def skip_ahead(self, offsets: set[int]) -> int:
        """Offsets finished elsewhere (a replay lease acked at another proxy) before this proxy read
        them: skipped like a previous owner's when they are read. Returns how many were still ahead;
        those already read are beyond reach (they may be out again)."""
        skip = self._skip
        ahead = {offset for offset in offsets if offset >= self._next}
        if skip:
            ahead -= skip
        if ahead:
            if skip is None:
                self._skip = ahead
            else:
                skip |= ahead
            self.version += 1
        return len(ahead)

    @property
    def commit_point(self) -> int:
        pending = self._pending
        return pending[0] if pending else self._next

    @property
    def next_offset(self) -> int:
        """The next offset the reader will ask for."""
        return self._next

    @property
    def unfinished(self) -> int:
        pending, done = self._pending, self._done
        return (len(pending) if pending is not None else 0) - (len(done) if done is not None else 0)

    def finished_beyond(self) -> str:
        """The offsets finished past the commit point, encoded for storage: with those a previous owner
        (or an ack elsewhere) finished and this proxy has not read yet, which a commit must not drop.

        Bounded (:data:`FINISHED_RECORD_BYTES`, :data:`FINISHED_RECORD_OFFSETS`): a key held back long
        (a slow head while the rest of the queue flows) leaves many holes; past the bound the highest
        records are left out, counted in :attr:`records_cut`, and a next owner delivers those again."""
        text, cut = bounded_ranges(sorted({*(self._done or ()), *(self._skip or ())}), FINISHED_RECORD_BYTES,
                                   FINISHED_RECORD_OFFSETS)
        if cut:
            self.records_cut += 1
        return text


#: Most bytes of a queue's stored record of offsets finished past its commit point.
FINISHED_RECORD_BYTES = 1 << 20
#: Most offsets that record covers (what a next owner reads back: see :func:`decode_ranges`).
FINISHED_RECORD_OFFSETS = 1_000_000


def encode_ranges(offsets: list[int]) -> str:
    """Sorted offsets as ``"3-7,9,12-13"``; dense offsets make this short."""
    return bounded_ranges(offsets, 0, 0)[0]


def bounded_ranges(offsets: list[int], max_bytes: int, max_offsets: int) -> tuple[str, bool]:
    """:func:`encode_ranges`, cut to at most ``max_bytes`` of text covering ``max_offsets`` offsets (0:
    no bound), the lowest ranges kept; and whether it was cut."""
    parts: list[str] = []
    size = covered = 0
    i = 0
    while i < len(offsets):
        j = i
        while j + 1 < len(offsets) and offsets[j + 1] == offsets[j] + 1:
            j += 1
        part = str(offsets[i]) if i == j else f"{offsets[i]}-{offsets[j]}"
        size += len(part) + 1
        covered += j - i + 1
        if (max_bytes and size - 1 > max_bytes) or (max_offsets and covered > max_offsets):
            return ",".join(parts), True
        parts.append(part)
        i = j + 1
    return ",".join(parts), False


def decode_ranges(text: str, limit: int = 1_000_000) -> set[int]:
    """Inverse of :func:`encode_ranges`; ValueError on malformed text or more than ``limit`` offsets."""
    offsets: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        if high < low or len(offsets) + high - low + 1 > limit:
            raise ValueError(f"bad or oversized range {part!r}")
        offsets.update(range(low, high + 1))
    return offsets
