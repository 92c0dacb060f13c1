"""How an offset is committed: from a queue's OffsetTracker to the fenced write in Redis, and back.

- Each queue this proxy reads has an :class:`~ddmq.proxy.engine.offsets.OffsetTracker`: the offsets read in
  order, finished in any order. Its commit point is the first unfinished offset, so a commit never
  passes a message that was not acked or dead-lettered.
- :meth:`OffsetCommitter.commit` writes a queue's commit point, and the offsets finished past it as
  ranges, in one Lua script that first checks the lease (:meth:`LeaseStore.commit
  <ddmq.proxy.cluster.leases.LeaseStore.commit>`): a stale owner writes nothing, and a Redis that lost what
  was read (a rollback) is not written past either.
- :func:`commit_periodically` runs in the service and writes, every ``commit_interval_ms``, every
  queue whose tracker changed, of every committer on the proxy's :class:`CommitBoard` (a topic's
  committer joins it when its consumer starts). Hand-offs, retirement and shutdown commit once more
  before they let go.
- :meth:`OffsetCommitter.load` reads a queue's commit back when this proxy claims it: the tracker
  starts at the committed offset and skips what the previous owner finished past it.

A committer acts on its topic's queues through their states (:class:`~ddmq.proxy.cluster.queue_state.OwnedQueues`),
writes through the lease store and the broker, and lets a queue go through the ``drop_queue`` it is
given (:class:`~ddmq.proxy.cluster.ownership.QueueDrops`): it knows nothing of who consumes the topic.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from ddmq.config.schema import LeaseConfig, StartFrom
from ddmq.proxy.cluster.leases import CommitResult, LeaseStore
from ddmq.proxy.cluster.queue_state import OwnedQueues
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.engine.offsets import OffsetTracker, decode_ranges
from ddmq.proxy.store.broker import Broker, read_mark

log = logging.getLogger(__name__)


class OffsetCommitter:
    """The offset commits of one group's topic: of the queues this proxy holds, in ``owned`` (their
    trackers and leases). A commit fenced off drops its queue through ``drop_queue``; ``start_from`` is
    where a group with no offset on a queue starts (a reload sets it in place)."""

    def __init__(
        self,
        group: str,
        topic: str,
        owned: OwnedQueues,
        *,
        broker: Broker,
        leases: LeaseStore,
        settings: LeaseConfig,
        instance_id: str,
        start_from: StartFrom,
        drop_queue: Callable[[int], Awaitable[None]],
    ) -> None:
        self.group = group
        self.topic = topic
        self._owned = owned
        self._broker = broker
        self._leases = leases
        self._settings = settings
        self._instance_id = instance_id
        self.start_from = start_from
        self._drop_queue = drop_queue
        #: Rollback recoveries under way (see :meth:`on_rollback`).
        self.recoveries: set[asyncio.Task[None]] = set()
        #: Queues whose start offset was just initialised (the group had none there): see ``fresh``.
        self._fresh: set[int] = set()

    def _name(self, qid: int) -> str:
        return f"{self.group}/{self.topic}#{qid}"

    # writing -------------------------------------------------------------------------------------

    def moved(self) -> bool:
        """Whether a commit point moved since it was last written (else :meth:`flush` writes nothing)."""
        return self._owned.moved()

    async def flush(self) -> None:
        """Write commit points that moved since the last flush, each fenced by the queue's lease."""
        for qid in self._owned.trackers():
            await self.commit(qid)

    async def commit(self, qid: int) -> None:
        """Write ``qid``'s commit point if it moved. Raises DdmqError when Redis fails (retried by the
        next flush); a fenced-off commit drops the queue, a rolled-back Redis starts its recovery."""
        owned = self._owned
        tracker, lease = owned.tracker(qid), owned.lease(qid)
        if tracker is None or lease is None or tracker.version == tracker.committed_version:
            return
        point, version = tracker.commit_point, tracker.version
        finished = tracker.finished_beyond() if self._settings.persist_completions else ""
        mark = read_mark(tracker.next_offset - 1, tracker.last_read)
        result = await self._leases.commit(lease, point, finished, mark)
        if result is CommitResult.WRITTEN:
            tracker.committed, tracker.committed_version = point, version
            self._broker.note_commit(self.topic, qid)
        elif result is CommitResult.ROLLED_BACK:
            await self.rolled_back(qid, tracker)
        elif owned.holds(qid, lease):
            log.warning("%s: commit fenced off (lease term %d taken over); dropping the queue", self._name(qid),
                        lease.term)
            await self._drop_queue(qid)

    def tracker(self, qid: int) -> OffsetTracker | None:
        """The offsets of ``qid`` while this proxy reads it, else None."""
        return self._owned.tracker(qid)

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
        broker, group, topic = self._broker, self.group, self.topic
        committed = await broker.committed_offset(group, topic, qid)
        if committed is not None:
            return committed
        if self.start_from is StartFrom.LATEST:
            start = await broker.next_produce_offset(topic, qid)
        else:
            # A new group starts where the queue starts now: what retention trimmed before the group
            # existed was never the group's, so it is not counted as expired for it.
            start = await broker.first_offset(topic, qid)
        # Stored at once so a restart before the first commit starts from the same place.
        self._fresh.add(qid)
        return await broker.init_offset(group, topic, qid, start)

    async def _finished_past(self, qid: int, start: int) -> set[int]:
        try:
            text = await self._broker.finished_offsets(self.group, self.topic, qid)
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
                log.warning("%s/%s: %s failed (%s); retrying", self.group, self.topic, what, exc)
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
        owned = self._owned
        if tracker.dropped or owned.tracker(qid) is not tracker:
            return  # already handled (the reader and a commit can both notice)
        tracker.dropped = True
        owned.unconfirm(qid)  # hand out nothing more of it meanwhile
        read_upto = tracker.next_offset - 1
        owned.count_rollback(qid)
        await self._drop_queue(qid)  # first: nothing more is read or handed out under the old state
        broker, group, topic = self._broker, self.group, self.topic
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
            await broker.record_rollback(group, topic, qid, self._instance_id, read_upto, stream_end)
        except DdmqError as exc:
            log.warning("%s: after the rollback: %s", self._name(qid), exc)
        if raised:
            owned.set_gap(qid, read_upto)


# the service's committer ---------------------------------------------------------------------------


#: Groups whose last flush failed: their next failure is logged at DEBUG (the upkeep's link health
#: says it when Redis is away), their next success at INFO.
_FAILING: set[str] = set()


class CommitBoard:
    """The committers of every topic this proxy consumes, by group: what the service's committer
    writes (:meth:`flush`). A topic's committer is on the board from its consumer's start until the
    consumer is no longer its group's (removed, replaced, or its group gone), as the groups say."""

    def __init__(self) -> None:
        self._groups: dict[str, list[OffsetCommitter]] = {}

    def join(self, committer: OffsetCommitter) -> None:
        self._groups.setdefault(committer.group, []).append(committer)

    def leave(self, committer: OffsetCommitter) -> None:
        committers = self._groups.get(committer.group)
        if committers is not None and committer in committers:
            committers.remove(committer)
            if not committers:
                del self._groups[committer.group]

    def committers(self) -> list[OffsetCommitter]:
        """Every committer on the board, group by group."""
        return [committer for committers in self._groups.values() for committer in committers]

    async def flush(self) -> None:
        """Commit every topic on the board; a group whose commit fails is retried by the next flush."""
        for group, committers in list(self._groups.items()):  # a reload may add or remove groups meanwhile
            try:
                # Only committers with something to write: an idle group costs no task per topic and interval.
                await asyncio.gather(*(c.flush() for c in list(committers) if c.moved()))
            except DdmqError as exc:
                (log.debug if group in _FAILING else log.warning)(
                    "committing offsets of group %s failed: %s (retried every interval)", group, exc)
                _FAILING.add(group)
                continue
            if group in _FAILING:
                _FAILING.discard(group)
                log.info("committing offsets of group %s again", group)


async def commit_periodically(interval_ms: int, running: Callable[[], bool], board: CommitBoard) -> None:
    """The service's committer task: every ``interval_ms`` while ``running()``, flush ``board``."""
    interval = interval_ms / 1000
    while running():
        await asyncio.sleep(interval)
        await board.flush()
