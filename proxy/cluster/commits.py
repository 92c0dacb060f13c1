"""How an offset is committed: from a queue's OffsetTracker to the fenced write in Redis, and back.

- Each queue this proxy reads has an :class:`~ddmq.proxy.engine.offsets.OffsetTracker`: the offsets read in
  order, finished in any order. Its commit point is the first unfinished offset, so a commit never
  passes a message that was not acked or dead-lettered.
- :meth:`OffsetCommitter.commit` writes a queue's commit point, and the offsets finished past it as
  ranges, in one Lua script that first checks the lease (:meth:`LeaseStore.commit
  <ddmq.proxy.cluster.leases.LeaseStore.commit>`): a stale owner writes nothing, and a Redis that lost what
  was read (a rollback) is not written past either.
- :func:`commit_periodically` runs in the service and writes, every ``commit_interval_ms``, every
  queue whose tracker changed. Hand-offs, retirement and shutdown commit once more before they let go.
- :meth:`OffsetCommitter.load` reads a queue's commit back when this proxy claims it: the tracker
  starts at the committed offset and skips what the previous owner finished past it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from ddmq.config.schema import LeaseConfig, StartFrom
from ddmq.proxy.cluster.leases import CommitResult, LeaseStore
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.cluster.queue_state import OwnedQueues
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.engine.offsets import OffsetTracker, decode_ranges
from ddmq.proxy.engine.reader import QueueConsumer
from ddmq.proxy.store.broker import read_mark

log = logging.getLogger(__name__)


class QueueDropper(Protocol):
    async def drop_queue(self, qid: int, release: bool = False) -> None: ...


class CommitHost(QueueConsumer, Protocol):
    """What commits need of their consumer besides: the lease stores, its queues' states, and the
    ownership that drops a queue."""

    @property
    def leases(self) -> LeaseStore: ...
    @property
    def lease_config(self) -> LeaseConfig: ...
    @property
    def membership(self) -> Membership: ...
    @property
    def owned(self) -> OwnedQueues: ...
    @property
    def ownership(self) -> QueueDropper: ...


class Flushes(Protocol):
    """A group, as the service's committer sees it."""

    @property
    def name(self) -> str: ...

    async def flush_offsets(self) -> None: ...


class OffsetCommitter:
    """The offset commits of one consumer's queues (their trackers are in ``consumer.owned``)."""

    def __init__(self, consumer: CommitHost) -> None:
        self.consumer = consumer
        #: Rollback recoveries under way (see :meth:`on_rollback`).
        self.recoveries: set[asyncio.Task[None]] = set()
        #: Queues whose start offset was just initialised (the group had none there): see ``fresh``.
        self._fresh: set[int] = set()

    def _name(self, qid: int) -> str:
        return f"{self.consumer.group}/{self.consumer.topic}#{qid}"

    # writing -------------------------------------------------------------------------------------

    def moved(self) -> bool:
        """Whether a commit point moved since it was last written (else :meth:`flush` writes nothing)."""
        return self.consumer.owned.moved()

    async def flush(self) -> None:
        """Write commit points that moved since the last flush, each fenced by the queue's lease."""
        for qid in self.consumer.owned.trackers():
            await self.commit(qid)

    async def commit(self, qid: int) -> None:
        """Write ``qid``'s commit point if it moved. Raises DdmqError when Redis fails (retried by the
        next flush); a fenced-off commit drops the queue, a rolled-back Redis starts its recovery."""
        consumer = self.consumer
        tracker, lease = consumer.owned.tracker(qid), consumer.owned.lease(qid)
        if tracker is None or lease is None or tracker.version == tracker.committed_version:
            return
        point, version = tracker.commit_point, tracker.version
        finished = tracker.finished_beyond() if consumer.lease_config.persist_completions else ""
        mark = read_mark(tracker.next_offset - 1, tracker.last_read)
        result = await consumer.leases.commit(lease, point, finished, mark)
        if result is CommitResult.WRITTEN:
            tracker.committed, tracker.committed_version = point, version
            consumer.broker.note_commit(consumer.topic, qid)
        elif result is CommitResult.ROLLED_BACK:
            await self.rolled_back(qid, tracker)
        elif consumer.owned.holds(qid, lease):
            log.warning("%s: commit fenced off (lease term %d taken over); dropping the queue", self._name(qid),
                        lease.term)
            await consumer.ownership.drop_queue(qid)

    # reading back --------------------------------------------------------------------------------

    async def load(self, qid: int) -> OffsetTracker:
        """A tracker for ``qid``, just claimed: from its committed offset (retried until Redis answers),
        skipping the offsets a previous owner finished past it."""
        start = await self._with_retry(lambda: self._start_offset(qid), f"start offset of #{qid}")
        tracker = OffsetTracker(start, await self._finished_past(qid, start))
        tracker.fresh = qid in self._fresh
        self._fresh.discard(qid)
        return tracker

    async def _start_offset(self, qid: int) -> int:
        consumer = self.consumer
        broker, group, topic = consumer.broker, consumer.group, consumer.topic
        committed = await broker.committed_offset(group, topic, qid)
        if committed is not None:
            return committed
        if consumer.config.start_from is StartFrom.LATEST:
            start = await broker.next_produce_offset(topic, qid)
        else:
            # A new group starts where the queue starts now: what retention trimmed before the group
            # existed was never the group's, so it is not counted as expired for it.
            start = await broker.first_offset(topic, qid)
        # Stored at once so a restart before the first commit starts from the same place.
        self._fresh.add(qid)
        return await broker.init_offset(group, topic, qid, start)

    async def _finished_past(self, qid: int, start: int) -> set[int]:
        consumer = self.consumer
        try:
            text = await consumer.broker.finished_offsets(consumer.group, consumer.topic, qid)
            return {offset for offset in decode_ranges(text) if offset >= start}
        except DdmqError as exc:
            log.warning("%s: finished offsets unreadable (%s): redelivering them", self._name(qid), exc)
        except ValueError as exc:
            log.warning("%s: finished offsets corrupt (%s): redelivering them", self._name(qid), exc)
        return set()

    async def _with_retry(self, call: Callable[[], Awaitable[int]], what: str) -> int:
        delay = 0.1
        while True:
            try:
                return await call()
            except DdmqError as exc:
                log.warning("%s/%s: %s failed (%s); retrying", self.consumer.group, self.consumer.topic, what, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # a Redis that rolled back --------------------------------------------------------------------

    def on_rollback(self, qid: int, tracker: OffsetTracker) -> None:
        """A reader found its queue rolled back: handle it in a task (dropping the queue stops the reader)."""
        task = asyncio.create_task(self.rolled_back(qid, tracker), name=f"rollback:{self._name(qid)}")
        self.recoveries.add(task)
        task.add_done_callback(self.recoveries.discard)

    async def rolled_back(self, qid: int, tracker: OffsetTracker) -> None:
        """Redis lost writes this proxy had read (e.g. an AOF with ``appendfsync everysec`` after an OS
        crash), and producers may be writing new messages under the offsets it had read.

        Drop the queue's state as if the lease were lost: nothing read under it is committed, its
        jobs are forgotten, and the next upkeep round opens the queue again from the committed offset that
        Redis holds (the commit script never writes past a rollback). Before that, raise the sequence
        to what was read, so messages produced from now on never reuse an offset a client may still
        ack from before the rollback, and note the rollback where ``ddmq status`` shows it.
        """
        consumer = self.consumer
        if tracker.dropped or consumer.owned.tracker(qid) is not tracker:
            return  # already handled (the reader and a commit can both notice)
        tracker.dropped = True
        consumer.owned.unconfirm(qid)  # hand out nothing more of it meanwhile
        read_upto = tracker.next_offset - 1
        consumer.owned.count_rollback(qid)
        await consumer.ownership.drop_queue(qid)  # first: nothing more is read or handed out under the old state
        broker, group, topic = consumer.broker, consumer.group, consumer.topic
        try:
            stream_end = await broker.next_produce_offset(topic, qid) - 1
        except DdmqError:
            stream_end = -1
        log.error(
            "%s: Redis rolled back under this queue: it ends at offset %d (or holds other entries there) "
            "but this proxy read up to %d. Dropping the queue's state and reading again from the committed "
            "offset in Redis; what Redis lost is lost, what was delivered since the commit is delivered again",
            self._name(qid), stream_end, read_upto,
        )
        raised = False
        try:
            await broker.raise_sequence(topic, qid, read_upto)
            raised = True
            await broker.record_rollback(group, topic, qid, consumer.membership.instance_id, read_upto, stream_end)
        except DdmqError as exc:
            log.warning("%s: after the rollback: %s", self._name(qid), exc)
        if raised:
            consumer.owned.set_gap(qid, read_upto)


# the service's committer ---------------------------------------------------------------------------


#: Groups whose last flush failed: their next failure is logged at DEBUG (the upkeep's link health
#: says it when Redis is away), their next success at INFO.
_FAILING: set[str] = set()


async def flush_groups(groups: Iterable[Flushes]) -> None:
    """Commit every consumer of ``groups``; a group whose commit fails is retried by the next flush."""
    for group in list(groups):  # a reload may add or remove groups meanwhile
        try:
            await group.flush_offsets()
        except DdmqError as exc:
            (log.debug if group.name in _FAILING else log.warning)(
                "committing offsets of group %s failed: %s (retried every interval)", group.name, exc)
            _FAILING.add(group.name)
            continue
        if group.name in _FAILING:
            _FAILING.discard(group.name)
            log.info("committing offsets of group %s again", group.name)


async def commit_periodically(
    interval_ms: int, running: Callable[[], bool], groups: Callable[[], Iterable[Flushes]]
) -> None:
    """The service's committer task: every ``interval_ms`` while ``running()``, flush the groups
    ``groups()`` returns then (the service's current groups)."""
    interval = interval_ms / 1000
    while running():
        await asyncio.sleep(interval)
        await flush_groups(groups())
