"""EngineCollector: the engine's counters and gauges, read when Prometheus scrapes.

The engine keeps its own plain counters (:class:`~ddmq.proxy.engine.redelivery.BufferStats` per queue,
``TopicConsumer.counters``, the offset trackers, the key chains); nothing is copied on the hot path.
The families are :class:`~ddmq.proxy.ops.exposition.Family` objects, which ``/metrics`` writes
directly (:func:`~ddmq.proxy.ops.exposition.render`); :meth:`EngineCollector.collect` gives the same
families to prometheus-client for anything else that reads the registry.

With ``metrics.per_queue`` the queue-level families carry ``(group, topic, qid)`` labels (and
``ddmq_consume_offset`` / ``ddmq_produce_offset``, which have no sensible sum, are exported), the
others ``(group, topic)``. By default the queue-level figures are summed over the queues this proxy
holds (the age of the oldest unfinished message is their max), and then every family is written at
the labels :mod:`~ddmq.proxy.ops.rollup` gives it: per (group, topic) for the few an operator follows
per topic, per group or per proxy for the rest, so a scrape's size follows the (group, topic) pairs
times a handful, not the queues. Either way a queue is counted by the one proxy that holds it, so a
sum over proxies gives the group's figure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import fields
from itertools import accumulate
from operator import attrgetter
from typing import TYPE_CHECKING, Final

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.job import JobState
from ddmq.proxy.engine.pull_buffer import BufferStats
from ddmq.proxy.ops.exposition import COUNTER, GAUGE, HISTOGRAM, Family
from ddmq.proxy.ops.families import (
    CHAIN_LES,
    QUEUE_LABELS,
    TOPIC_LABELS,
    QueueFamilies,
    QueueFigures,
    TopicFamilies,
    TopicFigures,
    chain_lengths,
    end_to_end_families,
    tenant_families,
)
from ddmq.proxy.ops.lag import now_ms
from ddmq.proxy.ops.latency import LatencyHistogram, add_latencies
from ddmq.proxy.ops.rollup import TopicRows, default_labels, retarget

if TYPE_CHECKING:
    from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer
    from ddmq.proxy.groups.registry import GroupRegistry


#: BufferStats field -> (metric name without ``_total``, help).
BUFFER_COUNTERS: Final = {
    "delivered": ("ddmq_messages_delivered", "Messages handed to pull clients, redeliveries included."),
    "acked": ("ddmq_messages_acked", "Messages acked by clients (late acks included)."),
    "failed": ("ddmq_messages_failed", "Failed attempts reported by clients."),
    "timed_out": ("ddmq_messages_timed_out", "Pulled messages not acked within timeout_ms (a failed attempt)."),
    "retried": ("ddmq_messages_retried", "Messages made ready again after a failed attempt (redeliveries)."),
    "dead_lettered": ("ddmq_messages_dead_lettered", "Messages written to the dead-letter stream."),
    "unknown_acks": (
        "ddmq_acks_unknown", "Acks for offsets not delivered to a client of the group, or not held (ignored)."
    ),
    "unknown_fails": ("ddmq_fails_unknown", "Fails for offsets not in flight (ignored)."),
    "late_acks": ("ddmq_acks_late", "Acks that arrived after the message's timeout (they still finish it)."),
    "released": (
        "ddmq_messages_released", "Messages a client gave back unprocessed (releaseOffsets): no attempt counted."
    ),
    "extended": ("ddmq_messages_extended", "Delivery deadlines a client restarted (extendOffsets)."),
    "ignored_verbs": (
        "ddmq_verbs_ignored",
        "Releases and extensions for messages not in flight to the group, or past max_extensions (ignored).",
    ),
}
_STATS_FIELDS: Final = tuple(f.name for f in fields(BufferStats))
#: A queue's BufferStats as a tuple, in ``_STATS_FIELDS`` order.
_read_stats: Final = attrgetter(*_STATS_FIELDS)
assert set(BUFFER_COUNTERS) == set(_STATS_FIELDS), "every BufferStats field is exported"

#: A job's queue (or topic), and its state.
_QUEUE_AND_STATE: Final = attrgetter("queue", "state")
_TOPIC_AND_STATE: Final = attrgetter("queue.topic", "state")


class EngineCollector(Collector):
    """Reads the engine's counters and gauges at scrape time; costs nothing between scrapes."""

    def __init__(
        self,
        groups: GroupRegistry,
        counters: Counter[str],
        server_stats: Callable[[], dict[str, dict[str, int]]],
        actions: dict[tuple[str, str, str], LatencyHistogram],
        pulls: dict[tuple[str, str], LatencyHistogram] | None = None,
    ) -> None:
        self._groups, self._counters, self._server_stats = groups, counters, server_stats
        #: (group, topic, action) and (group, result) -> durations, observed as the proxy works.
        self._actions, self._pulls = actions, pulls if pulls is not None else {}
        #: topic -> next produce offset per qid, set by :meth:`ProxyMetrics.refresh` before a scrape.
        self.produced: dict[str, list[int]] = {}
        #: (group, topic, qid) -> produce time of the held queue's first unfinished message, from refresh.
        self.oldest_ms: dict[tuple[str, str, int], int] = {}
        #: (group, topic) -> figures read from Redis by refresh.
        self.topics: dict[tuple[str, str], TopicFigures] = {}

    @property
    def per_queue(self) -> bool:
        """``metrics.per_queue`` of the config in force (a reload changes it for the next scrape)."""
        return self._groups.config.metrics.per_queue

    def collect(self) -> Iterator[Metric]:
        for family in self.families():
            yield family.metric()

    def families(self) -> list[Family]:
        """Every family, read from the engine now."""
        per_queue = self.per_queue
        groups = self._groups.groups
        parked = Family("ddmq_parked_pulls", GAUGE, "Long-poll pulls waiting for messages.", ["group"])
        paused = Family("ddmq_paused_seconds", GAUGE, "How long an operator's pause has held the deliveries "
                        "(ddmq groups pause; by default the longest over the group's topics); 0 while not paused.",
                        ["group", "topic"] if per_queue else ["group"])
        for name, group in groups.items():
            parked.add_metric((name,), group.buffer.parked)
            held_for = {topic: group.pause_watch.paused_s(topic) for topic in group.consumers}
            if per_queue:
                for topic, seconds in held_for.items():
                    paused.add_metric((name, topic), seconds)
            else:
                paused.add_metric((name,), max(held_for.values(), default=0.0))
        proxy_events = Family(
            "ddmq_proxy_events", COUNTER, "Proxy-wide events (unknown_results: acks for unknown group/topic/qid).",
            ["event"],
        )
        for event, count in sorted(self._counters.items()):
            proxy_events.add_metric((event,), count)
        engine = self._per_queue_families(groups) if per_queue else self._default_families(groups)
        return [*_buffer_counters(groups, per_queue), *engine, parked, paused, *_breakers(groups), proxy_events,
                *self._latencies(per_queue), *end_to_end_families(groups, per_queue), *tenant_families(groups),
                *_server_metrics(self._server_stats())]

    def _per_queue_families(self, groups: dict[str, ConsumerGroup]) -> list[Family]:
        queues, topics = QueueFamilies(True), TopicFamilies()
        now = now_ms()
        for name, group in groups.items():
            # Jobs by queue and state: one pass over what the buffer holds.
            states: Counter[tuple[QueueId | str, JobState]] = Counter(map(_QUEUE_AND_STATE, group.buffer.jobs()))
            for topic, consumer in group.consumers.items():
                opened = self._queue_figures(name, consumer, states, now)
                for qid, figures in opened:
                    queues.add((name, topic, str(qid)), figures)
                # Every opened queue has the series (0 until a rollback), so increase() sees the first one.
                rollbacks = consumer.rollbacks
                for qid in sorted(rollbacks.keys() | {qid for qid, _ in opened}):
                    queues.rollbacks.add_metric((name, topic, str(qid)), rollbacks[qid])
                topics.add(name, topic, consumer)
        return [*queues.families(), *self._redis_figures(True), *topics.families()]

    def _default_families(self, groups: dict[str, ConsumerGroup]) -> list[Family]:
        """Each (group, topic)'s figures summed over its queues, written at each family's default
        labels (:class:`~ddmq.proxy.ops.rollup.TopicRows`): no series per (group, topic) to fold."""
        queues, topics = QueueFamilies(False), TopicFamilies()
        lag, age, chains, events, keys = map(retarget, (queues.lag, queues.age, topics.chains, topics.events,
                                                       topics.key_states))
        rows = TopicRows([retarget(family) for family in (
            queues.in_flight, queues.ready, queues.retry_wait, queues.unfinished, queues.owned, queues.rollbacks,
            topics.keys, topics.waiting, topics.longest, topics.held_keys, topics.held, topics.unfinished,
            topics.concurrency)])
        buckets, total, now = [0] * len(CHAIN_LES), 0, now_ms()
        for name, group in groups.items():
            # Jobs by topic and state: one pass over what the buffer holds.
            states: Counter[tuple[QueueId | str, JobState]] = Counter(map(_TOPIC_AND_STATE, group.buffer.jobs()))
            group_keys: dict[str, int] = {}
            group_events: dict[str, int] = {}
            for topic, consumer in group.consumers.items():
                figures = self._summed_figures(name, consumer, states, now)
                lengths, counts = chain_lengths(consumer)
                rows.add(name, topic, (
                    figures.in_flight, figures.ready, figures.retry_wait, figures.unfinished, figures.owned,
                    sum(consumer.rollbacks.values()), len(lengths), sum(lengths) - len(lengths),
                    max(lengths, default=0), len(consumer.jobs.held), sum(consumer.jobs.held.per_queue.values()),
                    consumer.unfinished, consumer.config.concurrency,
                ))  # rollbacks from the consumer's start (0 until one), so increase() sees the first
                if figures.produced is not None:
                    lag.add_metric((name, topic), figures.lag)
                    age.add_metric((name, topic), figures.age_s)
                buckets = [mine + theirs for mine, theirs in zip(buckets, counts, strict=True)]
                total += sum(lengths)
                for added, into in ((consumer.parking.counts(), group_keys), (consumer.counters, group_events)):
                    for what, count in added.items():
                        into[what] = into.get(what, 0) + count
            for state, count in group_keys.items():
                keys.add_metric((name, state), count)
            for event, count in sorted(group_events.items()):
                events.add_metric((name, event), count)
        if any(group.consumers for group in groups.values()):
            chains.add_histogram((), list(zip(CHAIN_LES, accumulate(buckets), strict=True)), total)
        in_flight, ready, retry_wait, unfinished, owned, rollbacks, *by_keys = rows.done()
        return [in_flight, ready, retry_wait, unfinished, owned, lag, age, rollbacks, *self._redis_figures(False),
                *by_keys[:3], chains, *by_keys[3:], events, keys]

    def _queue_figures(
        self, group: str, consumer: TopicConsumer, states: Counter[tuple[QueueId | str, JobState]], now: int
    ) -> list[tuple[int, QueueFigures]]:
        """Each opened queue's figures (those with an offset tracker), by qid."""
        topic, held = consumer.topic, consumer.held
        offsets = self.produced.get(topic)
        rows = []
        for qid, tracker in sorted(consumer.trackers.items()):
            queue = QueueId(topic, qid)
            commit_point = tracker.commit_point
            produced, lag, age = None, 0, 0.0
            if offsets is not None and qid < len(offsets):
                produced = offsets[qid]
                lag = max(0, produced - commit_point)
                oldest = self.oldest_ms.get((group, topic, qid))
                age = max(0, now - oldest) / 1000 if oldest is not None else 0.0
            rows.append((qid, QueueFigures(
                states[queue, JobState.IN_FLIGHT], states[queue, JobState.READY], states[queue, JobState.RETRY_WAIT],
                tracker.unfinished, 1 if qid in held else 0, commit_point, produced, lag, age,
            )))
        return rows

    def _summed_figures(
        self, group: str, consumer: TopicConsumer, states: Counter[tuple[QueueId | str, JobState]], now: int
    ) -> QueueFigures:
        """The opened queues' figures together: sums (offsets too, which are not exported), and the age
        of the oldest message among them. One pass, no object per queue: this runs for every queue."""
        topic, held = consumer.topic, consumer.held
        offsets = self.produced.get(topic)
        oldest_ms = self.oldest_ms
        unfinished = owned = committed = produced = lag = 0
        first: int | None = None
        for qid, tracker in consumer.trackers.items():
            commit_point = tracker.commit_point
            unfinished += tracker.unfinished
            owned += qid in held
            committed += commit_point
            if offsets is not None and qid < len(offsets):
                produced += offsets[qid]
                lag += max(0, offsets[qid] - commit_point)
                ms = oldest_ms.get((group, topic, qid))
                if ms is not None and (first is None or ms < first):
                    first = ms
        return QueueFigures(
            states[topic, JobState.IN_FLIGHT], states[topic, JobState.READY], states[topic, JobState.RETRY_WAIT],
            unfinished, owned, committed, produced if offsets is not None else None, lag,
            max(0, now - first) / 1000 if first is not None else 0.0,
        )

    def _redis_figures(self, per_topic: bool) -> list[Family]:
        dead_letters = Family(
            "ddmq_dead_letters", GAUGE,
            "Entries in the group's dead-letter streams now (read from Redis by every proxy).", TOPIC_LABELS,
        )
        unowned = Family(
            "ddmq_queues_without_owner", GAUGE,
            "Queues whose lease nobody holds for the group (read from Redis by every proxy).",
            TOPIC_LABELS,
        )
        if not per_topic:
            rows = TopicRows([retarget(dead_letters), retarget(unowned)])
            for (name, topic), figures in sorted(self.topics.items()):
                rows.add(name, topic, figures)
            return rows.done()
        for (name, topic), figures in sorted(self.topics.items()):
            dead_letters.add_metric((name, topic), figures.dead_letters)
            unowned.add_metric((name, topic), figures.unowned_queues)
        return [dead_letters, unowned]

    def _latencies(self, per_queue: bool) -> list[Family]:
        """The pull durations per (group, result) with ``per_queue``, the action durations per (group,
        topic, action); by default both per proxy (18 series a histogram; an action's code is the same
        for every group and topic), by ``result`` and by ``action``. An action has its series from its
        first call: an idle consumer costs no 18 series per action."""
        pulls = Family(
            "ddmq_pull_duration_seconds", HISTOGRAM,
            "Duration of pull calls (Thrift and HTTP), from the call to its answer, long-poll wait included.",
            ("group", "result") if per_queue else ("result",),
        )
        actions = Family(
            "ddmq_action_duration_seconds", HISTOGRAM,
            "Duration of one action call of the chain (an action answering ASYNC: until it took the job over).",
            (*TOPIC_LABELS, "action") if per_queue else ("action",),
        )
        add_latencies(pulls, [(key if per_queue else key[1:], durations)
                               for key, durations in sorted(self._pulls.items())])
        add_latencies(actions, [(key if per_queue else key[2:], durations)
                                 for key, durations in sorted(self._actions.items())])
        return [pulls, actions]


def _breakers(groups: dict[str, ConsumerGroup]) -> list[Family]:
    """Each consumed (group, topic)'s breaker, in both label modes (a breaker is a topic's): 1 while it
    is open or half-open, its transitions by the state they went to."""
    held = Family("ddmq_breaker_open", GAUGE, "1 while the topic's breaker is open or half-open (it hands out "
                  "nothing but probes, its failed attempts count nothing); 0 while closed or without one.",
                  ["group", "topic"])
    moves = Family("ddmq_breaker_transitions", COUNTER, "Breaker transitions by the state they went to (open, "
                   "half_open, closed).", ["group", "topic", "to"])
    for name, group in groups.items():
        breakers = group.breakers.breakers
        for topic in group.consumers:
            breaker = breakers.get(topic)
            held.add_metric((name, topic), 1.0 if breaker is not None and breaker.holds else 0.0)
            for state, count in sorted(breaker.transitions.items()) if breaker is not None else ():
                moves.add_metric((name, topic, state), count)
    return [held, moves]


def _buffer_counters(groups: dict[str, ConsumerGroup], per_queue: bool) -> list[Family]:
    """The pull buffers' counters, per queue, or summed to each one's default labels (per (group,
    topic), group or proxy: :func:`~ddmq.proxy.ops.rollup.default_labels`); a queue has them from its
    first delivery, ack or fail (a series per queue that ever saw one)."""
    if per_queue:
        families = [Family(metric, COUNTER, doc, QUEUE_LABELS) for metric, doc in BUFFER_COUNTERS.values()]
        for name, group in groups.items():
            for queue, stats in group.buffer.queue_stats.items():
                values = (name, queue.topic, str(queue.qid))
                for family, field in zip(families, _STATS_FIELDS, strict=True):
                    family.add_metric(values, getattr(stats, field))
        return families
    rows = TopicRows([Family(metric, COUNTER, doc, default_labels(metric, TOPIC_LABELS))
                      for metric, doc in BUFFER_COUNTERS.values()])
    for name, group in groups.items():
        by_topic: dict[str, list[tuple[int, ...]]] = {}
        for queue, stats in group.buffer.queue_stats.items():
            by_topic.setdefault(queue.topic, []).append(_read_stats(stats))
        for topic, counts in by_topic.items():
            rows.add(name, topic, list(map(sum, zip(*counts, strict=True))))
    return rows.done()


#: Server stats that are gauges; the others are counters (see ``ThriftServer.stats``).
_SERVER_GAUGES: Final = {
    "open": ("ddmq_server_connections", "Client connections open now."),
    "buffered_bytes": ("ddmq_server_buffered_bytes", "Request bytes being read or decoded now (max_buffered_bytes)."),
}


def _server_metrics(stats: dict[str, dict[str, int]]) -> list[Family]:
    events = Family(
        "ddmq_server_events", COUNTER,
        "Connection events per server: accepted, refused (max_connections, every connection busy), evicted "
        "(closed to admit a new one at max_connections), not_allowed (allowed_clients), accept_errors (e.g. EMFILE), "
        "timeouts (idle or request), frames_rejected, decode_errors, too_large (early 413).",
        ["server", "event"],
    )
    gauges = {key: Family(name, GAUGE, doc, ["server"]) for key, (name, doc) in _SERVER_GAUGES.items()}
    for server, values in sorted(stats.items()):
        for key, value in sorted(values.items()):
            if key in gauges:
                gauges[key].add_metric((server,), value)
            else:
                events.add_metric((server, key), value)
    return [events, *gauges.values()]
