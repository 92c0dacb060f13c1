"""TopicJobs: the jobs of one group's topic on this proxy, and what finishing one does.

Every :class:`~ddmq.proxy.engine.job.UpstreamJob` points to its topic's ``TopicJobs`` (``job.consumer``,
a :class:`~ddmq.proxy.engine.job.JobOwner`): the pull buffer, redelivery and push actions ask it whether
a queue may be served and whether a job heads its key, and tell it when a job is done. Finishing a job
(:meth:`TopicJobs.finish`) releases its key's successor in the key gate
(:class:`~ddmq.proxy.engine.ordering.UpstreamJobBlockingQueue`, to the reactivation queue), marks its
offset finished in its queue's :class:`~ddmq.proxy.engine.offsets.OffsetTracker` and, when a reader
waits for room, lets it read again: all of it in the engine, so an ack goes from the buffer down to
the offsets and no further.

It holds what the topic's readers and its chain share as they go: the live settings (``config``; a
reload changes them through :meth:`reconfigure`), the flow control (jobs read and not finished,
``concurrency`` at most; readers wait in :meth:`wait_for_room`), the readers' rate limit, the
consumer's counters and its parked keys (:class:`~ddmq.proxy.engine.parking.KeyParking`). Whether a
queue's lease still counts is not known here: the check is handed in (``confirmed``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

from ddmq.actions.pacing import TokenBucket
from ddmq.config.schema import ORDER_KEY_QID, TopicGroupConfig
from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.held_keys import HELD_PER_QUEUE, HeldKeys
from ddmq.proxy.engine.job import UpstreamJob
from ddmq.proxy.engine.ordering import UpstreamJobBlockingQueue
from ddmq.proxy.engine.parking import KeyParking
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.tenants import RESERVE, TenantShares
from ddmq.proxy.store.broker import Broker
from ddmq.proxy.store.key_commands import ParkStore

__all__ = ["TopicJobs"]


class TopicJobs:
    """The jobs of ``group``'s ``topic`` read here (see the module's docstring). ``confirmed(qid)``
    says whether this proxy's lease on queue ``qid`` is surely valid."""

    def __init__(
        self,
        group: str,
        topic: str,
        config: TopicGroupConfig,
        broker: Broker,
        buffer: PullBuffer,
        parked: ParkStore,
        confirmed: Callable[[int], bool],
    ) -> None:
        self.group = group
        self.topic = topic
        self.config = config
        self._broker = broker
        self._buffer = buffer
        #: Bound once: asked before every delivery.
        self._confirmed = confirmed
        #: Messages of keys at their cap, left in Redis by offset (docs/design/engine.md, "Held keys").
        self.held = HeldKeys(self._set_aside, _held_per_queue(config))
        #: Each tenant's share of ``concurrency`` (``fair_key``; docs/design/engine.md, "Tenants"), or None.
        self.tenants = (
            TenantShares(lambda: self.config.concurrency, config.fair_weights, self.held.want)
            if config.fair_key is not None else None
        )
        self.held.tenants = self.tenants
        self.blocking_queue = UpstreamJobBlockingQueue(self.held, config.key_buffer, self.tenants)
        self.counters: Counter[str] = Counter()
        self.limiter = TokenBucket(config.max_tps) if config.max_tps else None
        #: Only these tags are read into the chain (empty: all).
        self.tags = frozenset(config.tags)
        #: A pull chain ends with PullServer: a job at its last action has nothing left but the buffer.
        self._last_action = len(config.actions) - 1
        #: Parked and sequenced keys (on_exhausted, key actions). ``key_records`` is its dict, an
        #: attribute the pull buffer reads for every job it gets.
        self.parking = KeyParking(buffer, parked, self.blocking_queue, pull_chain=config.actions[-1] == "PullServer")
        self.key_records = self.parking.records
        self.unfinished = 0
        self._room = asyncio.Event()
        self._room.set()
        #: True while a reader waits for room: finish() reads a plain attribute, not Event.is_set().
        self._short_of_room = False
        self._refill = _refill(config)
        #: False once the consumer is retiring (its topic left the config): nothing more is handed out.
        self.serving = True

    @property
    def broker(self) -> Broker:
        return self._broker

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] += n

    def reconfigure(self, config: TopicGroupConfig) -> None:
        """Apply settings read as the engine goes (``ddmq.proxy.groups.changes.IN_PLACE_FIELDS``)."""
        old, self.config = self.config, config
        if config.max_tps != old.max_tps:
            self.limiter = TokenBucket(config.max_tps) if config.max_tps else None
        self.tags = frozenset(config.tags)
        self._refill = _refill(config)
        self.blocking_queue.key_cap = config.key_buffer
        self.held.per_queue_limit = _held_per_queue(config)
        if self.unfinished < config.concurrency:
            self._short_of_room = False
            self._room.set()

    # the job's owner (JobOwner) ---------------------------------------------------------------

    def may_serve(self, qid: int) -> bool:
        """True while this proxy's lease on ``qid`` is surely valid (checked before every delivery)."""
        return self.serving and self._confirmed(qid)

    def is_head(self, job: UpstreamJob) -> bool:
        return self.blocking_queue.is_head(job)

    def pull_only(self, job: UpstreamJob) -> bool:
        return job.index == self._last_action

    async def dead_letter(self, job: UpstreamJob) -> None:
        await self._broker.dead_letter(self.group, self.topic, job.qid, job.message, job.attempts, job.last_error)

    def finish(self, job: UpstreamJob) -> None:
        """``job`` is done (acked, filtered, dead-lettered): release its key, mark its offset."""
        self.blocking_queue.release(job)
        job.tracker.finish(job.offset)
        self.unfinished -= 1
        if self._short_of_room and self.unfinished <= self.config.concurrency - self._refill:
            self._short_of_room = False
            self._room.set()

    def _set_aside(self, job: UpstreamJob) -> None:
        """``job`` is held (left in Redis, its offset unfinished): it stops counting against ``concurrency``."""
        self.unfinished -= 1
        if self._short_of_room and self.unfinished <= self.config.concurrency - self._refill:
            self._short_of_room = False
            self._room.set()

    # flow control (the readers') ----------------------------------------------------------------

    async def wait_for_room(self) -> int:
        """Wait until fewer than ``concurrency`` jobs are unfinished; returns the room left."""
        while True:
            room = self.config.concurrency - self.unfinished
            if room > 0:
                return room
            self._short_of_room = True
            self._room.clear()
            await self._room.wait()

    # a queue's jobs (ownership's) ---------------------------------------------------------------

    async def load_keys(self, qid: int) -> None:
        """The queue was just claimed: take over its parked keys before it is read (raises DdmqError)."""
        await self.parking.load(qid)

    def drop_queue(self, qid: int) -> None:
        """The queue moved away: forget its parked keys and its jobs in the buffer, each finished as
        dropped (its offsets stay uncommitted: the queue's next owner delivers them again)."""
        self.parking.forget(qid)
        self.held.forget(qid)
        for job in self._buffer.drop_queue(QueueId(self.topic, qid)):
            self.finish(job)

    def in_flight(self) -> int:
        """Jobs of the topic handed to clients and not acked or failed yet."""
        return self._buffer.in_flight_of(self.topic)


def _refill(config: TopicGroupConfig) -> int:
    """How far under ``concurrency`` the unfinished jobs fall before a reader waiting for room reads
    again (a read's worth, so it does not read one message at a time). With tenants no more than the
    window's reserve: held tenants read again keep the window at their shares, 7/8 of it, and a reader
    waiting for more room than that would never read on to the next tenant."""
    refill = min(config.read_batch_size, config.concurrency // 4)
    if config.fair_key is not None:
        refill = min(refill, int(config.concurrency * RESERVE))
    return max(1, refill)


def _held_per_queue(config: TopicGroupConfig) -> int:
    """Most offsets a queue leaves in Redis behind keys at their cap. Ordered by queue (``QID``), a
    queue is one key: holding its whole backlog would only read it twice, so its reader waits after a
    read's worth."""
    return config.read_batch_size if config.order_key == ORDER_KEY_QID else HELD_PER_QUEUE
