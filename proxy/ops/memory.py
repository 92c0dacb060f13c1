"""Retention and Redis memory series for ``/metrics`` (docs/retention.md lists them).

The figures come from the service's trimmer (:class:`~ddmq.proxy.cluster.retention.Retention`), which
reads Redis memory and the topics' stream sizes every few seconds, and from each consumer's
``expired`` counter.
Memory and stream sizes describe the whole Redis, so every proxy reports the same value: aggregate
them with ``max``, not ``sum``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ddmq.proxy.cluster.retention import Retention
    from ddmq.proxy.groups.group import ConsumerGroup
    from ddmq.proxy.groups.registry import GroupRegistry


class RetentionCollector(Collector):
    """The series below, read from the service's groups and its trimmer when Prometheus scrapes."""

    def __init__(self, groups: GroupRegistry, retention: Callable[[], Retention | None]) -> None:
        self._groups = groups
        self._retention = retention

    def collect(self) -> Iterator[Metric]:
        return retention_metrics(self._groups.groups, self._retention(), self._groups.config.metrics.per_queue)


def retention_metrics(
    groups: Mapping[str, ConsumerGroup], retention: Retention | None, by_topic: bool = False
) -> Iterator[Metric]:
    """The series below; ``ddmq_messages_expired_total`` per (group, topic) with ``by_topic``
    (``metrics.per_queue``), else per group (as the engine's families, :mod:`~ddmq.proxy.ops.rollup`)."""
    yield _expired(groups, by_topic)
    if retention is None:
        return
    trimmed = CounterMetricFamily(
        "ddmq_retention_trimmed", "Entries this proxy's trimmer removed from the topic's queues.", labels=["topic"]
    )
    per_topic: dict[str, int] = {}
    for (topic, _), count in retention.trimmed.items():
        per_topic[topic] = per_topic.get(topic, 0) + count
    for topic, count in sorted(per_topic.items()):
        trimmed.add_metric([topic], count)
    held = GaugeMetricFamily(
        "ddmq_retention_held_messages",
        "Entries kept in Redis on account of the group that holds the consumed trim back (queues this "
        "proxy trims).",
        labels=["topic", "group"],
    )
    held_age = GaugeMetricFamily(
        "ddmq_retention_held_age_seconds",
        "Age of the oldest entry kept for the group that holds the consumed trim back.",
        labels=["topic", "group"],
    )
    sums: dict[tuple[str, str], tuple[int, int]] = {}
    for (topic, _), holder in retention.holders.items():
        count, oldest = sums.get((topic, holder.group), (0, 0))
        first = holder.oldest_ms if not oldest or (holder.oldest_ms and holder.oldest_ms < oldest) else oldest
        sums[topic, holder.group] = (count + holder.retained, first)
    now = int(time.time() * 1000)
    for (topic, group_name), (count, oldest) in sorted(sums.items()):
        held.add_metric([topic, group_name], count)
        held_age.add_metric([topic, group_name], max(0, now - oldest) / 1000 if oldest else 0.0)
    yield from (trimmed, held, held_age)
    entries = GaugeMetricFamily("ddmq_stream_entries", "Entries in Redis of the topic's queues.", labels=["topic"])
    size = GaugeMetricFamily(
        "ddmq_stream_memory_bytes", "Redis memory of the topic's queues (MEMORY USAGE, sampled).", labels=["topic"]
    )
    for topic, stream in sorted(retention.sizes.items()):
        entries.add_metric([topic], stream.entries)
        size.add_metric([topic], stream.bytes)
    yield from (entries, size)
    if retention.memory is not None:
        yield GaugeMetricFamily("ddmq_redis_used_memory_bytes", "Redis used_memory (summed over cluster masters).",
                                value=retention.memory.used_bytes)
        yield GaugeMetricFamily("ddmq_redis_maxmemory_bytes", "Redis maxmemory (0: no limit).",
                                value=retention.memory.max_bytes)


def _expired(groups: Mapping[str, ConsumerGroup], by_topic: bool) -> CounterMetricFamily:
    expired = CounterMetricFamily(
        "ddmq_messages_expired",
        "Messages a group never received: trimmed from Redis (retention cap, idle group, producer maxlen) "
        "before it read them.",
        labels=["group", "topic"] if by_topic else ["group"],
    )
    for name, group in sorted(groups.items()):
        counts = {topic: sum(consumer.expired.values()) for topic, consumer in sorted(group.consumers.items())}
        if by_topic:
            for topic, count in counts.items():
                expired.add_metric([name, topic], count)
        else:  # the series exists from the group's start (0 until a loss): increase() sees the first one
            expired.add_metric([name], sum(counts.values()))
    return expired
