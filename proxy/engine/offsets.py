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

import re
from collections import deque
from typing import Final

from ddmq.proxy.core.types import StoredMessage


class OffsetTracker:
    __slots__ = (
        "_base", "_bits", "_first", "_gaps", "_next", "_open", "_skip", "committed", "committed_version", "dropped",
        "fresh", "last_read", "records_cut", "version",
    )

    def __init__(self, start: int, skip: set[int] | None = None) -> None:
        # The containers below are made when first needed (None until then): a proxy may hold thousands
        # of queues that see no message, and an empty bytearray or set still costs its header.
        #: One bit per offset from ``_base``: set while the offset is read and unfinished. A bit, not an
        #: entry per offset: a key held back (a slow head, a hot key's backlog) keeps every offset read
        #: after it above the commit point, where an entry per offset (a deque of ints, a set of the
        #: finished ones) would cost 40-100 bytes each and a bit costs an eighth of a byte.
        self._bits: bytearray | None = None
        #: The offset of bit 0 of ``_bits``.
        self._base = start
        #: The lowest unfinished offset while ``_open`` > 0.
        self._first = start
        #: How many offsets are read and unfinished (the set bits).
        self._open = 0
        #: Offsets inside the window (``_base`` up) that the reader never read (missing from the stream):
        #: ``(first, last)`` ranges, oldest first, so the record of finished offsets leaves them out.
        self._gaps: deque[tuple[int, int]] | None = None
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
        expected = self._next
        if offset < expected:
            raise ValueError(f"offset {offset} read out of order (expected >= {expected})")
        self._next = offset + 1
        skip = self._skip
        if skip and offset in skip:
            skip.discard(offset)
            if self._open and offset > expected:
                self._gap(expected, offset - 1)
            self.version += 1  # finished, as if read and finished at once
            return True
        bits = self._bits
        if bits is None or not self._open:
            # Nothing unfinished, so every bit is clear: the window starts again at this offset.
            if bits is None:
                bits = self._bits = bytearray(_GROW)
            elif len(bits) > _GROW:
                del bits[_GROW:]
            self._gaps = None
            self._base = self._first = offset
            bits[0] = 1
            self._open = 1
            return False
        if offset > expected:
            self._gap(expected, offset - 1)
        index = offset - self._base
        byte = index >> 3
        if byte >= len(bits):
            bits.extend(bytes(byte - len(bits) + _GROW))
        bits[byte] |= 1 << (index & 7)
        self._open += 1
        return False

    def _gap(self, first: int, last: int) -> None:
        gaps = self._gaps
        if gaps is None:
            gaps = self._gaps = deque()
        gaps.append((first, last))

    def skip_to(self, offset: int) -> None:
        """No entry exists below ``offset`` past what was read (offsets skipped by the producers)."""
        if offset > self._next:
            if self._open:
                self._gap(self._next, offset - 1)
            self._next = offset
            self.version += 1

    def finish(self, offset: int) -> None:
        self.version += 1
        bits = self._bits
        index = offset - self._base
        if bits is None or index < 0:
            return
        byte = index >> 3
        if byte >= len(bits):
            return
        mask = 1 << (index & 7)
        value = bits[byte]
        if not value & mask:
            return  # finished already, or never read
        value ^= mask
        bits[byte] = value
        self._open -= 1
        if offset != self._first or not self._open:
            return
        # The commit point moves to the next unfinished offset.
        if not value:
            byte += 1
            value = bits[byte]  # in range: _open > 0, so a bit is set above
            if not value:
                found = _SET_BYTE.search(bits, byte + 1)
                assert found is not None
                byte = found.start()
                value = bits[byte]
        self._first = self._base + (byte << 3) + (value & -value).bit_length() - 1
        if byte >= _GROW and byte * 2 >= len(bits):
            # Most of the map lies below the commit point now: drop that part (at most once per half
            # of the map, so amortised over the finishes that moved the commit point there).
            del bits[:byte]
            base = self._base = self._base + (byte << 3)
            gaps = self._gaps
            while gaps and gaps[0][1] < base:
                gaps.popleft()

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
        return self._first if self._open else self._next

    @property
    def next_offset(self) -> int:
        """The next offset the reader will ask for."""
        return self._next

    @property
    def unfinished(self) -> int:
        return self._open

    def finished_beyond(self) -> str:
        """The offsets finished past the commit point, encoded for storage: with those a previous owner
        (or an ack elsewhere) finished and this proxy has not read yet, which a commit must not drop.

        Bounded (:data:`FINISHED_RECORD_BYTES`, :data:`FINISHED_RECORD_OFFSETS`): a key held back long
        (a slow head while the rest of the queue flows) leaves many holes; past the bound the highest
        records are left out, counted in :attr:`records_cut`, and a next owner delivers those again."""
        runs = self._finished_runs()
        skip = self._skip
        if skip:
            runs = _merged(runs, _runs(sorted(skip)))
        text, cut = _bounded_runs(runs, FINISHED_RECORD_BYTES, FINISHED_RECORD_OFFSETS)
        if cut:
            self.records_cut += 1
        return text

    def _finished_runs(self) -> list[tuple[int, int]]:
        """``(first, last)`` runs of the offsets read and finished between the commit point and the
        next offset to read (the window's clear bits, less its gaps), lowest first."""
        bits = self._bits
        if not self._open or bits is None:
            return []
        base, end = self._base, self._next
        runs: list[tuple[int, int]] = []
        start = -1  # first offset of the run of clear bits under way, or -1
        byte = (self._first - base) >> 3
        last_byte = (end - 1 - base) >> 3
        while byte <= last_byte:
            value = bits[byte]
            offset = base + (byte << 3)
            if value == 0:
                if start < 0:
                    start = offset
            elif value == 0xFF:
                if start >= 0:
                    runs.append((start, offset - 1))
                    start = -1
            else:
                for bit in range(8):
                    if value >> bit & 1:
                        if start >= 0:
                            runs.append((start, offset + bit - 1))
                            start = -1
                    elif start < 0:
                        start = offset + bit
            byte += 1
        if 0 <= start < end:  # the last byte's clear bits past ``end`` are no offsets
            runs.append((start, end - 1))
        # The commit point's byte may have clear bits below it: those are below the commit point.
        runs = [run for run in runs if run[1] > self._first]
        gaps = self._gaps
        return _without(runs, gaps) if gaps else runs


#: Bytes the window's bit map grows by (and keeps when it starts again): 8,192 offsets.
_GROW: Final = 1024
#: A byte with any bit set (an unfinished offset).
_SET_BYTE: Final = re.compile(b"[^\\x00]")


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted ``offsets`` as ``(first, last)`` runs of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def _merged(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Two lists of sorted runs as one, runs that touch joined."""
    if not a:
        return b
    out: list[tuple[int, int]] = []
    for first, last in sorted(a + b):
        if out and first <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], last))
        else:
            out.append((first, last))
    return out


def _without(runs: list[tuple[int, int]], gaps: deque[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` less the offsets of ``gaps`` (both sorted, neither overlapping itself)."""
    out: list[tuple[int, int]] = []
    holes = iter(gaps)
    hole = next(holes, None)
    for first, last in runs:
        while first <= last:
            while hole is not None and hole[1] < first:
                hole = next(holes, None)
            if hole is None or hole[0] > last:
                out.append((first, last))
                break
            if hole[0] > first:
                out.append((first, hole[0] - 1))
            first = hole[1] + 1
    return out


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
    return _bounded_runs(_runs(offsets), max_bytes, max_offsets)


def _bounded_runs(runs: list[tuple[int, int]], max_bytes: int, max_offsets: int) -> tuple[str, bool]:
    """Sorted ``(first, last)`` runs as ``"3-7,9,12-13"``, cut as :func:`bounded_ranges` says."""
    parts: list[str] = []
    size = covered = 0
    for first, last in runs:
        part = str(first) if first == last else f"{first}-{last}"
        size += len(part) + 1
        covered += last - first + 1
        if (max_bytes and size - 1 > max_bytes) or (max_offsets and covered > max_offsets):
            return ",".join(parts), True
        parts.append(part)
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
