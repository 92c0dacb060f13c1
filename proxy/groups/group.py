"""The runtime of a consumer group on this proxy: per topic, its chain, key gate, readers, offsets.

A :class:`TopicConsumer` is where one topic's pieces are built and wired, each handed the state it
acts on, the stores it uses and narrow callbacks, as aiokafka's consumer builds its fetcher and its
coordinator around one subscription state:

- :class:`~ddmq.proxy.cluster.queue_state.OwnedQueues` (``owned``): the state of each queue held
  (lease, tracker, reader, hand-off, gap, rollbacks); the one owner of it;
- :class:`~ddmq.proxy.engine.topic_jobs.TopicJobs` (``jobs``): the owner of every job of the topic
  (``job.consumer``): the key gate, the flow control, the live settings, the parked keys, and what
  finishing a job does. It asks ``owned`` whether a lease is confirmed;
- :class:`~ddmq.proxy.cluster.ownership.QueueDrops`: letting a queue go (over ``owned``, the lease store
  and ``jobs.drop_queue``);
- :class:`~ddmq.proxy.cluster.commits.OffsetCommitter` (``commits``): over ``owned``, the lease store
  and the broker; a fenced-off commit drops through ``QueueDrops``. It joins the proxy's
  :class:`~ddmq.proxy.cluster.commits.CommitBoard` when the consumer starts;
- :class:`~ddmq.proxy.engine.chain_run.ChainRun` (``chain_run``): the chain, the chain's context, and
  what runs jobs down it: the readers' ``accept`` and the dispatcher of the key gate's runnable jobs;
- :class:`~ddmq.proxy.engine.reader.TopicReads`: what the topic's readers share (``jobs`` for room and
  the lease check, ``chain_run.accept`` for what they read, ``commits.on_rollback``, ``owned.take_gap``);
- :class:`~ddmq.proxy.cluster.ownership.QueueOwnership` (``ownership``): claims, hand-offs and drops on
  the upkeep's rounds, opening a queue with ``commits.load`` and ``jobs.load_keys``.

What stays here is the lifecycle (start, retire, close, reconfigure) and the views ops and the API
read. Nothing on a message's way passes through: a read goes reader → chain → buffer in the engine,
and an ack goes from the buffer to the offsets there too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from ddmq.actions import Action, close_chain, start_chain
from ddmq.actions.pacing import TokenBucket
from ddmq.actions.pull_server import PullServerAction
from ddmq.config.schema import TopicGroupConfig
from ddmq.proxy.cluster.commits import OffsetCommitter
from ddmq.proxy.cluster.leases import Lease
from ddmq.proxy.cluster.ownership import QueueDrops, QueueOwnership
from ddmq.proxy.cluster.queue_state import OwnedQueues
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.chain_run import ChainRun
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.reader import TopicReads
from ddmq.proxy.engine.topic_jobs import TopicJobs
from ddmq.proxy.groups.breaker import GroupBreakers
from ddmq.proxy.groups.key_actions import command_handler
from ddmq.proxy.groups.parts import ProxyParts
from ddmq.proxy.groups.pausing import PauseWatch
from ddmq.proxy.store.key_commands import ParkStore

log = logging.getLogger(__name__)



class TopicConsumer:
    """One group consuming one topic: builds the topic's pieces and wires them (see the module's
    docstring), runs the chain of what its readers read, and starts, retires and reconfigures them."""

    def __init__(
        self, group: str, topic: str, config: TopicGroupConfig, buffer: PullBuffer, parts: ProxyParts
    ) -> None:
        self.group = group
        self.topic = topic
        self.buffer = buffer
        self.redelivery = buffer.redelivery
        self.broker = parts.broker
        self.leases = parts.leases
        self.upkeep = parts.upkeep
        self._parts = parts
        #: One state per queue (lease, offsets, reader, hand-off, rollbacks): ownership, commits, the lease check.
        self.owned = OwnedQueues(parts.membership.clock)
        #: The owner of every job of the topic: key gate, flow control, live settings, parked keys.
        self.jobs = TopicJobs(group, topic, config, parts.broker, buffer, ParkStore(parts.broker.redis, group, topic),
                              self.owned.confirmed)
        self.blocking_queue = self.jobs.blocking_queue
        self.parking = self.jobs.parking
        self.counters = self.jobs.counters
        #: The chain and what runs jobs down it: the readers' ``accept``, the key gate's dispatcher.
        self.chain_run = ChainRun(self.jobs, buffer, config.actions, self.owned.tracker)
        self.chain: list[Action] = self.chain_run.chain
        #: Per qid: offsets found trimmed before this group read them (:mod:`ddmq.proxy.engine.expiry`).
        self.expired: Counter[int] = Counter()
        self._wire(config, parts)
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    def _wire(self, config: TopicGroupConfig, parts: ProxyParts) -> None:
        """The queues' side: drops, commits, the readers' shared part and ownership, each handed what it uses."""
        group, topic, owned, jobs = self.group, self.topic, self.owned, self.jobs
        drops = QueueDrops(group, topic, owned, parts.leases, jobs.drop_queue)
        self.commits = OffsetCommitter(
            group, topic, owned, broker=parts.broker, leases=parts.leases, settings=parts.lease_config,
            instance_id=parts.membership.instance_id, start_from=config.start_from, drop_queue=drops.drop,
        )
        reads = TopicReads(group, topic, parts.broker, jobs, self.chain_run.accept, self.commits.on_rollback,
                           owned.take_gap, self.expired, parts.read_audit)
        self.ownership = QueueOwnership(
            group, topic, owned, broker=parts.broker, leases=parts.leases, membership=parts.membership,
            upkeep=parts.upkeep, settings=parts.lease_config, commits=self.commits, drops=drops, reads=reads,
            load_keys=jobs.load_keys, in_flight=jobs.in_flight,
            in_flight_of=self._unsettled,
        )

    def _unsettled(self, qid: int) -> int:
        """What a queue being let go waits for. Pulled: the jobs clients hold (what was read and not
        handed out is read again by the next owner). Pushed: every job read, as a push sink does not
        ask for the lease before it pushes (its pushes go on until done)."""
        if self.chain and isinstance(self.chain[-1], PullServerAction):
            slot = self.buffer.slot(QueueId(self.topic, qid))
            return slot.in_flight() if slot is not None else 0
        tracker = self.owned.tracker(qid)
        return tracker.unfinished if tracker is not None else 0

    def count(self, what: str, n: int = 1) -> None:
        self.jobs.counters[what] += n

    @property
    def action_timers(self) -> list[Callable[[float], None]] | None:
        """One duration observer per action of the chain (set by ProxyMetrics.instrument), or None."""
        return self.chain_run.action_timers

    @action_timers.setter
    def action_timers(self, timers: list[Callable[[float], None]] | None) -> None:
        self.chain_run.action_timers = timers

    @property
    def config(self) -> TopicGroupConfig:
        """The topic's settings in force (a reload changes them in place: :meth:`reconfigure`)."""
        return self.jobs.config

    @property
    def unfinished(self) -> int:
        """Jobs read and not finished."""
        return self.jobs.unfinished

    @property
    def limiter(self) -> TokenBucket | None:
        return self.jobs.limiter

    @property
    def queues(self) -> int:
        """The topic's number of queues, once its metadata is known (0 until then)."""
        return self.ownership.queues

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

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError(f"consumer {self.group}/{self.topic} already started")
        self._started = True
        start_chain(self.chain)
        self._parts.committers.join(self.commits)
        self._tasks.append(asyncio.create_task(self.ownership.run(), name=f"open:{self.group}/{self.topic}"))
        self._tasks.append(asyncio.create_task(self.chain_run.dispatch(), name=f"dispatch:{self.group}/{self.topic}"))
        self._tasks.append(asyncio.create_task(self._parts.key_watcher.serve(self.group, self.topic,
                                                                             command_handler(self)),
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
        self.jobs.serving = False
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
        self.jobs.reconfigure(config)
        self.commits.start_from = config.start_from


class ConsumerGroup:
    """A group's consumers (one per topic) sharing one PullBuffer."""

    def __init__(self, name: str, topics: dict[str, TopicGroupConfig], parts: ProxyParts) -> None:
        self.name = name
        self.buffer = PullBuffer(name)
        # End-to-end latency on Redis's clock: the proxy host's skew drops out of it.
        self.buffer.use_wall_clock(parts.membership.clock.redis_now_ms)
        self.broker = parts.broker
        self._parts = parts
        self._lease_config = parts.lease_config
        #: The topics' breakers on this proxy (``breaker`` in their config).
        self.breakers = GroupBreakers(name, self.buffer, parts.membership.instance_id)
        self.consumers = {topic: self.make_consumer(topic, config) for topic, config in topics.items()}
        #: Consumers of topics removed by a config reload, until their drain is over (acks still count).
        self.retiring: dict[str, TopicConsumer] = {}
        #: Set when the group left the config: pulls get "unknown group", acks still count.
        self.removed = False
        #: An operator's pause of the group or some topics, followed from Redis.
        self.pause_watch = PauseWatch(name, self.buffer, parts.broker, parts.lease_config.claim_interval_ms,
                                      self.breakers)

    def make_consumer(self, topic: str, config: TopicGroupConfig) -> TopicConsumer:
        """A consumer of ``topic`` for this group, not started (its breaker, if any, starts closed)."""
        self.breakers.configure(topic, config.breaker)
        return TopicConsumer(self.name, topic, config, self.buffer, self._parts)

    def start(self) -> None:
        self.buffer.start()
        self.pause_watch.start()
        for consumer in self.consumers.values():
            consumer.start()

    def commits_of(self, topic: str, draining: bool = False) -> OffsetCommitter | None:
        """The committer of ``topic`` (with ``draining``, also while a reload drains it), if consumed."""
        consumer = self.consumers.get(topic)
        if consumer is None and draining:
            consumer = self.retiring.get(topic)
        return consumer.commits if consumer is not None else None

    # live configuration (see ddmq.proxy.groups.registry) ----------------------------------------------

    def add_topic(self, consumer: TopicConsumer) -> None:
        if consumer.topic in self.consumers:
            raise RuntimeError(f"group {self.name} already consumes {consumer.topic}")
        self.consumers[consumer.topic] = consumer
        consumer.start()

    async def remove_topic(self, topic: str) -> None:
        """Stop consuming ``topic``: pulls for it fail at once (unknown topic), acks count while it drains."""
        consumer = self.retiring[topic] = self.consumers.pop(topic)
        self.breakers.remove(topic)
        self._parts.committers.leave(consumer.commits)  # it commits for itself as it retires
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
            self._parts.committers.leave(old.commits)
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
            await self._parts.membership.leave(self.name)
        except DdmqError as exc:
            log.warning("%s: leaving the member set failed: %s", self.name, exc)
        await self.close()
        for consumer in self.consumers.values():
            self._parts.committers.leave(consumer.commits)

    async def stop_reading(self) -> None:
        await asyncio.gather(*(c.stop_reading() for c in self.consumers.values()))
        self.buffer.stop_serving()

    async def close(self) -> None:
        await self.pause_watch.close()
        await asyncio.gather(*(c.close() for c in self.consumers.values()))
        await self.buffer.close()

    async def flush_offsets(self) -> None:
        # Only consumers with something to write: an idle group costs no task per consumer and interval.
        await asyncio.gather(*(c.commits.flush() for c in self.consumers.values() if c.commits.moved()))

    async def hand_off_all(self, drain_ms: int) -> None:
        """Stopping: leave the member set and hand every queue over (see QueueOwnership.hand_off_all)."""
        await asyncio.gather(*(c.ownership.hand_off_all(drain_ms) for c in self.consumers.values()))

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
