"""Retention: each queue trimmed up to what every registered group finished, plus the topic's caps.

One proxy trims a queue at a time: the one holding the queue's trimmer lease (a PX lease every proxy
that knows the topic competes for, taken and renewed by :func:`trim.probe
<ddmq.proxy.store.trim.probe>`), so a topic nobody consumes is trimmed by its caps too, and a trimmer
that dies is replaced within a bounded time (:func:`~ddmq.proxy.cluster.trim_pacing.lease_ttl_ms`).
A queue is probed every round while something happens on it, and less often, down to one round in
:data:`~ddmq.proxy.cluster.trim_pacing.MAX_GAP_ROUNDS`, while nothing does (:mod:`trim_pacing
<ddmq.proxy.cluster.trim_pacing>`): an idle proxy's trimmer costs next to nothing. Each probe, per queue:

- ``consumed`` (default): the floor is the lowest committed offset of the groups registered for the
  topic (``ddmq groups list``); a group idle for longer than ``group_idle_after_s`` does not count.
  No group registered: nothing is trimmed by this rule.
- ``max_len`` / ``max_age_s``: caps that raise the floor whatever the groups have finished.
- the queue is trimmed below the floor in steps of at most ``retention.step`` entries, yielding to the
  event loop between them, so neither Redis nor this proxy's readers stall behind a large trim.

A cap never drops an entry silently: the trimmer logs every group it overtakes, and each group's
reader counts the offsets it finds missing as expired (:mod:`ddmq.proxy.engine.expiry`). The round's
figures (who holds the trim back, stream sizes, Redis memory) are kept for ``/metrics``, the console
and ``ddmq status``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ddmq.config.schema import RetentionConfig
from ddmq.proxy.cluster.membership import STAMP_EVERY_MS
from ddmq.proxy.cluster.trim_pacing import Queue, TrimPacing, lease_ttl_ms
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.supervise import supervised
from ddmq.proxy.store import trim
from ddmq.proxy.store.broker import Broker
from ddmq.proxy.store.trim import QueueHead, Reader, RedisMemory, StreamSize

log = logging.getLogger(__name__)

#: Steps one queue may take in one round; the rest waits for the next round.
MAX_STEPS_PER_ROUND = 50
#: Stream sizes and Redis memory are read every this many seconds.
MEASURE_EVERY_S = 5.0
#: The trimmer's ERROR about a group it overtakes repeats at most this often (per queue and group).
WARN_EVERY_S = 60.0


@dataclass(frozen=True)
class Holder:
    """The group whose position holds a queue's ``consumed`` trim back."""

    group: str
    committed: int
    #: Entries kept on its account: from its committed offset to the queue's end.
    retained: int
    #: Produce time (ms) of the oldest entry kept for it; 0 when unknown.
    oldest_ms: int


def consumed_floor(
    readers: Iterable[Reader], head: int, now_ms: int, idle_after_s: int | None
) -> tuple[int, Reader | None]:
    """The offset below which every registered, not idle, group has finished; and the group at it.
    No such group: ``head`` (nothing to trim by consumption)."""
    # A group's stamp is written every STAMP_EVERY_MS at most (the heartbeat's), so that much older is
    # still live.
    active = [r for r in readers
              if idle_after_s is None or now_ms - r.last_seen_ms <= idle_after_s * 1000 + STAMP_EVERY_MS]
    if not active:
        return head, None
    lowest = min(active, key=lambda r: (r.committed if r.committed is not None else head, r.group))
    return (lowest.committed if lowest.committed is not None else head), lowest


def cap_floor(retention: RetentionConfig, end: int, entries: list[QueueHead], now_ms: int) -> int:
    """The floor the caps set: ``max_len`` keeps offsets past ``end - max_len``; ``max_age_s`` keeps
    entries produced since ``now - max_age_s`` (``entries``: the queue's first ones, in order)."""
    floor = 0
    if retention.max_len is not None:
        floor = end - retention.max_len + 1
    if retention.max_age_s is not None and entries:
        cutoff = now_ms - retention.max_age_s * 1000
        young = next((e.offset for e in entries if e.produce_ms >= cutoff), entries[-1].offset + 1)
        floor = max(floor, young)
    return floor


class Retention:
    """The service's trimmer task: every round, trims the queues whose trimmer lease it holds."""

    def __init__(
        self,
        broker: Broker,
        owner: str,
        topics: Callable[[], dict[str, tuple[int, RetentionConfig]]],
        interval_ms: int = 1000,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self.broker = broker
        #: Redis's time (ms): the group stamps and produce times it compares were not written by this host.
        self.now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.redis = broker.redis
        self.owner = owner
        #: topic -> (queues, retention) of every topic this proxy knows, read each round (reloads).
        self._topics = topics
        self.interval_ms = interval_ms
        #: When each queue is probed next (every round while something happens on it, less often while not).
        self.pacing = TrimPacing(interval_ms)
        #: (topic, qid) -> the group holding its trim back (last round), for the views.
        self.holders: dict[tuple[str, int], Holder] = {}
        #: (topic, qid) -> entries removed by this proxy's trims.
        self.trimmed: dict[tuple[str, int], int] = {}
        self.memory: RedisMemory | None = None
        self.sizes: dict[str, StreamSize] = {}
        #: (topic, qid) -> what its last probe found when its stream was last measured, and the size.
        self._sizes: dict[Queue, tuple[trim.Probe | None, StreamSize]] = {}
        self._held: set[tuple[str, int]] = set()
        #: (topic, qid, group) -> (first offset removed since the last ERROR about it, when that was).
        self._warned: dict[tuple[str, int, str], tuple[int, float]] = {}
        self._measured = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("Retention already started")
        self._task = asyncio.create_task(supervised("trimmer", self._run), name="retention")

    async def close(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        for topic, qid in sorted(self._held):
            try:
                await trim.drop_trimmer(self.redis, topic, qid, self.owner)
            except DdmqError:
                pass  # it expires on its own
        self._held.clear()

    async def _run(self) -> None:
        failing = False
        while True:
            started = time.monotonic()
            try:
                await self.round()
                failing = False
            except DdmqError as exc:
                # Once per streak: a Redis outage is said by the upkeep's link health.
                (log.debug if failing else log.warning)("retention round failed: %s (retried every round)", exc)
                failing = True
            await asyncio.sleep(max(0.0, self.interval_ms / 1000 - (time.monotonic() - started)))

    async def round(self) -> None:
        """One pass over the queues due (:class:`TrimPacing`): hold its trimmer lease if free, trim it if
        held. The leases and the queues' heads are taken in one pipeline for all of them
        (:func:`trim.probe`); the group registry is read only for the topics whose held queues have entries."""
        topics = self._topics()
        pacing = self.pacing
        # The queues this proxy committed on since the last round are probed now, whatever their pace.
        due = pacing.due([(topic, qid) for topic, (count, _) in sorted(topics.items()) for qid in range(count)],
                         self.broker.take_commits())
        held = [pacing.held(queue) for queue in due]
        # Counted as held before the probe: if the task is cancelled while it is out, close() still
        # drops the leases it may have taken (the drop deletes only this proxy's), so another proxy
        # need not wait for their TTL.
        self._held.update(due)
        found_all = await trim.probe(self.redis, due, held, self.owner, lease_ttl_ms(self.interval_ms))
        for queue, found in zip(due, found_all, strict=True):
            if found is None:
                self._held.discard(queue)
        # The registry is read for the topics with entries to look at only: one HMGET per registered group
        # naming every known topic would answer groups times topics fields a round (a million with 1,000 of
        # each), while at most a few topics hold entries at once.
        with_entries = sorted({topic for (topic, _), found in zip(due, found_all, strict=True)
                               if found is not None and found.first is not None})
        groups = await trim.registered_groups_of(self.redis, with_entries) if with_entries else {}
        for (topic, qid), found in zip(due, found_all, strict=True):
            busy = False
            if found is None or found.first is None:  # another proxy trims it, or empty: nothing to trim
                self.holders.pop((topic, qid), None)
            else:
                busy = await self._trim_queue(topic, qid, topics[topic][1], groups.get(topic, {}), found)
            pacing.probed((topic, qid), found, busy)
        if time.monotonic() - self._measured >= MEASURE_EVERY_S:
            await self.measure(topics, fresh=False)

    async def measure(self, topics: dict[str, tuple[int, RetentionConfig]] | None = None, fresh: bool = True) -> None:
        """Read Redis memory and the topics' stream sizes (for the views). Unless ``fresh``, a queue
        backed off (its last probe found it as the one before) whose stream was measured since keeps
        that size: it changes no more than its first entry and sequence, so it is as of its last probe."""
        self._measured = time.monotonic()
        topics = self._topics() if topics is None else topics
        self.memory = await trim.redis_memory(self.redis)
        queues = [(topic, qid) for topic, (count, _) in sorted(topics.items()) for qid in range(count)]
        quiet = {queue: self.pacing.quiet(queue) for queue in queues}
        stale = [queue for queue in queues
                 if fresh or quiet[queue] is None or queue not in self._sizes or self._sizes[queue][0] != quiet[queue]]
        sizes = {queue: self._sizes[queue] for queue in queues if queue in self._sizes}
        for queue, size in zip(stale, await trim.stream_sizes(self.redis, stale), strict=True):
            sizes[queue] = (quiet[queue], size)
        self._sizes = sizes
        totals = {topic: StreamSize(0, 0) for topic in sorted(topics)}
        for (topic, _), (_, size) in sizes.items():
            totals[topic] = StreamSize(totals[topic].entries + size.entries, totals[topic].bytes + size.bytes)
        self.sizes = totals

    async def _trim_queue(
        self, topic: str, qid: int, retention: RetentionConfig, groups: dict[str, int], found: trim.Probe
    ) -> bool:
        """Trim the queue below its floor; whether there was anything to trim."""
        assert found.first is not None
        end, first = found.end, [found.first]
        head = first[0].offset
        now_ms = self.now_ms()
        if retention.max_age_s is not None and first[0].produce_ms < now_ms - retention.max_age_s * 1000:
            first = await trim.head(self.redis, topic, qid, retention.step)  # where the young ones begin
        readers = await trim.readers(self.redis, topic, qid, groups)
        floor, lowest = consumed_floor(readers, head, now_ms, retention.group_idle_after_s)
        if not retention.consumed:
            floor = head
        await self._note_holder(topic, qid, lowest, end, retention)
        target = max(floor, cap_floor(retention, end, first, now_ms))
        if target <= head:
            return False
        self._warn_overtaken(topic, qid, readers, head, target)
        for _ in range(MAX_STEPS_PER_ROUND):
            step_to = min(target, head + retention.step)
            removed = await trim.trim_below(self.redis, topic, qid, step_to)
            self.trimmed[topic, qid] = self.trimmed.get((topic, qid), 0) + removed
            if step_to >= target:
                break
            await asyncio.sleep(0)  # readers and pulls go first between steps
            first = await trim.head(self.redis, topic, qid)
            if not first:
                break
            head = first[0].offset
        return True

    async def _note_holder(
        self, topic: str, qid: int, lowest: Reader | None, end: int, retention: RetentionConfig
    ) -> None:
        if lowest is None or lowest.committed is None or not retention.consumed or lowest.committed > end:
            self.holders.pop((topic, qid), None)
            return
        previous = self.holders.get((topic, qid))
        if previous is not None and previous.committed == lowest.committed and previous.group == lowest.group:
            oldest = previous.oldest_ms
        else:
            at = await trim.entry_from(self.redis, topic, qid, lowest.committed)
            oldest = at.produce_ms if at is not None else 0
        self.holders[topic, qid] = Holder(lowest.group, lowest.committed, end - lowest.committed + 1, oldest)

    def _warn_overtaken(self, topic: str, qid: int, readers: list[Reader], head: int, target: int) -> None:
        """ERROR for each group whose unread offsets this trim removes: at once the first time, then at
        most once a minute per queue and group, naming every offset removed since the last line."""
        now = time.monotonic()
        for reader in readers:
            committed = reader.committed if reader.committed is not None else head
            if committed >= target:
                self._warned.pop((topic, qid, reader.group), None)
                continue
            since, at = self._warned.get((topic, qid, reader.group), (max(head, committed), -WARN_EVERY_S))
            if now - at < WARN_EVERY_S:
                continue
            log.error(
                "retention of %s#%d removes offsets %d..%d, which group %s has not consumed (it is at %d): "
                "they expire for it (a cap, or the group is idle)",
                topic, qid, since, target - 1, reader.group, committed,
            )
            self._warned[topic, qid, reader.group] = (target, now)
