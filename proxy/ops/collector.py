"""EngineCollector: the engine's counters and gauges, read when Prometheus scrapes.

The engine keeps its own plain counters (:class:`~ddmq.proxy.engine.redelivery.BufferStats` per queue,
``TopicConsumer.counters``, the offset trackers, the key chains); nothing is copied on the hot path.
The families are :class:`~ddmq.proxy.ops.exposition.Family` objects, which ``/metrics`` writes
directly (:func:`~ddmq.proxy.ops.exposition.render`); :meth:`EngineCollector.collect` gives the same
families to prometheus-client for anything else that reads the registry.

With ``metrics.per_queue`` the queue-level families carry ``(group, topic, qid)`` labels (and
``ddmq_consume_offset`` / ``ddmq_produce_offset``, which have no sensible sum, are exported), the
others ``(group, topic)``. By default the queue-level figures are summed over the queues this proxy
holds (the age of the oldest unfinished message is their max), and then every family is folded to
the labels :mod:`~ddmq.proxy.ops.rollup` gives it: per (group, topic) for the few an operator follows
per topic, per group or per proxy for the rest, so a scrape's size follows the (group, topic) pairs
times a handful, not the queues. Either way a queue is counted by the one proxy that holds it, so a
sum over proxies gives the group's figure.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import fields
from itertools import accumulate
from operator import attrgetter
from typing import TYPE_CHECKING, Final, NamedTuple

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.job import JobState
from ddmq.proxy.engine.pull_buffer import BufferStats
from ddmq.proxy.ops.exposition import COUNTER, GAUGE, GAUGE_HISTOGRAM, HISTOGRAM, Family
from ddmq.proxy.ops.lag import now_ms
from ddmq.proxy.ops.latency import LatencyHistogram, add_latencies
from ddmq.proxy.ops.rollup import coarsen

if TYPE_CHECKING:
    from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer
    from ddmq.proxy.groups.registry import GroupRegistry

#: Upper bounds of the key-chain length histogram.
CHAIN_BUCKETS: Final = (1, 2, 4, 8, 16, 64, 256)
_CHAIN_LES: Final = (*(str(float(bound)) for bound in CHAIN_BUCKETS), "+Inf")

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

QUEUE_LABELS: Final = ("group", "topic", "qid")
TOPIC_LABELS: Final = ("group", "topic")


class TopicFigures(NamedTuple):
    """What :meth:`ProxyMetrics.refresh <ddmq.proxy.ops.metrics.ProxyMetrics.refresh>` reads from Redis
    per (group, topic): the same on every proxy."""

    dead_letters: int
    unowned_queues: int


class QueueFigures(NamedTuple):
    """One opened queue's gauges at scrape time, or the sums over a (group, topic)'s opened queues."""

    in_flight: int
    ready: int
    retry_wait: int
    unfinished: int
    owned: int
    #: First unfinished offset (the live commit point).
    committed: int
    #: Next produce offset, None when this scrape could not read it (then no lag either).
    produced: int | None
    lag: int
    age_s: float


class QueueFamilies:
    """The queue-level gauges and the rollback counter, per queue with ``per_queue``, else per
    (group, topic) (:meth:`EngineCollector._summed_figures`: sums over the queues, the max age), to be
    folded (:func:`~ddmq.proxy.ops.rollup.coarsen`)."""

    def __init__(self, per_queue: bool) -> None:
        self.per_queue = per_queue
        labels = QUEUE_LABELS if per_queue else TOPIC_LABELS
        where = "per held queue" if per_queue else "over the queues this proxy holds"

        def gauge(name: str, doc: str) -> Family:
            return Family(name, GAUGE, doc, labels)

        self.in_flight = gauge("ddmq_messages_in_flight", "Pulled messages awaiting ack/fail.")
        self.ready = gauge("ddmq_messages_ready", "Messages ready to be pulled.")
        self.retry_wait = gauge("ddmq_messages_retry_wait", "Failed messages waiting for their retry interval.")
        self.unfinished = gauge(
            "ddmq_messages_unfinished",
            "Messages read from the queue and not finished yet (waiting behind their key, ready, in flight).",
        )
        self.owned = gauge("ddmq_queue_owned", "Queues this proxy holds the lease of (per queue: 1 or 0).")
        self.committed = gauge(
            "ddmq_consume_offset", "Next offset to commit (first unfinished message) per held queue."
        )
        self.produce = gauge("ddmq_produce_offset", "Next offset to be produced per held queue.")
        self.lag = gauge("ddmq_lag_messages", f"Produced but not yet finished messages {where}.")
        self.age = gauge(
            "ddmq_lag_seconds",
            f"Age of the oldest unfinished message {where} (now minus its produce time); 0 when caught up.",
        )
        self.rollbacks = Family(
            "ddmq_queue_rollbacks", COUNTER,
            "Times this proxy found Redis had lost writes it had read under a queue (a rollback).", labels,
        )

    def add(self, labels: tuple[str, ...], figures: QueueFigures) -> None:
        """One queue's figures (per queue), or a (group, topic)'s summed ones."""
        self.in_flight.add_metric(labels, figures.in_flight)
        self.ready.add_metric(labels, figures.ready)
        self.retry_wait.add_metric(labels, figures.retry_wait)
        self.unfinished.add_metric(labels, figures.unfinished)
        self.owned.add_metric(labels, figures.owned)
        self.committed.add_metric(labels, figures.committed)
        if figures.produced is not None:
            self.produce.add_metric(labels, figures.produced)
            self.lag.add_metric(labels, figures.lag)
            self.age.add_metric(labels, figures.age_s)

    def families(self) -> list[Family]:
        # An offset has no meaningful sum: the offsets are exported per queue only.
        offsets = [self.committed, self.produce] if self.per_queue else []
        return [self.in_flight, self.ready, self.retry_wait, self.unfinished, self.owned, *offsets,
                self.lag, self.age, self.rollbacks]


class TopicFamilies:
    """The series per (group, topic) with ``per_queue`` (folded by default): key chains, concurrency,
    engine events."""

    def __init__(self) -> None:
        labels = TOPIC_LABELS
        self.keys = Family("ddmq_order_keys", GAUGE, "Order keys with an unfinished message.", labels)
        self.waiting = Family(
            "ddmq_order_waiting_messages", GAUGE, "Messages waiting behind an unfinished one of the same key.", labels
        )
        self.longest = Family("ddmq_order_chain_length_max", GAUGE, "Unfinished messages of the busiest key.", labels)
        self.chains = Family(
            "ddmq_order_chain_length", GAUGE_HISTOGRAM, "Order keys by their number of unfinished messages.", labels
        )
        self.unfinished = Family(
            "ddmq_topic_unfinished_messages", GAUGE,
            "Unfinished messages of the consumers (each capped by its topic's concurrency).", labels,
        )
        self.concurrency = Family(
            "ddmq_topic_concurrency_limit", GAUGE,
            "The configured concurrency: most unfinished messages (by default summed over the group's topics).", labels,
        )
        self.events = Family(
            "ddmq_consumer_events", COUNTER, "Engine events of the consumers (read, filtered, json_invalid, ...).",
            (*labels, "event"),
        )
        self.key_states = Family(
            "ddmq_keys", GAUGE,
            "Order keys with an unfinished message here, by state (parked, failing, in_flight, waiting).",
            (*labels, "state"),
        )

    def add(self, group: str, topic: str, consumer: TopicConsumer) -> None:
        labels = (group, topic)
        queue = consumer.blocking_queue
        lengths = [queue.chain_length(key) for key, _ in queue.heads()]
        total = sum(lengths)
        self.keys.add_metric(labels, len(lengths))
        self.waiting.add_metric(labels, total - len(lengths))
        self.longest.add_metric(labels, max(lengths, default=0))
        counts = [0] * len(_CHAIN_LES)
        for length in lengths:
            counts[bisect_left(CHAIN_BUCKETS, length)] += 1
        self.chains.add_histogram(labels, list(zip(_CHAIN_LES, accumulate(counts), strict=True)), total)
        self.unfinished.add_metric(labels, consumer.unfinished)
        for state, count in consumer.parking.counts().items():
            self.key_states.add_metric((group, topic, state), count)
        self.concurrency.add_metric(labels, consumer.config.concurrency)
        for event, count in sorted(consumer.counters.items()):
            self.events.add_metric((group, topic, event), count)

    def families(self) -> list[Family]:
        return [self.keys, self.waiting, self.longest, self.chains, self.unfinished, self.concurrency, self.events,
                self.key_states]


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
        queues, topics = QueueFamilies(per_queue), TopicFamilies()
        parked = Family("ddmq_parked_pulls", GAUGE, "Long-poll pulls waiting for messages.", ["group"])
        now = now_ms()
        where_and_state = attrgetter("queue" if per_queue else "queue.topic", "state")
        for name, group in groups.items():
            parked.add_metric((name,), group.buffer.parked)
            # Jobs by queue (per queue) or by topic, and state: one pass over what the buffer holds.
            states: Counter[tuple[QueueId | str, JobState]] = Counter(map(where_and_state, group.buffer.jobs()))
            for topic, consumer in group.consumers.items():
                self._add_queues(queues, name, consumer, states, now)
                topics.add(name, topic, consumer)
        proxy_events = Family(
            "ddmq_proxy_events", COUNTER, "Proxy-wide events (unknown_results: acks for unknown group/topic/qid).",
            ["event"],
        )
        for event, count in sorted(self._counters.items()):
            proxy_events.add_metric((event,), count)
        engine = [*_buffer_counters(groups, per_queue), *queues.families(), *self._redis_figures(),
                  *topics.families()]
        return [*(engine if per_queue else coarsen(engine)), parked, proxy_events,
                *self._latencies(per_queue), *_server_metrics(self._server_stats())]

    def _add_queues(
        self, queues: QueueFamilies, group: str, consumer: TopicConsumer,
        states: Counter[tuple[QueueId | str, JobState]], now: int,
    ) -> None:
        topic, rollbacks = consumer.topic, consumer.rollbacks
        if not queues.per_queue:
            queues.add((group, topic), self._summed_figures(group, consumer, states, now))
            # The series exists from the consumer's start (0 until a rollback): increase() sees the first.
            queues.rollbacks.add_metric((group, topic), sum(rollbacks.values()))
            return
        opened = self._queue_figures(group, consumer, states, now)
        for qid, figures in opened:
            queues.add((group, topic, str(qid)), figures)
        # Every opened queue has the series (0 until a rollback), so increase() sees the first one.
        for qid in sorted(rollbacks.keys() | {qid for qid, _ in opened}):
            queues.rollbacks.add_metric((group, topic, str(qid)), rollbacks[qid])

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

    def _redis_figures(self) -> list[Family]:
        dead_letters = Family(
            "ddmq_dead_letters", GAUGE,
            "Entries in the group's dead-letter streams now (read from Redis by every proxy).", TOPIC_LABELS,
        )
        unowned = Family(
            "ddmq_queues_without_owner", GAUGE,
            "Queues whose lease nobody holds for the group (read from Redis by every proxy).",
            TOPIC_LABELS,
        )
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


def _buffer_counters(groups: dict[str, ConsumerGroup], per_queue: bool) -> list[Family]:
    """The pull buffers' counters, per queue or summed per (group, topic); a queue has them from its
    first delivery, ack or fail (a series per queue that ever saw one)."""
    labels = QUEUE_LABELS if per_queue else TOPIC_LABELS
    families = [Family(metric, COUNTER, doc, labels) for metric, doc in BUFFER_COUNTERS.values()]
    for name, group in groups.items():
        if per_queue:
            for queue, stats in group.buffer.queue_stats.items():
                values = (name, queue.topic, str(queue.qid))
                for family, field in zip(families, _STATS_FIELDS, strict=True):
                    family.add_metric(values, getattr(stats, field))
            continue
        rows: dict[str, list[tuple[int, ...]]] = {}
        for queue, stats in group.buffer.queue_stats.items():
            rows.setdefault(queue.topic, []).append(_read_stats(stats))
        for topic, counts in rows.items():
            labels = (name, topic)
            for family, column in zip(families, zip(*counts, strict=True), strict=True):
                family.add_metric(labels, sum(column))
    return families


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
