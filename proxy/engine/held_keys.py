"""HeldKeys: the messages of keys at their cap, left in Redis and remembered by offset.

A key holds at most ``key_buffer`` jobs in memory (its head and the successors linked behind it in the
key gate). A message read for a key at its cap, or for a key that already has messages left in Redis,
is *held*: its job is dropped, it stops counting against ``concurrency``, and its offset is remembered
here, per key and queue, in read order. The reader goes on past it, so the rest of the topic keeps
flowing whatever the shape of one key's backlog.

When the key gate sees a held key drain to half its cap, the key is *wanted*: the chain's resumer
(:meth:`~ddmq.proxy.engine.chain_run.ChainRun.resume_held`) reads its oldest held offsets again by
offset and runs them down the chain, in order, before anything read later for the key: while a key has
held offsets, everything read for it is held too. The offsets stay unfinished in the queue's
:class:`~ddmq.proxy.engine.offsets.OffsetTracker`, so the commit point never passes one: a crash or a
hand-off delivers them again from Redis.

Memory is bounded per queue: past :data:`HELD_PER_QUEUE` held offsets (8 bytes each in an array, plus
the deque's blocks) the queue's reader waits until some are read again (:meth:`HeldKeys.wait_below`);
the topic's other queues read on.
"""

from __future__ import annotations

import asyncio
from array import array
from collections import Counter, deque
from collections.abc import Callable, Hashable
from itertools import islice

from ddmq.proxy.engine.job import UpstreamJob
from ddmq.proxy.engine.tenants import TenantShares

__all__ = ["HELD_PER_QUEUE", "HeldKeys"]

#: Most offsets held per queue; past it the queue's reader waits (about 1 MB of offsets).
HELD_PER_QUEUE = 100_000
#: Offsets per block of a key's record: an ``array`` of 8-byte offsets, where a deque of ints costs
#: 36 bytes per offset.
_BLOCK = 1024


class _Offsets:
    """The held offsets of one key in one queue, oldest first, in blocks of :data:`_BLOCK`."""

    __slots__ = ("blocks", "first", "size")

    def __init__(self) -> None:
        self.blocks: deque[array[int]] = deque()
        #: Index of the oldest offset in ``blocks[0]``.
        self.first = 0
        self.size = 0

    def append(self, offset: int) -> None:
        blocks = self.blocks
        if not blocks or len(blocks[-1]) == _BLOCK:
            blocks.append(array("q"))
        blocks[-1].append(offset)
        self.size += 1

    def oldest(self, n: int) -> list[int]:
        """Up to ``n`` of the oldest offsets (left in place)."""
        taken: list[int] = []
        start = self.first
        for block in self.blocks:
            taken.extend(block[start:start + n - len(taken)])
            start = 0
            if len(taken) >= n:
                break
        return taken

    def drop_oldest(self, n: int) -> None:
        self.size -= n
        blocks = self.blocks
        while n:
            block = blocks[0]
            here = min(n, len(block) - self.first)
            self.first += here
            n -= here
            if self.first == len(block):
                blocks.popleft()
                self.first = 0


class HeldKeys:
    """The held offsets of one group's topic, per key and queue (see the module's docstring).
    ``on_hold(job)`` is told of every job set aside, so the topic stops counting it."""

    def __init__(self, on_hold: Callable[[UpstreamJob], None], per_queue: int = HELD_PER_QUEUE) -> None:
        #: Per key: per qid, its held offsets. The key gate asks ``key in keys`` only while it is not empty.
        self.keys: dict[Hashable, dict[int, _Offsets]] = {}
        #: The topic's tenants (``fair_key``), told which keys are held for whom; None without tenants.
        self.tenants: TenantShares | None = None
        #: With tenants: per held key, the tenant of the message that began its hold.
        self.tenant_of: dict[Hashable, str] = {}
        #: Held offsets per qid.
        self.per_queue: Counter[int] = Counter()
        self.per_queue_limit = per_queue
        self._on_hold = on_hold
        #: Keys to read again, oldest want first (a dict: each key once).
        self._wanted: dict[Hashable, None] = {}
        self._want = asyncio.Event()
        #: Readers waiting for their queue to fall under the limit, by qid.
        self._below: dict[int, asyncio.Event] = {}
        #: Messages held and read again so far (for /metrics).
        self.held_total = 0
        self.resumed_total = 0

    def __len__(self) -> int:
        return len(self.keys)

    def hold(self, job: UpstreamJob, key: Hashable | None = None) -> None:
        """Leave ``job``'s message in Redis (its key is at its cap or has held messages already, or its
        tenant holds its share), remembered under its order key or ``key``."""
        if key is None:
            key = job.order_key
        queues = self.keys.get(key)
        if queues is None:
            queues = self.keys[key] = {}
            tenants = self.tenants
            if tenants is not None:
                tenant = job.tenant or ""
                self.tenant_of[key] = tenant
                tenants.held_key(tenant, key)
        offsets = queues.get(job.qid)
        if offsets is None:
            offsets = queues[job.qid] = _Offsets()
        offsets.append(job.offset)
        self.per_queue[job.qid] += 1
        self.held_total += 1
        self._on_hold(job)

    def want(self, key: Hashable) -> None:
        """``key`` drained far enough: read its held messages again (:meth:`next_wanted` gives it out)."""
        if key in self.keys and key not in self._wanted:
            self._wanted[key] = None
            self._want.set()

    async def next_wanted(self, most: int) -> list[Hashable]:
        """Up to ``most`` of the keys wanted longest, oldest want first (waits for one)."""
        while not self._wanted:
            self._want.clear()
            await self._want.wait()
        wanted = self._wanted
        keys = list(islice(wanted, most))
        for key in keys:
            del wanted[key]
        return keys

    def oldest(self, key: Hashable, n: int) -> tuple[int, list[int]] | None:
        """Up to ``n`` of ``key``'s oldest held offsets in one of its queues, or None when it has none."""
        queues = self.keys.get(key)
        if not queues:
            return None
        qid, offsets = next(iter(queues.items()))
        return qid, offsets.oldest(n)

    def taken(self, key: Hashable, qid: int, offsets: list[int]) -> bool:
        """``offsets`` (from :meth:`oldest`) are read again: forget them. False when they are not the
        key's oldest in ``qid`` any more (the queue was dropped meanwhile): nothing is forgotten."""
        record = self.keys.get(key, {}).get(qid)
        if record is None or record.oldest(len(offsets)) != offsets:
            return False
        record.drop_oldest(len(offsets))
        if not record.size:
            queues = self.keys[key]
            del queues[qid]
            if not queues:
                self._gone(key)
        self._counted_out(qid, len(offsets))
        self.resumed_total += len(offsets)
        return True

    def forget(self, qid: int) -> None:
        """Queue ``qid`` moved away: its held offsets are its next owner's to read."""
        if not self.per_queue.get(qid):
            return
        for key in [key for key, queues in self.keys.items() if qid in queues]:
            queues = self.keys[key]
            del queues[qid]
            if not queues:
                self._gone(key)
                self._wanted.pop(key, None)
            else:
                self.want(key)  # held in another queue too: read those (its resume may have stopped at this one)
        self._counted_out(qid, self.per_queue[qid])

    def _gone(self, key: Hashable) -> None:
        """``key`` has no held offsets left."""
        del self.keys[key]
        if self.tenants is not None:
            self.tenants.unheld_key(self.tenant_of.pop(key, ""), key)

    def _counted_out(self, qid: int, n: int) -> None:
        left = self.per_queue[qid] - n
        if left > 0:
            self.per_queue[qid] = left
        else:
            del self.per_queue[qid]
        below = self._below.get(qid)
        if below is not None and left < self.per_queue_limit:
            below.set()

    def full(self, qid: int) -> bool:
        return self.per_queue.get(qid, 0) >= self.per_queue_limit

    async def wait_below(self, qid: int) -> None:
        """Return once queue ``qid`` holds fewer than the limit."""
        while self.full(qid):
            below = self._below.get(qid)
            if below is None:
                below = self._below[qid] = asyncio.Event()
            below.clear()
            await below.wait()
        self._below.pop(qid, None)

    def held_of(self, key: Hashable) -> int:
        """Offsets held for ``key`` (for admin views)."""
        return sum(offsets.size for offsets in self.keys.get(key, {}).values())
