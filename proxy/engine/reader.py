"""QueueReader: reads one queue strictly in offset order, as fast as its topic has room.

The readers of one group's topic share a :class:`TopicReads`: Redis, the topic's jobs (room, rate
limit, lease check: :class:`ReadJobs`) and the callbacks a read ends in. The one who wires the topic's
pieces builds it; a reader knows nothing of who consumes the topic.

A reader blocks on its own stream while messages come; once a whole block passed without one (and
when it starts), it waits in the broker's idle watcher (:mod:`ddmq.proxy.store.idle_watch`: one
blocking read over every idle queue of the process) and reads again, without blocking, when the
watcher saw an entry past its position. On a Redis Cluster there is no watcher and a reader always
blocks on its own stream.

A reader runs supervised (:func:`~ddmq.proxy.core.supervise.supervised`): Redis failing is its
ordinary business (it retries with backoff, and says so once per streak of failures), and anything
else restarts it from where its tracker stands, so a queue whose lease this proxy renews is read."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from ddmq.actions.pacing import TokenBucket
from ddmq.config.schema import TopicGroupConfig
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.core.supervise import Backoff, supervised
from ddmq.proxy.core.types import QueueId, StoredMessage
from ddmq.proxy.engine.expiry import count_expired
from ddmq.proxy.engine.held_keys import HeldKeys
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.store.broker import Broker, ForeignEntry
from ddmq.proxy.store.read_link import ReadLink

log = logging.getLogger(__name__)

#: How long a reader blocks on its own stream before it waits with the other idle queues.
READ_BLOCK_MS = 1000
#: How often a reader whose lease is not confirmed looks again.
_LEASE_WAIT_S = 0.05


class ReadAuditLog(Protocol):
    def now(self) -> tuple[float, float]: ...

    def record(
        self, group: str, topic: str, qid: int, term: int, first: int, last: int,
        at: tuple[float, float] | None = None,
    ) -> None: ...


class ReadJobs(Protocol):
    """The topic's jobs as its readers see them (:class:`~ddmq.proxy.engine.topic_jobs.TopicJobs`): the
    live settings (a reload changes them in place), the flow control and rate limit, the lease check,
    the counters."""

    @property
    def config(self) -> TopicGroupConfig: ...
    @property
    def unfinished(self) -> int:
        """Jobs read and not finished; readers read while it is under ``config.concurrency``."""
    @property
    def limiter(self) -> TokenBucket | None: ...

    @property
    def held(self) -> HeldKeys:
        """The messages of keys at their cap, left in Redis: a queue holding too many waits."""

    async def wait_for_room(self) -> int: ...
    def may_serve(self, qid: int) -> bool: ...
    def count(self, what: str, n: int = 1) -> None: ...


@dataclass(frozen=True, eq=False)
class TopicReads:
    """What the readers of one group's topic share, built once where the topic's pieces are wired:
    who reads, Redis, the topic's jobs, and where read messages (``accept``), a detected rollback
    (``on_rollback``) and the gap after one (``take_gap``) go."""

    group: str
    topic: str
    broker: Broker
    jobs: ReadJobs
    #: Messages read from a queue, in order (one read's batch per call): the consumer runs their chain.
    accept: Callable[[QueueId, list[StoredMessage]], Awaitable[None]]
    #: The queue rolled back under its reader: its state is dropped (in a task: that stops the reader).
    on_rollback: Callable[[int, OffsetTracker], None]
    #: The sequence raised after the queue's last rollback, once (None: no gap to step over).
    take_gap: Callable[[int], int | None]
    #: Per qid: offsets found trimmed before this group read them (:mod:`ddmq.proxy.engine.expiry`).
    expired: Counter[int] = field(default_factory=Counter)
    read_audit: ReadAuditLog | None = None


class QueueReader:
    """Reads queue ``qid`` of ``reads.topic`` from where ``tracker`` stands, under lease ``term``."""

    # One per queue held, thousands in a proxy: no instance dict.
    __slots__ = (
        "_checked", "_failing", "_first_gap", "_link", "_stopping", "_task", "qid", "queue", "reads", "term",
        "tracker",
    )

    def __init__(self, reads: TopicReads, qid: int, tracker: OffsetTracker, term: int = 0) -> None:
        self.reads = reads
        self.qid = qid
        self.tracker = tracker
        #: The lease term this reader reads under (recorded by the read audit).
        self.term = term
        self.queue = QueueId(reads.topic, qid)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: The connection count when this reader last checked its stream (see ``_stream_intact``).
        self._checked = 0
        #: A rollback's gap taken before the first read (see ``_take_gap``).
        self._first_gap: int | None = None
        #: The connection this reader reads on while its queue is busy; given back while it is idle.
        self._link = ReadLink()
        #: True from a failed read until one succeeds.
        self._failing = False

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("QueueReader already started")
        name = f"reader {self.reads.group}/{self.reads.topic}#{self.qid}"
        self._task = asyncio.create_task(supervised("reader", self._run, name), name=name)

    async def stop(self) -> None:
        if self._task is None:
            return
        # The flag, not only the cancel: some redis-py releases (8.0, 8.1) lose a cancel that hits a
        # command in flight, and a reader that never stops would hang shutdown.
        self._stopping = True
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _stream_intact(self, tracker: OffsetTracker, batch: list[StoredMessage] | None) -> bool:
        """Does Redis still hold the last entry read (of ``batch``, when it has one)? If not, Redis
        rolled back: its state is dropped (``reads.on_rollback``, in a task, as that stops this reader)."""
        reads = self.reads
        self._checked = reads.broker.connections.count
        last = batch[-1] if batch else tracker.last_read
        if await reads.broker.stream_intact(reads.topic, self.qid, tracker.next_offset - 1, last):
            return True
        reads.on_rollback(self.qid, tracker)
        return False

    async def _took(
        self, tracker: OffsetTracker, messages: list[StoredMessage], read_at: tuple[float, float] | None
    ) -> None:
        """A read's batch, about to be accepted: count what is missing before it, note it as read at
        ``read_at`` (the audit's clocks), taken before the lease check: a pause between the two (SIGSTOP,
        a VM stall) fails the check, and one after it cannot date the read after the pause, when another
        proxy may hold a newer term."""
        reads = self.reads
        if messages[0].offset > tracker.next_offset:
            await self._gap(tracker.next_offset, messages[0].offset - 1)
        tracker.last_read = messages[-1]
        audit = reads.read_audit
        if audit is not None:
            audit.record(reads.group, reads.topic, self.qid, self.term, messages[0].offset,
                         messages[-1].offset, read_at)

    async def _gap(self, first: int, last: int) -> None:
        """Offsets ``first..last`` are missing from the stream: trimmed before this group read them,
        unless they are the ones a rollback's raised sequence skipped (they never existed)."""
        reads = self.reads
        if self.tracker.fresh and self.tracker.last_read is None:
            # The group had no offset here: a trim that ran while it started took what it never had.
            log.info("%s/%s#%d: starts at offset %d (%d..%d trimmed as the group started)", reads.group,
                     reads.topic, self.qid, last + 1, first, last)
            return
        skipped = self._take_gap()
        if skipped is not None and skipped >= first:
            if skipped >= last:
                return
            first = skipped + 1
        await count_expired(reads.broker.redis, reads.group, reads.topic, self.qid, first, last,
                            reads.expired)

    def _take_gap(self) -> int | None:
        """The offsets a rollback's raised sequence skipped (they never existed), once."""
        gap, self._first_gap = self._first_gap, None
        return gap if gap is not None else self.reads.take_gap(self.qid)

    async def _wanted(self) -> int:
        """How many messages the next read may ask for: the topic's room and its rate limit."""
        jobs = self.reads.jobs
        if jobs.held.full(self.qid):
            # This queue left the most it may in Redis behind keys at their cap: it waits for them to
            # drain (the topic's other queues read on).
            with self._link_kept_for_a_block():
                await jobs.held.wait_below(self.qid)
        if jobs.unfinished < jobs.config.concurrency:
            room = await jobs.wait_for_room()
        else:
            with self._link_kept_for_a_block():
                room = await jobs.wait_for_room()
        # Looked up per batch, not once: a config reload may change them in place.
        wanted = min(jobs.config.read_batch_size, room)
        limiter = jobs.limiter
        if limiter is not None:
            wanted = await limiter.take(wanted)
        return wanted

    @contextmanager
    def _link_kept_for_a_block(self) -> Iterator[None]:
        """Around a wait for the topic's room: a full topic's readers may wait long (thousands of
        queues with a backlog), so past a whole block they give their connection back, as idle ones do;
        a short wait (room comes back as clients ack) keeps it, rather than take one again to read."""
        drop = self.reads.broker.links.drop
        handle = asyncio.get_running_loop().call_later(READ_BLOCK_MS / 1000, drop, self._link)
        try:
            yield
        finally:
            handle.cancel()

    async def _accept(self, messages: list[StoredMessage]) -> None:
        """Hand a read's batch to ``reads.accept``, which holds what it has no room for until it has."""
        reads = self.reads
        if reads.jobs.unfinished + len(messages) <= reads.jobs.config.concurrency:
            await reads.accept(self.queue, messages)
            return
        with self._link_kept_for_a_block():
            await reads.accept(self.queue, messages)

    async def _read(self, tracker: OffsetTracker, wanted: int, block_ms: int | None) -> list[StoredMessage] | None:
        """One read from where ``tracker`` stands; None when Redis rolled back (the queue is dropped).

        Every command after a Redis restart runs on a new connection: when connections were opened
        since the last check, make sure Redis still holds what this reader read (it may have come back
        without its last writes) before reading on, and after a read during which that happened
        (redis-py retries on a new connection) before taking it."""
        reads = self.reads
        connections = reads.broker.connections
        if connections.count != self._checked and not await self._stream_intact(tracker, None):
            return None
        messages = await reads.broker.read(
            reads.topic, self.qid, tracker.next_offset - 1, wanted, block_ms, self._link
        )
        if connections.count != self._checked and not await self._stream_intact(tracker, messages):
            return None
        return messages

    async def _failed(self, exc: BrokerError, backoff: Backoff) -> None:
        """A read failed (Redis away, a connection lost): check the stream once Redis answers again, and
        say so once per streak of failures (the upkeep's link health says it for the whole proxy)."""
        self._checked = -1
        reads = self.reads
        (log.debug if self._failing else log.warning)("%s/%s#%s: %s; retrying until Redis answers",
                                                      reads.group, reads.topic, self.qid, exc)
        self._failing = True
        await asyncio.sleep(backoff.take())

    def _answered(self, backoff: Backoff) -> None:
        if self._failing:
            self._failing = False
            log.info("%s/%s#%s: reading again", self.reads.group, self.reads.topic, self.qid)
        backoff.reset()

    def _now(self) -> tuple[float, float] | None:
        audit = self.reads.read_audit
        return audit.now() if audit is not None else None

    async def _skip_foreign(self, tracker: OffsetTracker, entry: ForeignEntry) -> None:
        """The queue's next entry was not written by the ddmq producer. An entry with an id ``0-<n>``
        is dead-lettered (its fields kept) and its offset finished, so reading goes on after it. One
        with a time-based id cannot be stepped over in offset order: it is renumbered to the next
        offset first (as a producer would on its next send) and read again. The sequence is raised to
        at least the entry's offset, so producers append after it and committed never passes
        produced. Raises BrokerError when Redis fails (the reader retries)."""
        reads = self.reads
        await reads.broker.repair_queue(reads.topic, self.qid)
        if entry.offset is None:
            reads.jobs.count("foreign_renumbered")
            log.error("%s/%s#%d: %s; renumbered to the next offset, to be dead-lettered when read",
                      reads.group, reads.topic, self.qid, entry)
            return
        log.error("%s/%s#%d: %s; dead-lettering it and reading on", reads.group, reads.topic, self.qid, entry)
        await reads.broker.dead_letter(reads.group, reads.topic, self.qid, entry.as_message(), 0, str(entry))
        reads.jobs.count("foreign_entries")
        tracker.track(entry.offset)
        tracker.finish(entry.offset)

    async def _run(self) -> None:
        reads = self.reads
        broker = reads.broker
        tracker = self.tracker
        self._checked = broker.connections.count
        backoff = Backoff(0.1, 5.0)
        # A new reader starts in the idle watcher (a proxy opening thousands of queues sends no read per
        # queue), unless it has a rollback's gap to step over: that takes a read finding nothing.
        if self._first_gap is None:  # (a restarted reader keeps a gap it has not stepped over yet)
            self._first_gap = reads.take_gap(self.qid)
        idle = broker.idle is not None and self._first_gap is None  # the last read found nothing
        block: int | None = READ_BLOCK_MS
        try:
            while not self._stopping:
                if idle and broker.idle is not None:
                    # Nothing came for a whole block: wait with the other idle queues, then read without
                    # blocking. Awaited here, not in a helper: each frame an idle reader waits in is kept.
                    idle = False
                    broker.links.drop(self._link)  # an idle queue holds no connection of its own
                    try:
                        await broker.wait_for_entries(reads.topic, self.qid, tracker.next_offset - 1)
                        block = None
                    except BrokerError as exc:  # Redis failed meanwhile: check the stream, then block on it
                        block, self._checked = READ_BLOCK_MS, -1
                        log.debug("%s#%s: %s", reads.topic, self.qid, exc)
                wanted = await self._wanted()
                if not reads.jobs.may_serve(self.qid):
                    # Not confirmed lately (paused past its TTL?): nothing under a term that may be gone.
                    await asyncio.sleep(_LEASE_WAIT_S)
                    continue
                try:
                    try:
                        messages = await self._read(tracker, wanted, block)
                    except ForeignEntry as entry:
                        await self._skip_foreign(tracker, entry)
                        continue
                except BrokerError as exc:
                    await self._failed(exc, backoff)
                    continue
                self._answered(backoff)
                block = READ_BLOCK_MS  # blocks on its own stream until a whole block passes without one
                if messages is None or self._stopping:
                    return  # rolled back, or stopping: not tracked, so never committed (read again later)
                if not messages:
                    gap = self._take_gap()
                    if gap is not None:  # nothing past what was read, and producers write past ``gap``
                        tracker.skip_to(gap + 1)  # (raised there after a rollback): the rest never exists
                    idle = True
                    continue
                read_at = self._now()  # before the check (see _took)
                if not reads.jobs.may_serve(self.qid):
                    continue  # answered after the lease went unconfirmed (a pause mid-read): dropped unread
                await self._took(tracker, messages, read_at)
                await self._accept(messages)
        finally:
            broker.links.drop(self._link)
