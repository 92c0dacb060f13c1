"""What a new config changes in the running groups, per (group, topic): :func:`diff`, pure (nothing is
applied); :class:`~ddmq.proxy.groups.registry.GroupRegistry` applies the result.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddmq.config.schema import ProxyConfig, TopicGroupConfig

#: Settings of a (group, topic) a running consumer takes over in place: the engine reads them as it
#: goes (per read batch, per delivery, per failure). A change to any other setting restarts the consumer.
IN_PLACE_FIELDS: frozenset[str] = frozenset(
    {
        "concurrency",
        "key_buffer",
        "max_tps",
        "timeout_ms",
        "max_retry",
        "retry_intervals_ms",
        "max_retry_after_ms",
        "max_extensions",
        "max_pull_batch_size",
        "max_reply_bytes",
        "read_batch_size",
        "tags",
        "start_from",
    }
)

#: Top-level sections that change live; every other one needs a restart. ``metrics`` is read at each
#: scrape, so taking it over is all it needs.
LIVE_SECTIONS: frozenset[str] = frozenset({"groups", "topics", "metrics"})

Pair = tuple[str, str]


@dataclass(frozen=True)
class ConfigChange:
    """What a new config changes, per (group, topic) pair."""

    added: tuple[Pair, ...] = ()
    removed: tuple[Pair, ...] = ()
    restarted: tuple[Pair, ...] = ()
    updated: tuple[Pair, ...] = ()
    #: Entries of ``topics`` that are new or different (created or checked in Redis).
    topics: tuple[str, ...] = ()
    #: Top-level fields that differ but only take effect after a restart.
    needs_restart: tuple[str, ...] = ()
    #: The ``metrics`` section differs (it applies from the next scrape).
    metrics: bool = False

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.restarted or self.updated or self.topics or self.metrics)

    def describe(self) -> str:
        if self.empty:
            return "no change to groups, topics or metrics"
        parts = []
        for label, pairs in (
            ("added", self.added),
            ("removed", self.removed),
            ("restarted", self.restarted),
            ("updated in place", self.updated),
        ):
            if pairs:
                parts.append(f"{label} {', '.join(f'{g}/{t}' for g, t in pairs)}")
        if self.topics:
            parts.append(f"topics {', '.join(self.topics)}")
        if self.metrics:
            parts.append("metrics")
        return "; ".join(parts)


def diff(old: ProxyConfig, new: ProxyConfig) -> ConfigChange:
    """Compare two configs (pure: nothing is applied)."""
    added: list[Pair] = []
    removed: list[Pair] = []
    restarted: list[Pair] = []
    updated: list[Pair] = []
    for group in sorted(old.groups.keys() | new.groups.keys()):
        before, after = old.groups.get(group, {}), new.groups.get(group, {})
        for topic in sorted(before.keys() | after.keys()):
            pair = (group, topic)
            if topic not in after:
                removed.append(pair)
            elif topic not in before:
                added.append(pair)
            elif before[topic] != after[topic]:
                (updated if changed_fields(before[topic], after[topic]) <= IN_PLACE_FIELDS else restarted).append(pair)
    return ConfigChange(
        added=tuple(added),
        removed=tuple(removed),
        restarted=tuple(restarted),
        updated=tuple(updated),
        topics=tuple(sorted(t for t, c in new.topics.items() if old.topics.get(t) != c)),
        needs_restart=tuple(
            sorted(f for f in ProxyConfig.model_fields if f not in LIVE_SECTIONS and getattr(old, f) != getattr(new, f))
        ),
        metrics=old.metrics != new.metrics,
    )


def changed_fields(old: TopicGroupConfig, new: TopicGroupConfig) -> set[str]:
    return {name for name in TopicGroupConfig.model_fields if getattr(old, name) != getattr(new, name)}
