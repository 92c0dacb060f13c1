"""Live configuration: apply a changed config file to a running proxy, without a restart.

What changes live is consumption: the ``groups`` and ``topics`` sections. The new config is compared
with the running one per (group, topic):

- *added*: a ``TopicConsumer`` starts (a new group gets its pull buffer first);
- *removed*: the consumer stops reading and handing out at once, and pulls for it get "unknown
  group" (1001) or "unknown topic" (1002); clients have ``leases.handoff_drain_ms`` to ack what they
  hold (those acks still count), then its offsets are committed and its leases released, and a
  removed group leaves its member set. Parked long polls of a removed group are answered empty;
- *changed* only in :data:`IN_PLACE_FIELDS`: the running consumer takes the new settings;
- *changed* otherwise (actions, order key, ...): the running consumer retires as if removed, then a
  new one with the new settings resumes from the committed offsets. Pulls for the topic stay valid
  meanwhile; they just wait.

What was read but not finished when a consumer retires stays uncommitted, so it is delivered again
(each key in order) by the next consumer of its queue: nothing is lost.

A new topic in ``topics`` is created in Redis. A different queue count for an existing topic is
refused (it would move keys to other queues). Every other top-level field belongs to the process
(Redis, listeners, leases, instance id, intervals): a change is logged and ignored until a restart.

An invalid file never gets here (:func:`ddmq.config.load` rejects it); a config that cannot be
applied raises :class:`ConfigError` before anything changed. Either way the running config stays.

>>> reloader = ConfigReloader(service, "proxy.yaml")
>>> reloader.start()
>>> loop.add_signal_handler(signal.SIGHUP, reloader.request)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ddmq.config.loader import load
from ddmq.config.schema import ProxyConfig, TopicGroupConfig
from ddmq.protocol.queues import ProduceError, TopicMismatchError, ensure_topic
from ddmq.proxy.core.errors import BrokerError, ConfigError, DdmqError
from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from typing import Any

    from ddmq.proxy.service import ProxyService

log = logging.getLogger(__name__)

#: Settings of a (group, topic) a running consumer takes over in place: the engine reads them as it
#: goes (per read batch, per delivery, per failure). A change to any other setting restarts the consumer.
IN_PLACE_FIELDS: frozenset[str] = frozenset(
    {
        "concurrency",
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

#: Top-level sections that change live; every other one needs a restart.
LIVE_SECTIONS: frozenset[str] = frozenset({"groups", "topics"})

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

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.restarted or self.updated or self.topics)

    def describe(self) -> str:
        if self.empty:
            return "no change to groups or topics"
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
    )


def changed_fields(old: TopicGroupConfig, new: TopicGroupConfig) -> set[str]:
    return {name for name in TopicGroupConfig.model_fields if getattr(old, name) != getattr(new, name)}


async def apply_config(service: ProxyService, new: ProxyConfig) -> ConfigChange:
    """Apply ``new`` to the running ``service`` (call through :meth:`ProxyService.reload`, which
    serialises reloads). Returns once every removed or restarted consumer has drained."""
    old = service.config
    change = diff(old, new)
    for name in change.needs_restart:
        log.warning("config reload: %r changed, which needs a restart; the running value stays", name)
    broker, leases, membership, redis = service.broker, service.leases, service.membership, service.redis
    assert broker is not None and leases is not None and membership is not None and redis is not None
    groups = service.groups

    # Build everything first: a failure here leaves the running proxy untouched.
    new_groups: list[ConsumerGroup] = []
    new_consumers: list[tuple[ConsumerGroup, TopicConsumer]] = []
    replacements: list[tuple[ConsumerGroup, TopicConsumer]] = []
    for name in sorted({g for g, _ in change.added} - groups.keys()):
        new_groups.append(ConsumerGroup(name, new.groups[name], broker, leases, old.leases, membership))
    for group_name, topic in change.added:
        if group_name in groups:
            group = groups[group_name]
            new_consumers.append((group, group.make_consumer(topic, new.groups[group_name][topic])))
    for group_name, topic in change.restarted:
        group = groups[group_name]
        replacements.append((group, group.make_consumer(topic, new.groups[group_name][topic])))
    for topic in change.topics:
        try:
            await ensure_topic(redis, topic, new.topics[topic].queues)
        except TopicMismatchError as exc:
            raise ConfigError(f"topics.{topic}.queues: {exc}") from exc
        except ProduceError as exc:
            raise BrokerError(str(exc)) from exc

    # Apply. The process-level fields keep their running values.
    service.config = old.model_copy(update={"groups": new.groups, "topics": new.topics})
    drains: list[Coroutine[Any, Any, None]] = []
    for group_name in sorted({g for g, _ in change.removed} - new.groups.keys()):
        drains.append(groups[group_name].retire())
    for group_name, topic in change.removed:
        if group_name in new.groups:
            drains.append(groups[group_name].remove_topic(topic))
    for group_name, topic in change.updated:
        groups[group_name].consumers[topic].reconfigure(new.groups[group_name][topic])
    for group in new_groups:
        group.read_audit = service.read_audit
        for consumer in group.consumers.values():
            consumer.read_audit = service.read_audit
        groups[group.name] = group
        group.start()
    for group, consumer in new_consumers:
        group.add_topic(consumer)
    for group, consumer in replacements:
        drains.append(group.replace_topic(consumer))
    for outcome in await asyncio.gather(*drains, return_exceptions=True):
        if isinstance(outcome, BaseException):
            log.error("config reload: stopping a consumer failed", exc_info=outcome)
    for group_name in [name for name, group in groups.items() if group.removed]:
        del groups[group_name]
    log.info("config reloaded: %s", change.describe())
    return change


class ConfigReloader:
    """Reloads the config file into the service on :meth:`request` (the CLI wires SIGHUP to it) and,
    with ``watch_interval_ms`` > 0, whenever the file's content changes. Reloads run one at a time;
    requests arriving meanwhile are merged into one more reload."""

    def __init__(self, service: ProxyService, path: str | Path, watch_interval_ms: int = 0) -> None:
        self._service = service
        self._path = Path(path)
        self._watch_s = watch_interval_ms / 1000
        self._requested = asyncio.Event()
        self._digest = self._read_digest()
        self._tasks: list[asyncio.Task[None]] = []
        self._current: asyncio.Task[ConfigChange | None] | None = None

    def start(self) -> None:
        if self._tasks:
            raise RuntimeError("ConfigReloader already started")
        self._tasks.append(asyncio.create_task(self._serve_requests(), name="config-reload"))
        if self._watch_s > 0:
            self._tasks.append(asyncio.create_task(self._watch(), name="config-watch"))

    async def close(self) -> None:
        """Stop watching and serving requests; a reload under way is finished, not cut short."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._current is not None:
            await asyncio.gather(self._current, return_exceptions=True)

    def request(self) -> None:
        """Ask for a reload (safe from a signal handler installed with ``loop.add_signal_handler``)."""
        self._requested.set()

    async def reload(self) -> ConfigChange | None:
        """Load the file and apply it now; None when it was rejected (the reason is logged)."""
        self._digest = self._read_digest()
        try:
            config = load(self._path)
            return await self._service.reload(config)
        except DdmqError as exc:
            log.error("config reload rejected; the running config stays in force: %s", exc)
            return None

    async def _serve_requests(self) -> None:
        while True:
            await self._requested.wait()
            self._requested.clear()
            # Shielded: a half-applied reload would leave consumers half retired.
            self._current = asyncio.create_task(self.reload(), name="config-reload-apply")
            try:
                await asyncio.shield(self._current)
            except Exception:  # a bug must not end reloading for the life of the process
                log.exception("config reload failed")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._watch_s)
            digest = self._read_digest()
            if digest is not None and digest != self._digest:
                log.info("%s changed; reloading", self._path)
                self._digest = digest
                self.request()

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self._path.read_bytes()).digest()
        except OSError:
            return None
