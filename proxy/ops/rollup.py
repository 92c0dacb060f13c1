"""The label set of each engine family in the default mode, and :class:`TopicRows`, which makes it.

With ``metrics.per_queue`` the engine's families keep their finest labels: the queue-level ones per
(group, topic, qid), the others per (group, topic). By default a scrape must stay small at thousands
of queues and a thousand (group, topic) pairs, so only what an operator follows per topic keeps the
``topic`` label (:data:`PER_TOPIC`: the backlog and its age, the messages delivered, acked, failed and
dead-lettered, those in flight: what the dashboard and the alert rules read per topic); the rest is
summed per group, and a distribution (a series per bucket) and the counters of ignored client verbs
(:data:`PER_PROXY`) per proxy. The latency histograms (pull and action durations) are made per proxy
by their own code (:class:`~ddmq.proxy.ops.collector.EngineCollector`). A family
keeps its name and type in both modes; only its labels differ, and the default's are a subset of the
per-queue mode's, so a query that aggregates ``by`` the default's labels reads the same in both.

>>> keys = TopicRows([retarget(Family("ddmq_order_keys", GAUGE, "Keys.", ["group", "topic"]))])
>>> keys.add("g", "a", [1])
>>> keys.add("g", "b", [2])
>>> keys.done()[0].rows
[(('g',), 3)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ddmq.proxy.ops.exposition import COUNTER, GAUGE, Family

__all__ = ["MAXED", "PER_PROXY", "PER_TOPIC", "TopicRows", "default_labels", "retarget"]

#: Families (names without ``_total``) that keep the ``topic`` label by default.
PER_TOPIC: Final = frozenset({
    "ddmq_lag_messages",
    "ddmq_lag_seconds",
    "ddmq_messages_delivered",
    "ddmq_messages_acked",
    "ddmq_messages_failed",
    "ddmq_messages_dead_lettered",
    "ddmq_messages_in_flight",
})
#: Families without ``group`` and ``topic`` by default: a distribution, whose every bucket is a series,
#: and the counters of what clients send that the proxy ignores or takes as a hint (rare, and about a
#: client, which ``per_queue`` or the log finds).
PER_PROXY: Final = frozenset({
    "ddmq_order_chain_length",
    "ddmq_fails_unknown",
    "ddmq_acks_late",
    "ddmq_messages_released",
    "ddmq_messages_extended",
    "ddmq_verbs_ignored",
})
#: Families whose figures are put together with ``max``, not summed: the age of the oldest message,
#: the longest key chain.
MAXED: Final = frozenset({"ddmq_lag_seconds", "ddmq_order_chain_length_max"})


def default_labels(name: str, labels: Sequence[str]) -> tuple[str, ...]:
    """The labels family ``name`` has by default, when it has ``labels`` per queue (or per topic)."""
    if "topic" not in labels or name in PER_TOPIC:
        return tuple(label for label in labels if label != "qid")
    dropped = {"qid", "topic", "group"} if name in PER_PROXY else {"qid", "topic"}
    return tuple(label for label in labels if label not in dropped)


def retarget(family: Family) -> Family:
    """An empty family like ``family`` (made with its finest labels) with its default labels."""
    return Family(family.name, family.kind, family.documentation, default_labels(family.name, family.labels))


class TopicRows:
    """Figures per (group, topic) of several plain families (a column each), written to each family
    at its own labels when :meth:`done`: per (group, topic) as they came, per group or per proxy
    added up by columns (the max for :data:`MAXED`). Summing a group's columns at once costs far less
    than a series per (group, topic) folded one by one: a scrape does this for every family at
    thousands of (group, topic) pairs."""

    def __init__(self, families: Sequence[Family]) -> None:
        for family in families:
            if family.kind not in (COUNTER, GAUGE) or family.labels not in (("group", "topic"), ("group",), ()):
                raise ValueError(f"{family.name}: not a plain family by (group, topic), group or proxy")
        self.families = list(families)
        self._groups: dict[str, dict[str, Sequence[float]]] = {}

    def add(self, group: str, topic: str, values: Sequence[float]) -> None:
        """The (group, topic)'s figure for each family, in the families' order."""
        self._groups.setdefault(group, {})[topic] = values

    def done(self) -> list[Family]:
        """The families, with every row added."""
        maxed = [family.name in MAXED for family in self.families]
        totals: list[list[float]] = []
        for group, topics in self._groups.items():
            columns = list(zip(*topics.values(), strict=True))
            sums = [max(column) if high else sum(column) for column, high in zip(columns, maxed, strict=True)]
            totals.append(sums)
            for at, family in enumerate(self.families):
                if len(family.labels) == 2:
                    family.rows += [((group, topic), values[at]) for topic, values in topics.items()]
                elif family.labels:
                    family.rows.append(((group,), sums[at]))
        for at, family in enumerate(self.families):
            if totals and not family.labels:
                column = [sums[at] for sums in totals]
                family.rows.append(((), max(column) if maxed[at] else sum(column)))
        return self.families
