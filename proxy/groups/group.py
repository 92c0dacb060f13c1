"""The runtime of a consumer group on this proxy: per topic, its chain, key gate, readers, offsets.

A :class:`TopicConsumer` runs the chain and the key gate and keeps the flow control; which queues it
reads is :mod:`ddmq.proxy.cluster.ownership`'s business, how their offsets are committed
:mod:`ddmq.proxy.cluster.commits`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from time import perf_counter
from typing import Final

from ddmq.actions import Action, Status, build_chain, close_chain, start_chain
from ddmq.config.schema import LeaseConfig, TopicGroupConfig
from ddmq.proxy.cluster.audit import ReadAudit
from ddmq.proxy.cluster.commits import OffsetCommitter
from ddmq.proxy.cluster.leases import Lease, LeaseStore
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.cluster.ownership import QueueOwnership
from ddmq.proxy.cluster.queue_state import OwnedQueues
from ddmq.proxy.cluster.upkeep import Upkeep
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.types import QueueId, StoredMessage
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.engine.ordering import UpstreamJobBlockingQueue
from ddmq.proxy.engine.parking import KeyParking
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.reader import TokenBucket
from ddmq.proxy.groups.key_actions import command_handler
from ddmq.proxy.store.broker import Broker, ForeignEntry
from ddmq.proxy.store.key_commands import KeyCommandWatcher, ParkStore

log = logging.getLogger(__name__)

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_CONTINUE: Final = Status.CONTINUE
_ASYNC: Final = Status.ASYNC


class TopicConsumer:
    """One group consuming one topic: the chain runs here, and finished jobs come back here."""

    def __init__(
        self,
        group: str,
        topic: str,
        config: TopicGroupConfig,
        broker: Broker,
        buffer: PullBuffer,
        leases: LeaseStore,
        lease_config: LeaseConfig,
        membership: Membership,
        upkeep: Upkeep | None = None,
        key_watcher: KeyCommandWatcher | None = None,
    ) -> None:
        self.group = group
        self.topic = topic
        self.config = config
        self.broker = broker
        self.buffer = buffer
        self.redelivery = buffer.redelivery
        self.leases = leases
        self.lease_config = lease_config
        self.membership = membership
        #: The proxy's heartbeats and renewals, and its key-command watcher (own ones outside a service).
        self.upkeep = upkeep or Upkeep(leases, membership, lease_config)
        self.key_watcher = key_watcher or KeyCommandWatcher(broker.redis)
        self.blocking_queue = UpstreamJobBlockingQueue()
        self.counters: Counter[str] = Counter()
        self.limiter = TokenBucket(config.max_tps) if config.max_tps else None
        self.chain: list[Action] = build_chain(config.actions, self)
        #: The chain's ``act`` methods, bound once (compiled, a lookup and a binding per job otherwise).
        self._acts: list[Callable[[UpstreamJob], Status]] = [action.act for action in self.chain]
        self._last_action = len(self.chain) - 1  # a pull chain ends with PullServer: nothing left after it
        #: One duration observer per action of the chain (set by ProxyMetrics.instrument), or None.
        self.action_timers: list[Callable[[float], None]] | None = None
        #: The topic's number of queues, once its metadata is known (0 until then).
        self.queues = 0
        #: One state per queue (lease, offsets, reader, hand-off, rollbacks): ownership, commits, readers.
        self.owned = OwnedQueues(membership.clock)
        self.unfinished = 0
        self._tags = frozenset(config.tags)
        self._room = asyncio.Event()
        self._room.set()
        #: True while a reader waits for room: finish() reads a plain attribute, not Event.is_set().
        self._short_of_room = False
        self._refill = max(1, min(config.read_batch_size, config.concurrency // 4))
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        #: False once the consumer is retiring (its topic left the config): nothing more is handed out.
        self.serving = True
        #: Set by the service when ``audit_log`` is configured.
        self.read_audit: ReadAudit | None = None
        #: Per qid: offsets found trimmed before this group read them (:mod:`ddmq.proxy.engine.expiry`).
        self.expired: Counter[int] = Counter()
        self.ownership = QueueOwnership(self)
        self.commits = OffsetCommitter(self)
        #: Parked and sequenced keys (on_exhausted, key actions; engine/parking.py). ``key_records`` is its
        #: dict, an attribute the pull buffer reads for every job it gets.
        self.parking = KeyParking(buffer, ParkStore(broker.redis, group, topic), self.blocking_queue,
                                  pull_chain=config.actions[-1] == "PullServer")
        self.key_records = self.parking.records

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] += n

    @property
    def held(self) -> dict[int, Lease]:
        """The leases this proxy holds on the topic's queues, by qid."""
        return self.owned.held()

    @property
    def trackers(self) -> dict[int, OffsetTracker]:
        """The offsets of each queue read now, by qid (see ddmq.proxy.cluster.commits)."""
        return self.owned.trackers()

    @property
    def rollbacks(self) -> Counter[int]:
        """Rollbacks of Redis detected per qid (see OffsetCommitter.rolled_back)."""
        return self.owned.rollbacks()

    @property
    def assigned(self) -> range:
        """The queues this proxy should own, from the last heartbeat."""
        return self.ownership.assigned

    # the job's owner (JobOwner) ---------------------------------------------------------------

    def may_serve(self, qid: int) -> bool:
        """True while this proxy's lease on ``qid`` is surely valid (checked before every delivery)."""
        return self.serving and self.owned.confirmed(qid)

    def is_head(self, job: UpstreamJob) -> bool:
        return self.blocking_queue.is_head(job)

    def pull_only(self, job: UpstreamJob) -> bool:
        return job.index == self._last_action

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError(f"consumer {self.group}/{self.topic} already started")
        self._started = True
        start_chain(self.chain)
        self._tasks.append(asyncio.create_task(self.ownership.run(), name=f"open:{self.group}/{self.topic}"))
        self._tasks.append(asyncio.create_task(self._dispatch(), name=f"dispatch:{self.group}/{self.topic}"))
        self._tasks.append(asyncio.create_task(self.key_watcher.serve(self.group, self.topic, command_handler(self)),
                                               name=f"keys:{self.group}/{self.topic}"))
        for task in self._tasks:
            task.add_done_callback(_report_crash)

    async def stop_reading(self) -> None:
        if self._tasks:  # first ownership (it leaves the upkeep), so that no claim opens a reader behind our back
            self._tasks[0].cancel()
            await asyncio.gather(self._tasks[0], return_exceptions=True)
            await self.upkeep.settled()  # a renewal in flight must not outlive a release that follows
        await asyncio.gather(*(reader.stop() for reader in self.owned.readers()))

    async def close(self) -> None:
        await self.stop_reading()
        pending = (*self.owned.handoffs(), *self.commits.recoveries)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.parking.close()
        await close_chain(self.chain)

    async def retire(self, drain_ms: int) -> None:
        """Stop for good (the topic left this group's config, or a new consumer replaces this one).

        Stop reading and handing out; give clients up to ``drain_ms`` to ack or fail what they hold;
        commit; release the leases. Jobs read but not finished stay uncommitted, so whoever reads the
        queue next delivers them again, each key in order. Membership is the group's business.
        """
        self.serving = False
        await self.stop_reading()
        left = await self.ownership.give_up(drain_ms)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await close_chain(self.chain)  # push workers and their connection pools
        log.info("%s/%s: stopped; offsets committed, leases released, %d unfinished jobs left to deliver again",
                 self.group, self.topic, left)

    def reconfigure(self, config: TopicGroupConfig) -> None:
        """Apply settings the engine reads as it goes (see ``ddmq.proxy.groups.changes.IN_PLACE_FIELDS``)."""
        old, self.config = self.config, config
        if config.max_tps != old.max_tps:
            self.limiter = TokenBucket(config.max_tps) if config.max_tps else None
        self._tags = frozenset(config.tags)
        self._refill = max(1, min(config.read_batch_size, config.concurrency // 4))
        if self.unfinished < config.concurrency:
            self._short_of_room = False
            self._room.set()

    # reading (the readers' ReaderHost) ------------------------------------------------------------

    def on_rollback(self, qid: int, tracker: OffsetTracker) -> None:
        self.commits.on_rollback(qid, tracker)

    def take_gap(self, qid: int) -> int | None:
        return self.owned.take_gap(qid)

    def tracker(self, qid: int) -> OffsetTracker | None:
        """The offsets of ``qid`` while this proxy reads it, else None."""
        return self.owned.tracker(qid)

    async def commit(self, qid: int) -> None:
        """Write ``qid``'s commit point now if it moved (see OffsetCommitter.commit)."""
        await self.commits.commit(qid)

    async def wait_for_room(self) -> int:
        """Wait until fewer than ``concurrency`` jobs are unfinished; returns the room left."""
        while True:
            room = self.config.concurrency - self.unfinished
            if room > 0:
                return room
            self._short_of_room = True
            self._room.clear()
            await self._room.wait()

    async def accept(self, queue: QueueId, messages: list[StoredMessage]) -> None:
        """Messages read from ``queue``, in order (one read's batch: one call, not one per message)."""
        tracker = self.owned.tracker(queue.qid)
        if tracker is None:
            return  # dropped meanwhile: untracked, so the queue's next reader reads them again
        # tracker.track and self.run without local aliases: compiled, an alias is a call through Python
        tags = self._tags
        counters = self.counters
        concurrency = self.config.concurrency
        read = 0
        try:
            for message in messages:
                if self.unfinished >= concurrency:
                    # Several readers size their reads before the others' land: hold the rest of this
                    # batch (untracked, so a stop here loses nothing) until there is room again.
                    await self.wait_for_room()
                    concurrency = self.config.concurrency  # a reload may have changed it meanwhile
                if tracker.track(message.offset):
                    counters["skipped_finished"] += 1  # a previous owner finished it
                    continue
                if tags and message.tag not in tags:
                    tracker.finish(message.offset)
                    counters["filtered"] += 1
                    continue
                self.unfinished += 1
                read += 1
                self.run(UpstreamJob(self, queue, message, tracker))
        finally:
            counters["read"] += read
            self.buffer.answer_parked()

    async def skip_foreign(self, qid: int, tracker: OffsetTracker, entry: ForeignEntry) -> None:
        """The queue's next entry was not written by the ddmq producer. An entry with an id ``0-<n>``
        is dead-lettered (its fields kept) and its offset finished, so reading goes on after it. One
        with a time-based id cannot be stepped over in offset order: it is renumbered to the next
        offset first (as a producer would on its next send) and read again. The sequence is raised to
        at least the entry's offset, so producers append after it and committed never passes
        produced. Raises BrokerError when Redis fails (the reader retries)."""
        await self.broker.repair_queue(self.topic, qid)
        if entry.offset is None:
            self.count("foreign_renumbered")
            log.error("%s/%s#%d: %s; renumbered to the next offset, to be dead-lettered when read",
                      self.group, self.topic, qid, entry)
            return
        log.error("%s/%s#%d: %s; dead-lettering it and reading on", self.group, self.topic, qid, entry)
        await self.broker.dead_letter(self.group, self.topic, qid, entry.as_message(), 0, str(entry))
        self.count("foreign_entries")
        tracker.track(entry.offset)
        tracker.finish(entry.offset)

    # the chain ---------------------------------------------------------------------------------

    def run(self, job: UpstreamJob) -> None:
        """Run ``job`` from its current position in the chain until an action takes it over."""
        acts = self._acts
        timers = self.action_timers
        while job.index < len(acts):
            index = job.index
            job.index = index + 1
            started = perf_counter() if timers is not None else 0.0
            try:
                status = acts[index](job)
            except Exception as exc:
                name = type(self.chain[index]).__name__
                log.exception("action %s failed on %r", name, job)
                job.last_error = f"{name} raised {exc!r}"
                status = Status.FAIL
            if timers is not None:
                timers[index](perf_counter() - started)
            if status is _CONTINUE:
                continue
            if status is _ASYNC:
                return
            if status is Status.FAIL:
                self.redelivery.dead_letter(job, job.last_error or "action failed")
                return
            break
        job.state = JobState.FINISHED
        self.finish(job)

    async def _dispatch(self) -> None:
        """Continue the chain of jobs the key gate made runnable (reactivated first)."""
        queue = self.blocking_queue
        while True:
            await queue.wait()
            while (job := queue.pop()) is not None:
                if job.tracker.dropped:  # its queue moved away: let its key's successor go on
                    job.state = JobState.FINISHED
                    self.finish(job)
                    continue
                self.run(job)

    # finishing ---------------------------------------------------------------------------------

    def finish(self, job: UpstreamJob) -> None:
        """``job`` is done (acked, filtered, dead-lettered): release its key, mark its offset."""
        self.blocking_queue.release(job)
        job.tracker.finish(job.offset)
        self.unfinished -= 1
        if self._short_of_room and self.unfinished <= self.config.concurrency - self._refill:
            self._short_of_room = False
            self._room.set()

    async def dead_letter(self, job: UpstreamJob) -> None:
        await self.broker.dead_letter(self.group, self.topic, job.qid, job.message, job.attempts, job.last_error)


class ConsumerGroup:
    """A group's consumers (one per topic) sharing one PullBuffer."""

    def __init__(
        self,
        name: str,
        topics: dict[str, TopicGroupConfig],
        broker: Broker,
        leases: LeaseStore,
        lease_config: LeaseConfig,
        membership: Membership,
        upkeep: Upkeep | None = None,
        key_watcher: KeyCommandWatcher | None = None,
    ) -> None:
        self.name = name
        self.buffer = PullBuffer(name)
        self.broker = broker
        self._leases = leases
        self._lease_config = lease_config
        self._membership = membership
        self._upkeep = upkeep or Upkeep(leases, membership, lease_config)
        self._key_watcher = key_watcher or KeyCommandWatcher(broker.redis)
        #: Given to consumers added later by a config reload (the service sets it with ``audit_log``).
        self.read_audit: ReadAudit | None = None
        self.consumers = {topic: self.make_consumer(topic, config) for topic, config in topics.items()}
        #: Consumers of topics removed by a config reload, until their drain is over (acks still count).
        self.retiring: dict[str, TopicConsumer] = {}
        #: Set when the group left the config: pulls get "unknown group", acks still count.
        self.removed = False

    def make_consumer(self, topic: str, config: TopicGroupConfig) -> TopicConsumer:
        """A consumer of ``topic`` for this group, not started."""
        consumer = TopicConsumer(self.name, topic, config, self.broker, self.buffer, self._leases,
                                 self._lease_config, self._membership, self._upkeep, self._key_watcher)
        consumer.read_audit = self.read_audit
        return consumer

    def start(self) -> None:
        self.buffer.start()
        for consumer in self.consumers.values():
            consumer.start()

    # live configuration (see ddmq.proxy.groups.registry) ----------------------------------------------

    def add_topic(self, consumer: TopicConsumer) -> None:
        if consumer.topic in self.consumers:
            raise RuntimeError(f"group {self.name} already consumes {consumer.topic}")
        self.consumers[consumer.topic] = consumer
        consumer.start()

    async def remove_topic(self, topic: str) -> None:
        """Stop consuming ``topic``: pulls for it fail at once (unknown topic), acks count while it drains."""
        consumer = self.retiring[topic] = self.consumers.pop(topic)
        try:
            await consumer.retire(self._lease_config.handoff_drain_ms)
        finally:
            del self.retiring[topic]

    async def replace_topic(self, consumer: TopicConsumer) -> None:
        """Swap in a consumer with new settings: the old one drains and commits first, so the new one
        resumes from its commit point. Pulls for the topic stay valid meanwhile (they wait)."""
        old = self.consumers[consumer.topic]
        try:
            await old.retire(self._lease_config.handoff_drain_ms)
        finally:
            self.consumers[consumer.topic] = consumer
            consumer.start()

    async def retire(self) -> None:
        """The group left the config: answer parked pulls, drain every topic, leave the member set."""
        self.removed = True
        self.buffer.stop_serving()
        drains = (c.retire(self._lease_config.handoff_drain_ms) for c in self.consumers.values())
        for outcome in await asyncio.gather(*drains, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.error("%s: stopping a consumer failed", self.name, exc_info=outcome)
        try:
            await self._membership.leave(self.name)
        except DdmqError as exc:
            log.warning("%s: leaving the member set failed: %s", self.name, exc)
        await self.close()

    async def stop_reading(self) -> None:
        await asyncio.gather(*(c.stop_reading() for c in self.consumers.values()))
        self.buffer.stop_serving()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.consumers.values()))
        await self.buffer.close()

    async def flush_offsets(self) -> None:
        # Only consumers with something to write: an idle group costs no task per consumer and interval.
        await asyncio.gather(*(c.commits.flush() for c in self.consumers.values() if c.commits.moved()))

    async def release_leases(self) -> None:
        await asyncio.gather(*(c.ownership.release_all() for c in self.consumers.values()))

    @property
    def unfinished(self) -> int:
        return sum(c.unfinished for c in self.consumers.values())


def _report_crash(task: asyncio.Task[None]) -> None:
    """These loops run for the consumer's whole life: one that ends by an error leaves its queues
    unread while the process looks healthy, so it is logged loudly."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("%s stopped on an unexpected error; restart the proxy", task.get_name(),
                     exc_info=task.exception())
