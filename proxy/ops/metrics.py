"""ProxyMetrics: the proxy's Prometheus metrics, in one private registry per service.

The engine keeps its own plain counters; :class:`~ddmq.proxy.ops.collector.EngineCollector` reads them
when Prometheus scrapes (a few families per (group, topic) and the rest per group or per proxy by
default, per queue with ``metrics.per_queue``). Only two histograms are observed as the proxy works,
into :class:`LatencyHistogram` accumulators the collector exports: the duration of each pull call (one
observation per pull, not per message, into :attr:`ProxyMetrics.pull_timers`, whose ``observe`` the
request surface calls) and of each action call of the chain. What the collector cannot read
synchronously (produce offsets, produce times, dead-letter lengths, leases) :meth:`ProxyMetrics.refresh`
reads from Redis just before a scrape.

>>> metrics = ProxyMetrics(registry, counters, server_stats)
>>> await metrics.refresh()          # reads produce offsets from Redis, for the lag gauges
>>> body = metrics.render()          # Prometheus text format
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector, generate_latest
from prometheus_client.registry import Collector
from redis.asyncio.cluster import RedisCluster

from ddmq.protocol.redis import keys as key_names
from ddmq.protocol.redis.connection import AsyncRedis, eval_scripts
from ddmq.protocol.redis.scripts import TOPIC_COUNTS_LUA
from ddmq.proxy.core.errors import BrokerError, DdmqError
from ddmq.proxy.ops.collector import EngineCollector
from ddmq.proxy.ops.exposition import render
from ddmq.proxy.ops.families import TopicFigures
from ddmq.proxy.ops.lag import Position, produce_times_at
from ddmq.proxy.ops.latency import LatencyHistogram, PullTimers
from ddmq.proxy.store.broker import Broker

if TYPE_CHECKING:
    from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer
    from ddmq.proxy.groups.registry import GroupRegistry

__all__ = ["ACTION_BUCKETS", "PULL_BUCKETS", "LatencyHistogram", "ProxyMetrics"]

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


class ProxyMetrics:
    """The registry a service's ``/metrics`` renders: the engine collector (with the two histograms'
    figures) and the process collectors.

    :attr:`registry` holds everything, for whatever reads a prometheus-client registry. :meth:`render`
    writes the engine's families itself (:func:`~ddmq.proxy.ops.exposition.render`: they are nearly all
    of a big proxy's series) and the others (:attr:`others`, which :meth:`register` adds to) through
    prometheus-client."""

    def __init__(
        self, groups: GroupRegistry, counters: Counter[str], server_stats: Callable[[], dict[str, dict[str, int]]]
    ) -> None:
        #: Every collector but the engine's.
        self.others = CollectorRegistry(auto_describe=False)
        #: (group, result) -> durations of pull calls, ``result`` ``messages`` or ``empty``.
        self.pull_timers = PullTimers(PULL_BUCKETS)
        self.pull_seconds = self.pull_timers.histograms
        #: (group, topic, action) -> durations; kept across consumer rebuilds so the counts only grow.
        self.action_seconds: dict[tuple[str, str, str], LatencyHistogram] = {}
        self.collector = EngineCollector(groups, counters, server_stats, self.action_seconds, self.pull_seconds)
        # process_* (CPU, memory, open fds, start time) and python_info, as a default registry would have.
        ProcessCollector(registry=self.others)
        PlatformCollector(registry=self.others)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.registry.register(self.others)
        self._groups = groups
        #: The produce times the last refresh found, by (topic, qid, offset).
        self._times: dict[Position, int] = {}

    def register(self, collector: Collector) -> None:
        """Add ``collector``'s series to ``/metrics``."""
        self.others.register(collector)

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

    async def refresh(self) -> None:
        """Read what the collector cannot read synchronously from Redis: produce offsets and the
        produce time of each held queue's first unfinished message (lag), dead-letter stream lengths
        and lease holders. A few round trips whatever the number of queues, made at once: one per
        topic for the offsets, then one pipeline for the produce times not known from the last scrape;
        meanwhile one for the dead letters and leases."""
        self.instrument(self._groups.groups.values())
        broker, redis = self._groups.broker, self._groups.redis
        if broker is None or redis is None:
            return
        consumers = [(group.name, consumer) for group in self._groups.groups.values()
                     for consumer in group.consumers.values() if consumer.queues]
        topics = {(group, consumer.topic): consumer.queues for group, consumer in consumers}
        (produced, oldest), figures = await asyncio.gather(
            self._lag(broker, redis, consumers), self._redis_figures(redis, topics)
        )
        self.collector.produced, self.collector.oldest_ms, self.collector.topics = produced, oldest, figures

    async def _lag(
        self, broker: Broker, redis: AsyncRedis, consumers: list[tuple[str, TopicConsumer]]
    ) -> tuple[dict[str, list[int]], dict[tuple[str, str, int], int]]:
        """Topic -> next produce offset per qid, and (group, topic, qid) -> produce time of the held
        queue's first unfinished message; neither (and a warning) when Redis fails."""
        queues = {consumer.topic: consumer.queues for _, consumer in consumers}
        behind: dict[tuple[str, str, int], int] = {}
        try:
            offsets = await asyncio.gather(*(broker.produce_offsets(topic, count) for topic, count in queues.items()))
            produced = dict(zip(queues, offsets, strict=True))
            for group, consumer in consumers:
                topic, next_offsets = consumer.topic, produced[consumer.topic]
                for qid, tracker in consumer.trackers.items():
                    at = tracker.commit_point
                    if qid < len(next_offsets) and next_offsets[qid] > at:
                        behind[group, topic, qid] = at
            positions = {(topic, qid, at) for (_, topic, qid), at in behind.items()}
            # The entry at an offset keeps its produce time: a queue whose commit point has not moved
            # since the last scrape (a stuck or slow one) costs no read.
            times = {position: self._times[position] for position in positions & self._times.keys()}
            times.update(await produce_times_at(redis, positions - times.keys()))
            self._times = times
        except DdmqError as exc:
            log.warning("metrics: %s (lag gauges left out of this scrape)", exc)
            return {}, {}
        oldest = {}
        for (group, topic, qid), at in behind.items():
            ms = times.get((topic, qid, at))
            if ms is not None:
                oldest[group, topic, qid] = ms
        return produced, oldest

    async def _redis_figures(
        self, redis: AsyncRedis, topics: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], TopicFigures]:
        try:
            return await self._topic_figures(redis, topics)
        except DdmqError as exc:
            log.warning("metrics: %s (dead-letter and owner gauges left out of this scrape)", exc)
            return {}

    @staticmethod
    async def _topic_figures(
        redis: AsyncRedis, topics: dict[tuple[str, str], int]
    ) -> dict[tuple[str, str], TopicFigures]:
        """(group, topic) -> dead letters in the stream, queues nobody holds the lease of."""
        if not topics:
            return {}
        if isinstance(redis, RedisCluster):
            counts = await _topic_counts_per_key(redis, topics)
        else:
            counts = await _topic_counts_scripted(redis, topics)
        return {key: TopicFigures(dead, queues - held)
                for (key, queues), (dead, held) in zip(topics.items(), counts, strict=True)}

    def render(self) -> bytes:
        """The registry in Prometheus' text format (runs in the event loop: reads engine state), what
        ``generate_latest(self.registry)`` writes."""
        return render(self.collector.families()).encode() + generate_latest(self.others)


#: (group, topic) pairs per script call: a call's keys stay in the thousands.
TOPIC_COUNTS_PER_CALL: Final = 100


async def _topic_counts_scripted(
    redis: AsyncRedis, topics: dict[tuple[str, str], int]
) -> list[tuple[int, int]]:
    """(dead letters, leases held) per pair of ``topics``, in its order, on a single Redis."""
    pairs = list(topics.items())
    calls: list[tuple[str, list[str], list[Any]]] = []
    for start in range(0, len(pairs), TOPIC_COUNTS_PER_CALL):
        names: list[str] = []
        counts: list[Any] = []
        for (group, topic), queues in pairs[start:start + TOPIC_COUNTS_PER_CALL]:
            names.append(key_names.dead_letters(group, topic))
            names += [key_names.lease(group, topic, qid) for qid in range(queues)]
            counts.append(queues)
        calls.append((TOPIC_COUNTS_LUA, names, counts))
    out: list[tuple[int, int]] = []
    for reply in await eval_scripts(redis, calls):
        if isinstance(reply, Exception):  # a call's error reply, handed back as a value
            raise BrokerError(f"redis failed on a dead-letter and lease count: {reply}") from reply
        out += zip(map(int, reply[::2]), map(int, reply[1::2]), strict=True)
    return out


async def _topic_counts_per_key(
    redis: AsyncRedis, topics: dict[tuple[str, str], int]
) -> list[tuple[int, int]]:
    """The same on a Cluster, which refuses a script's or an ``EXISTS``'s keys across slots, and each
    queue's lease has its own: an ``XLEN`` and an ``EXISTS`` per lease, in one pipeline."""
    async with redis.pipeline(transaction=False) as pipe:
        for (group, topic), queues in topics.items():
            pipe.xlen(key_names.dead_letters(group, topic))
            for qid in range(queues):
                pipe.exists(key_names.lease(group, topic, qid))
        replies = iter(await pipe.execute())
    return [(int(next(replies)), sum(int(next(replies)) for _ in range(queues))) for queues in topics.values()]


def _action_names(consumer: TopicConsumer) -> list[str]:
    names = list(consumer.config.actions)
    if len(names) != len(consumer.chain):  # a chain built another way: fall back to class names
        names = [type(action).__name__ for action in consumer.chain]
    return names


