"""The label set of each engine family in the default mode, and :func:`fold`, which makes it.

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

>>> keys = Family("ddmq_keys", GAUGE, "Keys by state.", ["group", "topic", "state"])
>>> keys.add_metric(["g", "a", "parked"], 1)
>>> keys.add_metric(["g", "b", "parked"], 2)
>>> fold(keys, ("group", "state")).rows
[(('g', 'parked'), 3)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Final

from ddmq.proxy.ops.exposition import GAUGE, Buckets, Family

__all__ = ["MAXED", "PER_PROXY", "PER_TOPIC", "coarsen", "default_labels", "fold"]

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
#: Families folded with ``max``, not summed: the age of the oldest message, the longest key chain.
MAXED: Final = frozenset({"ddmq_lag_seconds", "ddmq_order_chain_length_max"})

Key = Callable[[tuple[str, ...]], tuple[str, ...]]


def default_labels(name: str, labels: Sequence[str]) -> tuple[str, ...]:
    """The labels family ``name`` has by default, when it has ``labels`` per queue (or per topic)."""
    if "topic" not in labels or name in PER_TOPIC:
        return tuple(label for label in labels if label != "qid")
    dropped = {"qid", "topic", "group"} if name in PER_PROXY else {"qid", "topic"}
    return tuple(label for label in labels if label not in dropped)


def coarsen(families: Sequence[Family]) -> list[Family]:
    """``families`` (series per (group, topic) at the finest) with the default mode's labels."""
    out = []
    for family in families:
        labels = default_labels(family.name, family.labels)
        out.append(family if labels == family.labels else fold(family, labels))
    return out


def fold(family: Family, labels: Sequence[str]) -> Family:
    """``family`` with only ``labels`` (a subset of its own, in their order there): the series that
    agree on them added up (their max for :data:`MAXED`; a histogram bucket by bucket)."""
    labels = tuple(labels)
    key = _key([family.labels.index(label) for label in labels])
    out = Family(family.name, family.kind, family.documentation, labels)
    if family.name in MAXED:
        if family.kind != GAUGE:
            raise ValueError(f"{family.name}: only a gauge folds with max")
        highest: dict[tuple[str, ...], float] = {}
        for values, value in family.rows:
            at = key(values)
            if at not in highest or value > highest[at]:
                highest[at] = value
        out.rows = list(highest.items())
        return out
    sums: dict[tuple[str, ...], float] = {}
    for values, value in family.rows:
        at = key(values)
        sums[at] = sums.get(at, 0) + value
    out.rows = list(sums.items())
    merged: dict[tuple[str, ...], tuple[list[str], list[float], float]] = {}
    for values, buckets, total in family.histograms:
        at = key(values)
        found = merged.get(at)
        if found is None:
            merged[at] = ([le for le, _ in buckets], [count for _, count in buckets], total)
            continue
        les, counts, so_far = found
        if [le for le, _ in buckets] != les:
            raise ValueError(f"{family.name}: histograms with different buckets cannot be added")
        merged[at] = (les, [mine + theirs for mine, (_, theirs) in zip(counts, buckets, strict=True)], so_far + total)
    out.histograms = [(at, _buckets(les, counts), total) for at, (les, counts, total) in merged.items()]
    return out


def _buckets(les: list[str], counts: list[float]) -> Buckets:
    return list(zip(les, counts, strict=True))


def _key(indices: list[int]) -> Key:
    """The label values at ``indices``, as a tuple (``itemgetter`` gives a bare value for one index)."""
    if indices == list(range(len(indices))):  # a prefix, the common case: a slice of the tuple
        return itemgetter(slice(0, len(indices)))
    if len(indices) > 1:
        return itemgetter(*indices)
    at = indices[0]
    return lambda values: (values[at],)
