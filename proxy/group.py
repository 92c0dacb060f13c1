"""The runtime of a consumer group on this proxy: per topic, its chain, key gate, readers, offsets."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from time import perf_counter

from ddmq.actions import Action, Status, build_chain, close_chain, start_chain
from ddmq.config.schema import LeaseConfig, ProxyConfig, StartFrom, TopicGroupConfig
from ddmq.proxy.audit import ReadAudit
from ddmq.proxy.broker import Broker, ForeignEntry, read_mark
from ddmq.proxy.errors import DdmqError
from ddmq.proxy.job import JobState, UpstreamJob
from ddmq.proxy.leases import CommitResult, Lease, LeaseStore
from ddmq.proxy.membership import Membership, assign
from ddmq.proxy.offsets import OffsetTracker, decode_ranges
from ddmq.proxy.ordering import UpstreamJobBlockingQueue
from ddmq.proxy.pull_buffer import PullBuffer
from ddmq.proxy.reader import QueueReader, TokenBucket
from ddmq.proxy.types import QueueId, StoredMessage

log = logging.getLogger(__name__)

_METADATA_POLL_S = 1.0

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
_CONTINUE = Status.CONTINUE
_ASYNC = Status.ASYNC


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
    ) -> None:
        self.group = group
        self.topic = topic
        self.config = config
        self.broker = broker
        self.buffer = buffer
        self.leases = leases
        self.lease_config = lease_config
        self.membership = membership
        #: The queues this proxy should own, from the last heartbeat (none until the first one).
        self.assigned: range = range(0)
        self._handoffs: dict[int, asyncio.Task[None]] = {}
        #: Leases this proxy holds, by qid, and when each was last confirmed (loop time before the call).
        self.held: dict[int, Lease] = {}
        self._confirmed_at: dict[int, float] = {}
        self._lease_s = lease_config.ttl_ms / 1000
        self.blocking_queue = UpstreamJobBlockingQueue()
        self.counters: Counter[str] = Counter()
        self.limiter = TokenBucket(config.max_tps) if config.max_tps else None
        self.chain: list[Action] = build_chain(config.actions, self)
        #: One duration observer per action of the chain (set by ProxyMetrics.instrument), or None.
        self.action_timers: list[Callable[[float], None]] | None = None
        self.queues = 0
        self.trackers: dict[int, OffsetTracker] = {}
        self.readers: dict[int, QueueReader] = {}
        self.unfinished = 0
        self._tags = frozenset(config.tags)
        self._room = asyncio.Event()
        self._room.set()
        self._refill = max(1, min(config.read_batch_size, config.concurrency // 4))
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        #: False once the consumer is retiring (its topic left the config): nothing more is handed out.
        self.serving = True
        #: Set by the service when ``audit_log`` is configured.
        self.read_audit: ReadAudit | None = None
        #: Rollbacks of Redis detected per qid (see :meth:`rolled_back`).
        self.rollbacks: Counter[int] = Counter()
        #: qid -> the sequence raised after a rollback: the reader steps over the unused offsets up to it.
        self.gap_until: dict[int, int] = {}
        self._recoveries: set[asyncio.Task[None]] = set()

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] += n

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError(f"consumer {self.group}/{self.topic} already started")
        self._started = True
        start_chain(self.chain)
        self._tasks.append(asyncio.create_task(self._open(), name=f"open:{self.group}/{self.topic}"))
        self._tasks.append(asyncio.create_task(self._dispatch(), name=f"dispatch:{self.group}/{self.topic}"))

    async def _open(self) -> None:
        """Find the topic's queues (waiting for its metadata if need be), then start reading them."""
        warned = False
        while True:
            try:
                queues = await self.broker.topic_queues(self.topic)
            except DdmqError as exc:
                log.warning("%s/%s: %s", self.group, self.topic, exc)
                queues = None
            if queues:
                break
            if not warned:
                log.warning(
                    "topic %s has no metadata yet; group %s waits for its first producer", self.topic, self.group
                )
                warned = True
            await asyncio.sleep(_METADATA_POLL_S)
        self.queues = queues
        await self._maintain_leases()

    async def _maintain_leases(self) -> None:
        """Heartbeat, claim the queues assigned to us, hand off the others, renew what we hold."""
        loop = asyncio.get_running_loop()
        claim_s = self.lease_config.claim_interval_ms / 1000
        renew_s = self.lease_config.renew_ms / 1000
        next_renew = loop.time() + renew_s
        while True:
            try:
                members = await self.membership.heartbeat(self.group)
                self.assigned = assign(members, self.queues, self.membership.instance_id)
            except DdmqError as exc:  # keep the last assignment; leases keep it safe
                log.warning("%s/%s: heartbeat failed: %s", self.group, self.topic, exc)
            for qid in list(self.held):
                if qid not in self.assigned and qid not in self._handoffs:
                    self._handoffs[qid] = asyncio.create_task(
                        self._hand_off(qid), name=f"handoff:{self.group}/{self.topic}#{qid}"
                    )
            for qid in self.assigned:
                if qid not in self.held:
                    await self._claim(qid)
            if loop.time() >= next_renew:
                next_renew = loop.time() + renew_s
                for qid, lease in list(self.held.items()):
                    await self._renew(qid, lease)
            await asyncio.sleep(claim_s)

    async def _hand_off(self, qid: int) -> None:
        """The queue is assigned elsewhere: stop reading, let clients ack what they hold (bounded),
        commit, release. The lease keeps being renewed until then."""
        try:
            reader = self.readers.pop(qid, None)
            if reader is not None:
                await reader.stop()
            tracker = self.trackers.get(qid)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.lease_config.handoff_drain_ms / 1000
            while tracker is not None and tracker.unfinished and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if qid in self.held:
                await self._commit(qid)
                await self.drop_queue(qid, release=True)
                log.info("%s/%s#%d: handed off", self.group, self.topic, qid)
        except DdmqError as exc:
            log.warning("%s/%s#%d: hand-off failed (%s); the lease expires by itself", self.group, self.topic,
                        qid, exc)
            await self.drop_queue(qid)
        finally:
            self._handoffs.pop(qid, None)

    async def _claim(self, qid: int) -> None:
        asked_at = asyncio.get_running_loop().time()
        try:
            lease = await self.leases.acquire(self.group, self.topic, qid)
        except DdmqError as exc:
            log.warning("%s/%s#%d: cannot claim: %s", self.group, self.topic, qid, exc)
            return
        if lease is None:
            return
        self.held[qid] = lease
        self._confirmed_at[qid] = asked_at
        await self.open_queue(qid, lease.term)

    async def _renew(self, qid: int, lease: Lease) -> None:
        asked_at = asyncio.get_running_loop().time()
        try:
            renewed = await self.leases.renew(lease)
        except DdmqError as exc:
            # Keep it: it stays valid until its TTL runs out, and may_serve() stops serving then.
            log.warning("%s/%s#%d: lease renewal failed: %s", self.group, self.topic, qid, exc)
            return
        if renewed and self.held.get(qid) == lease:
            self._confirmed_at[qid] = asked_at
        elif not renewed:
            log.warning("%s/%s#%d: lease term %d was taken over; dropping the queue", self.group, self.topic, qid,
                        lease.term)
            await self.drop_queue(qid)

    def may_serve(self, qid: int) -> bool:
        """True while this proxy's lease on ``qid`` is surely valid (checked before every delivery)."""
        confirmed = self._confirmed_at.get(qid)
        return (
            self.serving and confirmed is not None and asyncio.get_running_loop().time() - confirmed < self._lease_s
        )

    async def open_queue(self, qid: int, term: int) -> None:
        start = await self._with_retry(lambda: self._start_offset(qid), f"start offset of #{qid}")
        skip = await self._finished_past(qid, start)
        self.trackers[qid] = OffsetTracker(start, skip)
        reader = self.readers[qid] = QueueReader(self, qid, term)
        reader.start()
        log.info("%s/%s#%d: lease term %d, reading from offset %d", self.group, self.topic, qid, term, start)

    async def _finished_past(self, qid: int, start: int) -> set[int]:
        try:
            text = await self.broker.finished_offsets(self.group, self.topic, qid)
            return {offset for offset in decode_ranges(text) if offset >= start}
        except DdmqError as exc:
            log.warning("%s/%s#%d: finished offsets unreadable (%s): redelivering them", self.group, self.topic,
                        qid, exc)
        except ValueError as exc:
            log.warning("%s/%s#%d: finished offsets corrupt (%s): redelivering them", self.group, self.topic,
                        qid, exc)
        return set()

    async def drop_queue(self, qid: int, release: bool = False) -> None:
        """Stop reading ``qid`` and forget its unfinished jobs (they stay uncommitted, so the queue's
        next owner delivers them again). With ``release``, free the lease for the next owner."""
        reader = self.readers.pop(qid, None)
        if reader is not None:
            await reader.stop()
        tracker = self.trackers.pop(qid, None)
        if tracker is not None:
            tracker.dropped = True
        self.gap_until.pop(qid, None)
        for job in self.buffer.drop_queue(QueueId(self.topic, qid)):
            self.finish(job)
        lease = self.held.pop(qid, None)
        self._confirmed_at.pop(qid, None)
        if release and lease is not None:
            try:
                await self.leases.release(lease)
            except DdmqError as exc:
                log.warning("%s/%s#%d: releasing the lease failed (%s); it expires by itself",
                            self.group, self.topic, qid, exc)

    async def _start_offset(self, qid: int) -> int:
        committed = await self.broker.committed_offset(self.group, self.topic, qid)
        if committed is not None:
            return committed
        if self.config.start_from is StartFrom.LATEST:
            start = await self.broker.next_produce_offset(self.topic, qid)
        else:
            start = 1
        # Stored at once so a restart before the first commit starts from the same place.
        return await self.broker.init_offset(self.group, self.topic, qid, start)

    async def _with_retry(self, call: Callable[[], Awaitable[int]], what: str) -> int:
        delay = 0.1
        while True:
            try:
                return await call()
            except DdmqError as exc:
                log.warning("%s/%s: %s failed (%s); retrying", self.group, self.topic, what, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def stop_reading(self) -> None:
        if self._tasks:  # first the lease loop, so that no claim opens a reader behind our back
            self._tasks[0].cancel()
            await asyncio.gather(self._tasks[0], return_exceptions=True)
        await asyncio.gather(*(reader.stop() for reader in self.readers.values()))

    async def close(self) -> None:
        await self.stop_reading()
        for task in (*self._handoffs.values(), *self._recoveries):
            task.cancel()
        await asyncio.gather(*self._handoffs.values(), *self._recoveries, return_exceptions=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await close_chain(self.chain)

    async def retire(self, drain_ms: int) -> None:
        """Stop for good (the topic left this group's config, or a new consumer replaces this one).

        Stop reading and handing out; give clients up to ``drain_ms`` to ack or fail what they hold;
        commit; release the leases. Jobs read but not finished stay uncommitted, so whoever reads the
        queue next delivers them again, each key in order. Membership is the group's business.
        """
        self.serving = False
        await self.stop_reading()
        await asyncio.gather(*self._handoffs.values(), return_exceptions=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_ms / 1000
        log.info("%s/%s: retiring: reading stopped; clients have up to %d ms to ack %d jobs in flight",
                 self.group, self.topic, drain_ms, self.buffer.in_flight_of(self.topic))
        # Once per reload, so polling is fine; the ack path stays free of retirement bookkeeping.
        while self.buffer.in_flight_of(self.topic) and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        left = sum(tracker.unfinished for tracker in self.trackers.values())
        for qid in list(self.held):
            try:
                await self._commit(qid)
            except DdmqError as exc:
                log.warning("%s/%s#%d: final commit failed (%s); the unacked part is redelivered",
                            self.group, self.topic, qid, exc)
            await self.drop_queue(qid, release=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await close_chain(self.chain)  # push workers and their connection pools
        log.info("%s/%s: stopped; offsets committed, leases released, %d unfinished jobs left to deliver again",
                 self.group, self.topic, left)

    def reconfigure(self, config: TopicGroupConfig) -> None:
        """Apply settings the engine reads as it goes (see ``ddmq.proxy.reload.IN_PLACE_FIELDS``)."""
        old, self.config = self.config, config
        if config.max_tps != old.max_tps:
            self.limiter = TokenBucket(config.max_tps) if config.max_tps else None
        self._tags = frozenset(config.tags)
        self._refill = max(1, min(config.read_batch_size, config.concurrency // 4))
        if self.unfinished < config.concurrency:
            self._room.set()

    # reading -----------------------------------------------------------------------------------

    async def wait_for_room(self) -> int:
        """Wait until fewer than ``concurrency`` jobs are unfinished; returns the room left."""
        while True:
            room = self.config.concurrency - self.unfinished
            if room > 0:
                return room
            self._room.clear()
            await self._room.wait()

    async def accept(self, queue: QueueId, messages: list[StoredMessage]) -> None:
        """Messages read from ``queue``, in order (one read's batch: one call, not one per message)."""
        tracker = self.trackers[queue.qid]
        tags = self._tags
        counters = self.counters
        for message in messages:
            if self.unfinished >= self.config.concurrency:
                # Several readers size their reads before the others' land: hold the rest of this
                # batch (untracked, so a stop here loses nothing) until there is room again.
                await self.wait_for_room()
            if tracker.track(message.offset):
                counters["skipped_finished"] += 1  # a previous owner finished it
                continue
            if tags and message.tag not in tags:
                tracker.finish(message.offset)
                counters["filtered"] += 1
                continue
            self.unfinished += 1
            counters["read"] += 1
            self.run(UpstreamJob(self, queue, message, tracker))

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
        chain = self.chain
        timers = self.action_timers
        while job.index < len(chain):
            index = job.index
            action = chain[index]
            job.index = index + 1
            started = perf_counter() if timers is not None else 0.0
            try:
                status = action.act(job)
            except Exception as exc:
                log.exception("action %s failed on %r", type(action).__name__, job)
                job.last_error = f"{type(action).__name__} raised {exc!r}"
                status = Status.FAIL
            if timers is not None:
                timers[index](perf_counter() - started)
            if status is _CONTINUE:
                continue
            if status is _ASYNC:
                return
            if status is Status.FAIL:
                self.buffer.dead_letter(job, job.last_error or "action failed")
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
        if not self._room.is_set() and self.unfinished <= self.config.concurrency - self._refill:
            self._room.set()

    async def dead_letter(self, job: UpstreamJob) -> None:
        await self.broker.dead_letter(self.group, self.topic, job.qid, job.message, job.attempts, job.last_error)

    # offsets -----------------------------------------------------------------------------------

    async def flush_offsets(self) -> None:
        """Write commit points that moved since the last flush, each fenced by the queue's lease."""
        for qid in list(self.trackers):
            await self._commit(qid)

    async def _commit(self, qid: int) -> None:
        tracker = self.trackers.get(qid)
        lease = self.held.get(qid)
        if tracker is None or lease is None or tracker.version == tracker.committed_version:
            return
        point, version = tracker.commit_point, tracker.version
        finished = tracker.finished_beyond() if self.lease_config.persist_completions else ""
        mark = read_mark(tracker.next_offset - 1, tracker.last_read)
        result = await self.leases.commit(lease, point, finished, mark)
        if result is CommitResult.WRITTEN:
            tracker.committed, tracker.committed_version = point, version
        elif result is CommitResult.ROLLED_BACK:
            await self.rolled_back(qid, tracker)
        elif self.held.get(qid) == lease:
            log.warning("%s/%s#%d: commit fenced off (lease term %d taken over); dropping the queue",
                        self.group, self.topic, qid, lease.term)
            await self.drop_queue(qid)

    def on_rollback(self, qid: int, tracker: OffsetTracker) -> None:
        """A reader found its queue rolled back: handle it in a task (dropping the queue stops the reader)."""
        task = asyncio.create_task(self.rolled_back(qid, tracker), name=f"rollback:{self.group}/{self.topic}#{qid}")
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)

    async def rolled_back(self, qid: int, tracker: OffsetTracker) -> None:
        """Redis lost writes this proxy had read (e.g. an AOF with ``appendfsync everysec`` after an OS
        crash), and producers may be writing new messages under the offsets it had read.

        Drop the queue's state as if the lease were lost: nothing read under it is committed, its
        jobs are forgotten, and the lease loop opens the queue again from the committed offset that
        Redis holds (the commit script never writes past a rollback). Before that, raise the sequence
        to what was read, so messages produced from now on never reuse an offset a client may still
        ack from before the rollback, and note the rollback where ``ddmq status`` shows it.
        """
        if tracker.dropped or self.trackers.get(qid) is not tracker:
            return  # already handled (the reader and a commit can both notice)
        tracker.dropped = True
        self._confirmed_at.pop(qid, None)  # hand out nothing more of it meanwhile
        read_upto = tracker.next_offset - 1
        self.rollbacks[qid] += 1
        await self.drop_queue(qid)  # first: nothing more is read or handed out under the old state
        try:
            stream_end = await self.broker.next_produce_offset(self.topic, qid) - 1
        except DdmqError:
            stream_end = -1
        log.error(
            "%s/%s#%d: Redis rolled back under this queue: it ends at offset %d (or holds other entries there) "
            "but this proxy read up to %d. Dropping the queue's state and reading again from the committed "
            "offset in Redis; what Redis lost is lost, what was delivered since the commit is delivered again",
            self.group, self.topic, qid, stream_end, read_upto,
        )
        raised = False
        try:
            await self.broker.raise_sequence(self.topic, qid, read_upto)
            raised = True
            await self.broker.record_rollback(self.group, self.topic, qid, self.membership.instance_id,
                                              read_upto, stream_end)
        except DdmqError as exc:
            log.warning("%s/%s#%d: after the rollback: %s", self.group, self.topic, qid, exc)
        if raised:
            self.gap_until[qid] = read_upto

    async def release_leases(self) -> None:
        """Give every held queue up (graceful shutdown, after the final flush)."""
        try:
            await self.membership.leave(self.group)
        except DdmqError as exc:
            log.warning("%s: leaving the member set failed: %s", self.group, exc)
        for qid in list(self.held):
            await self.drop_queue(qid, release=True)


class ConsumerGroup:
    """A group's consumers (one per topic) sharing one PullBuffer."""

    def __init__(
        self, name: str, topics: dict[str, TopicGroupConfig], broker: Broker, leases: LeaseStore,
        lease_config: LeaseConfig, membership: Membership,
    ) -> None:
        self.name = name
        self.buffer = PullBuffer(name)
        self._broker = broker
        self._leases = leases
        self._lease_config = lease_config
        self._membership = membership
        #: Given to consumers added later by a config reload (the service sets it with ``audit_log``).
        self.read_audit: ReadAudit | None = None
        self.consumers = {topic: self.make_consumer(topic, config) for topic, config in topics.items()}
        #: Consumers of topics removed by a config reload, until their drain is over (acks still count).
        self.retiring: dict[str, TopicConsumer] = {}
        #: Set when the group left the config: pulls get "unknown group", acks still count.
        self.removed = False

    def make_consumer(self, topic: str, config: TopicGroupConfig) -> TopicConsumer:
        """A consumer of ``topic`` for this group, not started."""
        consumer = TopicConsumer(self.name, topic, config, self._broker, self.buffer, self._leases,
                                 self._lease_config, self._membership)
        consumer.read_audit = self.read_audit
        return consumer

    def start(self) -> None:
        self.buffer.start()
        for consumer in self.consumers.values():
            consumer.start()

    # live configuration (see ddmq.proxy.reload) --------------------------------------------------

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
        await asyncio.gather(*(c.flush_offsets() for c in self.consumers.values()))

    async def release_leases(self) -> None:
        await asyncio.gather(*(c.release_leases() for c in self.consumers.values()))

    @property
    def unfinished(self) -> int:
        return sum(c.unfinished for c in self.consumers.values())


def build_groups(
    config: ProxyConfig, broker: Broker, leases: LeaseStore, membership: Membership
) -> dict[str, ConsumerGroup]:
    return {
        name: ConsumerGroup(name, topics, broker, leases, config.leases, membership)
        for name, topics in config.groups.items()
    }
