"""The runtime of a consumer group on this proxy: per topic, its chain, key gate, readers, offsets."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from ddmq.actions import Action, Status, build_chain
from ddmq.config.schema import ProxyConfig, StartFrom, TopicGroupConfig
from ddmq.proxy.broker import Broker
from ddmq.proxy.errors import DdmqError
from ddmq.proxy.job import JobState, UpstreamJob
from ddmq.proxy.offsets import OffsetTracker
from ddmq.proxy.ordering import UpstreamJobBlockingQueue
from ddmq.proxy.pull_buffer import PullBuffer
from ddmq.proxy.reader import QueueReader, TokenBucket
from ddmq.proxy.types import StoredMessage

log = logging.getLogger(__name__)

_METADATA_POLL_S = 1.0


class TopicConsumer:
    """One group consuming one topic: the chain runs here, and finished jobs come back here."""

    def __init__(self, group: str, topic: str, config: TopicGroupConfig, broker: Broker, buffer: PullBuffer) -> None:
        self.group = group
        self.topic = topic
        self.config = config
        self.broker = broker
        self.buffer = buffer
        self.blocking_queue = UpstreamJobBlockingQueue()
        self.counters: Counter[str] = Counter()
        self.limiter = TokenBucket(config.max_tps) if config.max_tps else None
        self.chain: list[Action] = build_chain(config.actions, self)
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

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] += n

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise RuntimeError(f"consumer {self.group}/{self.topic} already started")
        self._started = True
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
        for qid in range(queues):
            await self.open_queue(qid)

    async def open_queue(self, qid: int) -> None:
        start = await self._with_retry(lambda: self._start_offset(qid), f"start offset of #{qid}")
        self.trackers[qid] = OffsetTracker(start)
        reader = self.readers[qid] = QueueReader(self, qid)
        reader.start()
        log.info("%s/%s#%d: reading from offset %d", self.group, self.topic, qid, start)

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
        await asyncio.gather(*(reader.stop() for reader in self.readers.values()))
        if self._tasks:
            self._tasks[0].cancel()  # _open, if still waiting for metadata

    async def close(self) -> None:
        await self.stop_reading()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # reading -----------------------------------------------------------------------------------

    async def wait_for_room(self) -> int:
        """Wait until fewer than ``concurrency`` jobs are unfinished; returns the room left."""
        while True:
            room = self.config.concurrency - self.unfinished
            if room > 0:
                return room
            self._room.clear()
            await self._room.wait()

    async def accept(self, qid: int, message: StoredMessage) -> None:
        """A message read from queue ``qid``, in order."""
        tracker = self.trackers[qid]
        tracker.track(message.offset)
        if self._tags and message.tag not in self._tags:
            tracker.finish(message.offset)
            self.counters["filtered"] += 1
            return
        self.unfinished += 1
        self.counters["read"] += 1
        await self.run(UpstreamJob(self, qid, message))

    # the chain ---------------------------------------------------------------------------------

    async def run(self, job: UpstreamJob) -> None:
        """Run ``job`` from its current position in the chain until an action takes it over."""
        chain = self.chain
        while job.index < len(chain):
            action = chain[job.index]
            job.index += 1
            try:
                status = await action.act(job)
            except Exception as exc:
                log.exception("action %s failed on %r", type(action).__name__, job)
                job.last_error = f"{type(action).__name__} raised {exc!r}"
                status = Status.FAIL
            if status is Status.CONTINUE:
                continue
            if status is Status.ASYNC:
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
                await self.run(job)

    # finishing ---------------------------------------------------------------------------------

    def finish(self, job: UpstreamJob) -> None:
        """``job`` is done (acked, filtered, dead-lettered): release its key, mark its offset."""
        self.blocking_queue.release(job)
        tracker = self.trackers.get(job.qid)
        if tracker is not None:
            tracker.finish(job.offset)
        self.unfinished -= 1
        if not self._room.is_set() and self.unfinished <= self.config.concurrency - self._refill:
            self._room.set()

    async def dead_letter(self, job: UpstreamJob) -> None:
        await self.broker.dead_letter(self.group, self.topic, job.qid, job.message, job.attempts, job.last_error)

    # offsets -----------------------------------------------------------------------------------

    async def flush_offsets(self) -> None:
        """Write commit points that moved since the last flush."""
        moved = {qid: t.commit_point for qid, t in self.trackers.items() if t.commit_point != t.committed}
        if not moved:
            return
        await self.broker.commit(self.group, self.topic, moved)
        for qid, offset in moved.items():
            self.trackers[qid].committed = offset


class ConsumerGroup:
    """A group's consumers (one per topic) sharing one PullBuffer."""

    def __init__(self, name: str, topics: dict[str, TopicGroupConfig], broker: Broker) -> None:
        self.name = name
        self.buffer = PullBuffer(name)
        self.consumers = {
            topic: TopicConsumer(name, topic, config, broker, self.buffer) for topic, config in topics.items()
        }

    def start(self) -> None:
        self.buffer.start()
        for consumer in self.consumers.values():
            consumer.start()

    async def stop_reading(self) -> None:
        await asyncio.gather(*(c.stop_reading() for c in self.consumers.values()))
        self.buffer.stop_serving()

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.consumers.values()))
        await self.buffer.close()

    async def flush_offsets(self) -> None:
        await asyncio.gather(*(c.flush_offsets() for c in self.consumers.values()))

    @property
    def unfinished(self) -> int:
        return sum(c.unfinished for c in self.consumers.values())


def build_groups(config: ProxyConfig, broker: Broker) -> dict[str, ConsumerGroup]:
    return {name: ConsumerGroup(name, topics, broker) for name, topics in config.groups.items()}
