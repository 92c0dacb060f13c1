"""ProxyMetrics: the proxy's Prometheus metrics, in one private registry per service.

The engine keeps its own plain counters (:class:`~ddmq.proxy.engine.pull_buffer.BufferStats` per queue,
``TopicConsumer.counters``, the offset trackers, the key chains). Nothing is copied on the hot path:
:class:`EngineCollector` reads them when Prometheus scrapes. Only two histograms are observed as the
proxy works: the duration of each pull call (one observation per pull, not per message) and of each
action call of the chain.

Per-queue series exist for the queues this proxy holds (a queue is held by one proxy at a time), so
summing a series over all proxies gives the group's figure. Labels are group, topic and qid: the
number of queues per topic is fixed and small, so cardinality stays bounded.

>>> metrics = ProxyMetrics(registry, counters, server_stats)
>>> await metrics.refresh()          # reads produce offsets from Redis, for the lag gauges
>>> body = metrics.render()          # Prometheus text format
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from itertools import accumulate
from typing import TYPE_CHECKING, Final, NamedTuple

from prometheus_client import CollectorRegistry, Histogram, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from redis.asyncio.cluster import RedisCluster

from ddmq.protocol import keys as key_names
from ddmq.protocol.connection import AsyncRedis
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.types import PullBatch, QueueId
from ddmq.proxy.engine.job import JobState
from ddmq.proxy.engine.pull_buffer import BufferStats
from ddmq.proxy.ops.lag import now_ms, produce_times
from ddmq.proxy.store.broker import map_redis_errors

if TYPE_CHECKING:
    from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer
    from ddmq.proxy.groups.registry import GroupRegistry

log = logging.getLogger(__name__)

#: Pulls range from a ready batch (sub-millisecond) to a long poll that waited its whole linger.
PULL_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: In-process actions take microseconds; I/O actions hand their job over (``ASYNC``) just as fast.
ACTION_BUCKETS: Final = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
#: Upper bounds of the key-chain length histogram.
CHAIN_BUCKETS: Final = (1, 2, 4, 8, 16, 64, 256)

#: BufferStats field -> (metric name without ``_total``, help).
_BUFFER_COUNTERS: Final = {
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
assert set(_BUFFER_COUNTERS) == {f.name for f in fields(BufferStats)}, "every BufferStats field is exported"

_QUEUE = ["group", "topic", "qid"]
_TOPIC = ["group", "topic"]


class ProxyMetrics:
    """The registry a service's ``/metrics`` renders: the engine collector plus two histograms."""

    def __init__(
        self, groups: GroupRegistry, counters: Counter[str], server_stats: Callable[[], dict[str, dict[str, int]]]
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.pull_seconds = Histogram(
            "ddmq_pull_duration_seconds",
            "Duration of pull calls (Thrift and HTTP), from the call to its answer, long-poll wait included.",
            ["group", "result"],
            buckets=PULL_BUCKETS,
            registry=self.registry,
        )
        #: (group, topic, action) -> durations; kept across consumer rebuilds so the counts only grow.
        self.action_seconds: dict[tuple[str, str, str], LatencyHistogram] = {}
        self.collector = EngineCollector(groups, counters, server_stats, self.action_seconds)
        self.registry.register(self.collector)
        # process_* (CPU, memory, open fds, start time) and python_info, as a default registry would have.
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._groups = groups
        self._pull_children: dict[tuple[str, bool], Callable[[float], None]] = {}

    def instrument(self, groups: Iterable[ConsumerGroup]) -> None:
        """Give every consumer that has none yet its action timers (idempotent; new consumers too)."""
        for group in groups:
            for consumer in group.consumers.values():
                if consumer.action_timers is None:
                    timers: list[Callable[[float], None]] = []
                    for name in _action_names(consumer):
                        key = (consumer.group, consumer.topic, name)
                        histogram = self.action_seconds.get(key)
                        if histogram is None:
                            histogram = self.action_seconds[key] = LatencyHistogram(ACTION_BUCKETS)
                        timers.append(histogram.observe)
                    consumer.action_timers = timers

    def observe_pull(self, group: str, batch: PullBatch, seconds: float) -> None:
        key = (group, bool(batch.messages))
        observe = self._pull_children.get(key)
        if observe is None:
            observe = self._pull_children[key] = self.pull_seconds.labels(
                group, "messages" if batch.messages else "empty"
            ).observe
        observe(seconds)

    async def refresh(self) -> None:
        """Read what the collector cannot read synchronously from Redis: produce offsets and the
        produce time of each held queue's first unfinished message (lag), dead-letter stream lengths
        and lease holders."""
        self.instrument(self._groups.groups.values())
        broker, redis = self._groups.broker, self._groups.redis
        if broker is None or redis is None:
            return
        produced: dict[str, list[int]] = {}
        oldest: dict[tuple[str, str, int], int] = {}
        topics: dict[tuple[str, str], int] = {}
        for group in self._groups.groups.values():
            for consumer in group.consumers.values():
                if not consumer.queues:
                    continue
                topics[group.name, consumer.topic] = consumer.queues
                try:
                    if consumer.topic not in produced:
                        produced[consumer.topic] = await broker.produce_offsets(consumer.topic, consumer.queues)
                    offsets = produced[consumer.topic]
                    behind = {
                        qid: tracker.commit_point
                        for qid, tracker in list(consumer.trackers.items())
                        if qid < len(offsets) and offsets[qid] > tracker.commit_point
                    }
                    times = await produce_times(redis, consumer.topic, behind)
                except DdmqError as exc:
                    log.warning("metrics: %s (lag gauges left out of this scrape)", exc)
                    continue
                oldest.update(((group.name, consumer.topic, qid), ms) for qid, ms in times.items())
        self.collector.produced = produced
        self.collector.oldest_ms = oldest
        try:
            self.collector.topics = await self._topic_figures(redis, topics)
        except DdmqError as exc:
            log.warning("metrics: %s (dead-letter and owner gauges left out of this scrape)", exc)
            self.collector.topics = {}

    @staticmethod
    async def _topic_figures(
        redis: AsyncRedis, topics: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], TopicFigures]:
        """(group, topic) -> dead letters in the stream, queues nobody holds the lease of."""
        if not topics:
            return {}
        # A cluster refuses EXISTS across slots, and each queue's lease has its own: one EXISTS each.
        per_key = isinstance(redis, RedisCluster)
        with map_redis_errors("reading dead-letter lengths and leases"):
            async with redis.pipeline(transaction=False) as pipe:
                for (group, topic), queues in topics.items():
                    pipe.xlen(key_names.dead_letters(group, topic))
                    leases = [key_names.lease(group, topic, qid) for qid in range(queues)]
                    for names in [[lease] for lease in leases] if per_key else [leases]:
                        pipe.exists(*names)
                replies = iter(await pipe.execute())
        figures = {}
        for key, queues in topics.items():
            dead = int(next(replies))
            held = sum(int(next(replies)) for _ in range(queues if per_key else 1))
            figures[key] = TopicFigures(dead, queues - held)
        return figures

    def render(self) -> bytes:
        """The registry in Prometheus' text format (runs in the event loop: reads engine state)."""
        return generate_latest(self.registry)


def _action_names(consumer: TopicConsumer) -> list[str]:
    names = list(consumer.config.actions)
    if len(names) != len(consumer.chain):  # a chain built another way: fall back to class names
        names = [type(action).__name__ for action in consumer.chain]
    return names


class LatencyHistogram:
    """Bucket counts and the sum of observed durations, for the chain's hot path.

    An observation is a bisect and two additions (about 0.2 µs here, against about 1 µs for a
    prometheus-client ``Histogram`` child, which takes a lock and scans its buckets); it runs once per
    action per message. Used from the event loop only. :class:`EngineCollector` exposes it through
    prometheus-client's ``HistogramMetricFamily``.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ending with ``+Inf``."""
        cumulative = list(accumulate(self.counts))
        pairs = [(str(float(bound)), float(count)) for bound, count in zip(self.bounds, cumulative, strict=False)]
        pairs.append(("+Inf", float(cumulative[-1])))
        return pairs


class TopicFigures(NamedTuple):
    dead_letters: int
    unowned_queues: int


class EngineCollector(Collector):
    """Reads the engine's counters and gauges at scrape time; costs nothing between scrapes."""

    def __init__(
        self,
        groups: GroupRegistry,
        counters: Counter[str],
        server_stats: Callable[[], dict[str, dict[str, int]]],
        actions: dict[tuple[str, str, str], LatencyHistogram],
    ) -> None:
        self._groups, self._counters, self._server_stats = groups, counters, server_stats
        self._actions = actions
        #: topic -> next produce offset per qid, set by :meth:`ProxyMetrics.refresh` before a scrape.
        self.produced: dict[str, list[int]] = {}
        #: (group, topic, qid) -> produce time of the held queue's first unfinished message, from refresh.
        self.oldest_ms: dict[tuple[str, str, int], int] = {}
        #: (group, topic) -> figures read from Redis by refresh.
        self.topics: dict[tuple[str, str], TopicFigures] = {}

    def collect(self) -> Iterator[Metric]:
        counters = {
            name: CounterMetricFamily(metric, doc, labels=_QUEUE) for name, (metric, doc) in _BUFFER_COUNTERS.items()
        }
        in_flight = GaugeMetricFamily("ddmq_messages_in_flight", "Pulled messages awaiting ack/fail.", labels=_QUEUE)
        ready = GaugeMetricFamily("ddmq_messages_ready", "Messages ready to be pulled.", labels=_QUEUE)
        retry_wait = GaugeMetricFamily(
            "ddmq_messages_retry_wait", "Failed messages waiting for their retry interval.", labels=_QUEUE
        )
        unfinished = GaugeMetricFamily(
            "ddmq_messages_unfinished",
            "Messages read from the queue and not finished yet (waiting behind their key, ready, in flight).",
            labels=_QUEUE,
        )
        owned = GaugeMetricFamily("ddmq_queue_owned", "1 for each queue this proxy holds the lease of.", labels=_QUEUE)
        committed = GaugeMetricFamily(
            "ddmq_consume_offset", "Next offset to commit (first unfinished message) per held queue.", labels=_QUEUE
        )
        produce = GaugeMetricFamily("ddmq_produce_offset", "Next offset to be produced per held queue.", labels=_QUEUE)
        lag = GaugeMetricFamily(
            "ddmq_lag_messages", "Produced but not yet finished messages per held queue.", labels=_QUEUE
        )
        rollbacks = CounterMetricFamily(
            "ddmq_queue_rollbacks",
            "Times this proxy found Redis had lost writes it had read under a queue (a rollback).",
            labels=_QUEUE,
        )
        age = GaugeMetricFamily(
            "ddmq_lag_seconds",
            "Age of the oldest unfinished message per held queue (now minus its produce time); 0 when caught up.",
            labels=_QUEUE,
        )
        dead_letters = GaugeMetricFamily(
            "ddmq_dead_letters", "Entries in the group's dead-letter stream for the topic now.", labels=_TOPIC
        )
        unowned = GaugeMetricFamily(
            "ddmq_queues_without_owner",
            "Queues of the topic whose lease nobody holds for the group (read from Redis by every proxy).",
            labels=_TOPIC,
        )
        keys = GaugeMetricFamily("ddmq_order_keys", "Order keys with an unfinished message.", labels=_TOPIC)
        waiting = GaugeMetricFamily(
            "ddmq_order_waiting_messages", "Messages waiting behind an unfinished one of the same key.", labels=_TOPIC
        )
        longest = GaugeMetricFamily(
            "ddmq_order_chain_length_max", "Unfinished messages of the busiest key.", labels=_TOPIC
        )
        chains = GaugeHistogramMetricFamily(
            "ddmq_order_chain_length", "Order keys by their number of unfinished messages.", labels=_TOPIC
        )
        topic_unfinished = GaugeMetricFamily(
            "ddmq_topic_unfinished_messages",
            "Unfinished messages per group and topic (capped by concurrency).",
            labels=_TOPIC,
        )
        concurrency = GaugeMetricFamily(
            "ddmq_topic_concurrency_limit", "The configured concurrency (most unfinished messages).", labels=_TOPIC
        )
        events = CounterMetricFamily(
            "ddmq_consumer_events",
            "Engine events per group and topic (read, filtered, json_invalid, ...).",
            labels=[*_TOPIC, "event"],
        )
        parked = GaugeMetricFamily("ddmq_parked_pulls", "Long-poll pulls waiting for messages.", labels=["group"])
        key_states = GaugeMetricFamily(
            "ddmq_keys", "Order keys with an unfinished message here, by state (parked, failing, in_flight, waiting).",
            labels=[*_TOPIC, "state"],
        )
        proxy_events = CounterMetricFamily(
            "ddmq_proxy_events",
            "Proxy-wide events (unknown_results: acks for unknown group/topic/qid).",
            labels=["event"],
        )

        now = now_ms()
        for (name, topic), figures in sorted(self.topics.items()):
            dead_letters.add_metric([name, topic], figures.dead_letters)
            unowned.add_metric([name, topic], figures.unowned_queues)
        for name, group in self._groups.groups.items():
            buffer = group.buffer
            for queue, stats in buffer.queue_stats.items():
                labels = [name, queue.topic, str(queue.qid)]
                for field_name, family in counters.items():
                    family.add_metric(labels, getattr(stats, field_name))
            states: Counter[tuple[QueueId, JobState]] = Counter((job.queue, job.state) for job in buffer.jobs())
            parked.add_metric([name], buffer.parked)
            for topic, consumer in group.consumers.items():
                for qid, tracker in list(consumer.trackers.items()):
                    queue = QueueId(topic, qid)
                    labels = [name, topic, str(qid)]
                    in_flight.add_metric(labels, states[queue, JobState.IN_FLIGHT])
                    ready.add_metric(labels, states[queue, JobState.READY])
                    retry_wait.add_metric(labels, states[queue, JobState.RETRY_WAIT])
                    unfinished.add_metric(labels, tracker.unfinished)
                    owned.add_metric(labels, 1 if qid in consumer.held else 0)
                    committed.add_metric(labels, tracker.commit_point)
                    offsets = self.produced.get(topic)
                    if offsets is not None and qid < len(offsets):
                        produce.add_metric(labels, offsets[qid])
                        lag.add_metric(labels, max(0, offsets[qid] - tracker.commit_point))
                        oldest = self.oldest_ms.get((name, topic, qid))
                        age.add_metric(labels, max(0, now - oldest) / 1000 if oldest is not None else 0.0)
                # Every held queue has the series (0 until a rollback), so increase() sees the first one.
                for qid in sorted(consumer.rollbacks.keys() | consumer.trackers.keys()):
                    rollbacks.add_metric([name, topic, str(qid)], consumer.rollbacks[qid])
                self._chains(consumer, [name, topic], keys, waiting, longest, chains)
                topic_unfinished.add_metric([name, topic], consumer.unfinished)
                for state, count in consumer.parking.counts().items():
                    key_states.add_metric([name, topic, state], count)
                concurrency.add_metric([name, topic], consumer.config.concurrency)
                for event, count in sorted(consumer.counters.items()):
                    events.add_metric([name, topic, event], count)
        for event, count in sorted(self._counters.items()):
            proxy_events.add_metric([event], count)

        actions = HistogramMetricFamily(
            "ddmq_action_duration_seconds",
            "Duration of one action call of the chain (an action answering ASYNC: until it took the job over).",
            labels=[*_TOPIC, "action"],
        )
        for (group_name, topic, action), histogram in sorted(self._actions.items()):
            actions.add_metric([group_name, topic, action], histogram.buckets(), histogram.total)

        yield from counters.values()
        yield from (in_flight, ready, retry_wait, unfinished, owned, committed, produce, lag, age, rollbacks)
        yield from (dead_letters, unowned)
        yield from (keys, waiting, longest, chains, topic_unfinished, concurrency, events, parked, proxy_events)
        yield key_states
        yield actions
        yield from _server_metrics(self._server_stats())

    @staticmethod
    def _chains(
        consumer: TopicConsumer,
        labels: list[str],
        keys: GaugeMetricFamily,
        waiting: GaugeMetricFamily,
        longest: GaugeMetricFamily,
        chains: GaugeHistogramMetricFamily,
    ) -> None:
        lengths = [consumer.blocking_queue.chain_length(key) for key, _ in consumer.blocking_queue.heads()]
        keys.add_metric(labels, len(lengths))
        waiting.add_metric(labels, sum(lengths) - len(lengths))
        longest.add_metric(labels, max(lengths, default=0))
        buckets = [(str(float(bound)), sum(1 for n in lengths if n <= bound)) for bound in CHAIN_BUCKETS]
        buckets.append(("+Inf", len(lengths)))
        chains.add_metric(labels, buckets, sum(lengths))


#: Server stats that are gauges; the others are counters (see ``ThriftServer.stats``).
_SERVER_GAUGES: Final = {
    "open": ("ddmq_server_connections", "Client connections open now."),
    "buffered_bytes": ("ddmq_server_buffered_bytes", "Request bytes being read or decoded now (max_buffered_bytes)."),
}


def _server_metrics(stats: dict[str, dict[str, int]]) -> Iterator[Metric]:
    events = CounterMetricFamily(
        "ddmq_server_events",
        "Connection events per server: accepted, refused (max_connections, every connection busy), evicted "
        "(closed to admit a new one at max_connections), not_allowed (allowed_clients), accept_errors (e.g. EMFILE), "
        "timeouts (idle or request), frames_rejected, decode_errors, too_large (early 413).",
        labels=["server", "event"],
    )
    gauges = {key: GaugeMetricFamily(name, doc, labels=["server"]) for key, (name, doc) in _SERVER_GAUGES.items()}
    for server, values in sorted(stats.items()):
        for key, value in sorted(values.items()):
            if key in gauges:
                gauges[key].add_metric([server], value)
            else:
                events.add_metric([server, key], value)
    yield events
    yield from gauges.values()
