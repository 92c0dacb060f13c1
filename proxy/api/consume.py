"""ConsumeApi: the one implementation of :class:`~ddmq.proxy.api.surface.ConsumeService`, over the
running groups (:class:`~ddmq.proxy.groups.registry.GroupRegistry`).

It applies the request rules (:mod:`ddmq.proxy.api.requests`) and the group and topic checks; a
request's results (acks, fails, the other verbs) go to :class:`~ddmq.proxy.api.results.Results`, once per
request, and from there down to the buffers. Each server adapter holds its own :meth:`ConsumeApi.bound`
view, with that server's linger bound; the views share everything else.

>>> api = ConsumeApi(registry, RequestRules(config.thrift.max_linger_ms))
>>> thrift_view = api.bound(RequestRules(config.thrift.max_linger_ms))
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from time import perf_counter

from ddmq.proxy.api.fetch import LowLevelApi
from ddmq.proxy.api.pull_retries import Answer, RetriedPulls
from ddmq.proxy.api.requests import RequestRules, batch_size, check_group, check_pull, per_key
from ddmq.proxy.api.results import Results
from ddmq.proxy.core.errors import UnavailableError, UnknownTopicError
from ddmq.proxy.core.types import (
    ConsumeStatsRow,
    FetchedQueue,
    PullBatch,
    PullLease,
    QueueResult,
    ReplySize,
)
from ddmq.proxy.engine.pull_buffer import THRIFT_REPLY
from ddmq.proxy.groups.group import TopicConsumer
from ddmq.proxy.groups.registry import GroupRegistry
from ddmq.proxy.store.trim import expired_records

PullObserver = Callable[[str, PullBatch, float], None]


class ConsumeApi:
    """The request surface over ``registry``. ``waits`` says whether a request may wait (long polls)
    at all: none once shutdown began (parked pulls are answered then, and new ones must not park);
    ``observe_pull`` is told each pull's group, answer and duration (the metrics); ``counters``
    counts refused and ignored results."""

    def __init__(
        self,
        registry: GroupRegistry,
        rules: RequestRules,
        *,
        waits: Callable[[], bool] = lambda: True,
        observe_pull: PullObserver | None = None,
        counters: Counter[str] | None = None,
    ) -> None:
        self.registry = registry
        self.rules = rules
        self.counters: Counter[str] = Counter() if counters is None else counters
        #: Acks, fails and the other verbs, applied to the groups' buffers (the counters shared).
        self._results = Results(registry, self.counters)
        self._waits = waits
        self._observe_pull = observe_pull
        self._low_level: LowLevelApi | None = None
        #: What the pulls that named a request id answered (see :mod:`ddmq.proxy.api.pull_retries`).
        self.retries = RetriedPulls()

    def bound(self, rules: RequestRules) -> ConsumeApi:
        """A view with ``rules`` (one server's linger bound), sharing the registry and the counters."""
        view = ConsumeApi(
            self.registry, rules, waits=self._waits, observe_pull=self._observe_pull, counters=self.counters
        )
        view._low_level = self._low_level
        view.retries = self.retries
        return view

    def _fetcher(self) -> LowLevelApi:
        if self._low_level is None:
            if self.registry.broker is None:
                raise UnavailableError("the proxy is not started")
            self._low_level = LowLevelApi(self.registry.broker)
        return self._low_level

    async def pull(
        self,
        group: str,
        topic: str | None,
        max_batch: int | None,
        linger_ms: int | None,
        results: list[QueueResult],
        lease: PullLease | None = None,
        max_per_key: int | None = None,
        reply: ReplySize | None = None,
        early: Callable[[PullBatch], None] | None = None,
        request_id: str | None = None,
    ) -> PullBatch:
        """Serve one pull: apply ``results``, then answer ready messages of one queue. ``max_per_key``
        (None or 1: one per key) lets the reply carry ordered runs of a key (see ``PullBuffer``);
        ``reply`` counts the reply's bytes against the topic's ``max_reply_bytes`` (None: as a Thrift
        frame); ``early`` is the buffer's (a lease's pulls do without it). A ``request_id`` already
        served here answers what its first try answered, if still in flight (``pull_retries``)."""
        check_pull(group, topic, max_batch, linger_ms, max_per_key, request_id)  # a bad request applies nothing
        memo: Answer | None = None
        if request_id is not None and lease is None:
            started = perf_counter()
            retried = self.retries.known(group, request_id)
            if retried is not None:
                again = await self._again(retried, group, topic)
                if again is not None:
                    self.counters["retried_pulls"] += 1
                    if self._observe_pull is not None:
                        self._observe_pull(group, again, perf_counter() - started)
                    return again
                results = []  # the first try applied them
            found = self.registry.groups.get(group)
            if found is not None and not found.removed:  # remembered before its results are applied
                memo = self.retries.begin(found, request_id)
        try:
            return await self._pull(group, topic, max_batch, linger_ms, results, lease, max_per_key, reply, early, memo)
        finally:
            if memo is not None:
                memo.settle()  # a pull that raised: a retry pulls afresh, its results not applied again

    async def _again(self, retried: Answer, group: str, topic: str | None) -> PullBatch | None:
        """What a retry of ``retried`` answers (None: nothing of it is left in flight). A first try
        still waiting is waited for, never cancelled by this one."""
        if not retried.settled:
            await asyncio.shield(retried.waiter())
        return self.retries.replay(retried, self.registry.group(group).buffer, topic or None)

    async def _pull(
        self,
        group: str,
        topic: str | None,
        max_batch: int | None,
        linger_ms: int | None,
        results: list[QueueResult],
        lease: PullLease | None,
        max_per_key: int | None,
        reply: ReplySize | None,
        early: Callable[[PullBatch], None] | None,
        memo: Answer | None,
    ) -> PullBatch:
        if results:  # first: acks count even when the group was just removed
            await self._results.apply(results, group)
        consumer_group = self.registry.group(group)
        topic = topic or None
        if topic is not None:
            consumer = consumer_group.consumers.get(topic)
            if consumer is None:
                raise UnknownTopicError(f"group {group!r} does not consume topic {topic!r}")
            consumers = [consumer]
        else:
            consumers = list(consumer_group.consumers.values())
        batch = batch_size(max_batch, max(c.config.max_pull_batch_size for c in consumers))
        run = per_key(max_per_key)
        linger = self._linger(linger_ms)
        buffer = consumer_group.buffer
        reply = reply or THRIFT_REPLY
        started = perf_counter()
        if results and not buffer.ready:
            # The acks may have released their keys' successors; the dispatcher hands them to the
            # buffer on its next step. Let it run once, so this pull can take them at once instead of
            # parking until then (with QID order this is every pull).
            await asyncio.sleep(0)
        if lease is not None:
            timeout_ms = lease.timeout_ms
            if timeout_ms is None:
                timeout_ms = max(c.config.timeout_ms for c in consumers)
            answer = await self.registry.replay_leases(consumer_group).pull(
                lease.lease_id, lease.pull_index, timeout_ms, topic, batch, linger, run, reply
            )
        else:
            if memo is not None:
                early = _remembering(memo, early)
            answer = await buffer.pull(topic, batch, linger, None, run, (), reply, early)
            if memo is not None:
                RetriedPulls.answered(memo, answer)
        if self._observe_pull is not None:
            self._observe_pull(group, answer, perf_counter() - started)
        return answer

    async def ack_leases(self, group: str, lease_ids: list[str], abandon: bool = False) -> int:
        replays = self.registry.replay_leases(self.registry.group(group))
        if abandon:
            await replays.abandon(lease_ids)
            return 0
        return await replays.ack(lease_ids)

    async def submit(self, results: list[QueueResult], group: str | None = None) -> None:
        if group is not None:
            check_group(group)
            self.registry.group(group, draining=True)
        await self._results.apply(results, group)

    def _linger(self, linger_ms: int | None) -> int:
        """The wait a request gets: as the rules bound it, none once shutdown began. A pull that
        arrives while the proxy is still starting (the Thrift server listens before the HTTP server)
        waits like any other."""
        if not self._waits():
            return 0
        return self.rules.linger(linger_ms)

    async def fetch(
        self,
        group: str,
        offsets: dict[str, dict[str, int]] | None,
        max_batch: int | None,
        linger_ms: int | None,
    ) -> list[FetchedQueue]:
        consumer_group = self.registry.group(group)
        return await self._fetcher().fetch(consumer_group, offsets, max_batch, self._linger(linger_ms))

    async def ack(self, group: str, offsets: dict[str, dict[str, int]]) -> None:
        consumer_group = self.registry.group(group)
        await self._fetcher().ack(consumer_group, offsets)

    async def consume_stats(self, group: str, topic: str | None) -> list[ConsumeStatsRow]:
        consumer_group = self.registry.group(group)
        topic = topic or None
        if topic is not None and topic not in consumer_group.consumers:
            raise UnknownTopicError(f"group {group!r} does not consume topic {topic!r}")
        rows = []
        for consumer in consumer_group.consumers.values():
            if topic is None or consumer.topic == topic:
                rows.append(await self._stats_row(consumer))
        return rows

    async def _stats_row(self, consumer: TopicConsumer) -> ConsumeStatsRow:
        broker, leases = self.registry.broker, self.registry.leases
        assert broker is not None and leases is not None
        produce = await broker.produce_offsets(consumer.topic, consumer.queues) if consumer.queues else []
        consume = {}
        for qid in range(consumer.queues):
            tracker = consumer.trackers.get(qid)
            if tracker is not None:
                consume[str(qid)] = tracker.commit_point
            else:
                committed = await broker.committed_offset(consumer.group, consumer.topic, qid)
                consume[str(qid)] = committed if committed is not None else 1
        holders = await asyncio.gather(
            *(leases.holder(consumer.group, consumer.topic, qid) for qid in range(consumer.queues))
        )
        live = [(str(qid), holder) for qid, holder in enumerate(holders) if holder is not None]
        lost = [(str(qid), record) for qid, record in enumerate(
            await expired_records(broker.redis, consumer.group, consumer.topic, consumer.queues)) if record.entries]
        return ConsumeStatsRow(
            consumer.group,
            consumer.topic,
            consume,
            {str(qid): off for qid, off in enumerate(produce)},
            owners={qid: holder.owner for qid, holder in live},
            lease_ttl_ms={qid: holder.expires_in_ms for qid, holder in live},
            lease_terms={qid: holder.term for qid, holder in live},
            expired={qid: record.entries for qid, record in lost},
            expired_last={qid: f"{record.first}..{record.last}" for qid, record in lost},
        )


def _remembering(memo: Answer, early: Callable[[PullBatch], None] | None) -> Callable[[PullBatch], None]:
    """``early``, remembering the answer first: a reply written from the answering step may be lost
    and retried before this pull's coroutine resumes."""

    def answered(batch: PullBatch) -> None:
        RetriedPulls.answered(memo, batch)
        if early is not None:
            early(batch)

    return answered
