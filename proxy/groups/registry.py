"""GroupRegistry: the running consumer groups of one proxy, and the one place that builds, starts,
replaces and retires them, at start-up (:meth:`GroupRegistry.start`) and on a config reload
(:meth:`GroupRegistry.apply`) alike.

What a reload changes live is consumption, the ``groups`` and ``topics`` sections, per (group, topic)
(:func:`~ddmq.proxy.groups.changes.diff`):

- *added*: a ``TopicConsumer`` starts (a new group gets its pull buffer first);
- *removed*: the consumer stops reading and handing out at once, and pulls for it get "unknown
  group" (1001) or "unknown topic" (1002); clients have ``leases.handoff_drain_ms`` to ack what they
  hold (those acks still count), then its offsets are committed and its leases released, and a
  removed group leaves its member set. Parked long polls of a removed group are answered empty;
- *changed* only in :data:`~ddmq.proxy.groups.changes.IN_PLACE_FIELDS`: the running consumer takes
  the new settings;
- *changed* otherwise (actions, order key, ...): the running consumer retires as if removed, then a
  new one with the new settings resumes from the committed offsets. Pulls for the topic stay valid
  meanwhile; they just wait.

What was read but not finished when a consumer retires stays uncommitted, so it is delivered again
(each key in order) by the next consumer of its queue: nothing is lost. A new topic in ``topics`` is
created in Redis; a different queue count for an existing topic is refused (it would move keys to
other queues). The ``metrics`` section is taken over as it is (the next scrape reads it). A config
that cannot be applied raises :class:`ConfigError` before anything changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

from ddmq.config.schema import ProxyConfig, TopicGroupConfig
from ddmq.protocol.redis.connection import AsyncRedis
from ddmq.protocol.redis.queues import ProduceError, TopicMismatchError, ensure_topic
from ddmq.proxy.cluster.audit import ReadAudit
from ddmq.proxy.cluster.commits import CommitBoard
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.cluster.link_health import LinkHealth
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.cluster.upkeep import Upkeep
from ddmq.proxy.core.errors import BrokerError, ConfigError, UnknownGroupError
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.replays import ReplayLeases
from ddmq.proxy.groups.changes import ConfigChange, diff
from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer
from ddmq.proxy.groups.parts import ProxyParts
from ddmq.proxy.store.broker import Broker
from ddmq.proxy.store.key_commands import KeyCommandWatcher

log = logging.getLogger(__name__)

#: The ack deadline assumed for a group or topic this proxy no longer serves (the config's default).
DEFAULT_ACK_TIMEOUT_MS = 5000


class GroupRegistry:
    """The groups of ``config`` (its live sections change with :meth:`apply`); Redis and the lease
    stores are given at :meth:`start`, and with them every group gets the parts all consumers share
    (:class:`~ddmq.proxy.groups.parts.ProxyParts`: the read audit, ``audit_log``, among them)."""

    def __init__(self, config: ProxyConfig, read_audit: ReadAudit | None = None) -> None:
        #: The config in force: the process-level fields as started, the live sections (``groups``, ``topics``,
        #: ``metrics``) as last applied.
        self.config = config
        self.read_audit = read_audit
        self.groups: dict[str, ConsumerGroup] = {}
        #: Per group: its replay leases (Spark's replayable pulls).
        self.replays: dict[str, ReplayLeases] = {}
        #: Where the groups' Redis is (the embedded server's URL once started, when ``redis: embedded``).
        self.redis_url = config.redis
        self.redis: AsyncRedis | None = None
        self.broker: Broker | None = None
        self.leases: LeaseStore | None = None
        self.membership: Membership | None = None
        #: The heartbeats and renewals of every consumer (one task for the whole proxy).
        self.upkeep: Upkeep | None = None
        #: The state of the link to Redis, as the upkeep finds it (the service names the Redis).
        self.health: LinkHealth | None = None
        #: The key commands of every consumer, from one blocking read.
        self.key_watcher: KeyCommandWatcher | None = None
        #: Every topic's committer, by group: what the service's committer flushes.
        self.commit_board = CommitBoard()
        #: What every consumer shares (built with the first group, once Redis is there).
        self._parts: ProxyParts | None = None

    # building --------------------------------------------------------------------------------

    async def start(
        self, redis_url: str, redis: AsyncRedis, broker: Broker, leases: LeaseStore, membership: Membership
    ) -> None:
        """Create the config's topics in Redis (at ``redis_url``, which ``redis`` is connected to), then
        build and start every group."""
        self.redis_url = redis_url
        self.redis, self.broker, self.leases, self.membership = redis, broker, leases, membership
        await self._ensure_topics(self.config, self.config.topics)
        for name, topics in self.config.groups.items():
            self._adopt(self._build(name, topics))

    def _build(self, name: str, topics: dict[str, TopicGroupConfig]) -> ConsumerGroup:
        if self._parts is None:
            assert self.broker is not None and self.leases is not None and self.membership is not None
            self.upkeep = Upkeep(self.leases, self.membership, self.config.leases, self.health)
            self.key_watcher = KeyCommandWatcher(self.broker.redis)
            self._parts = ProxyParts(self.broker, self.leases, self.config.leases, self.membership, self.upkeep,
                                     self.key_watcher, self.commit_board, self.read_audit)
        return ConsumerGroup(name, topics, self._parts)

    def _adopt(self, group: ConsumerGroup) -> None:
        """Register and start a built group."""
        self.groups[group.name] = group
        group.start()

    async def _ensure_topics(self, config: ProxyConfig, topics: Iterable[str]) -> None:
        assert self.redis is not None
        for topic in topics:
            try:
                await ensure_topic(self.redis, topic, config.topics[topic].queues)
            except TopicMismatchError as exc:
                raise ConfigError(f"topics.{topic}.queues: {exc}") from exc
            except ProduceError as exc:
                raise BrokerError(str(exc)) from exc

    async def apply(self, new: ProxyConfig) -> ConfigChange:
        """Apply ``new``'s groups and topics (the caller serialises reloads); other changed fields are
        logged and keep their running values. Returns once every removed or restarted consumer drained."""
        old, groups = self.config, self.groups
        change = diff(old, new)
        for name in change.needs_restart:
            log.warning("config reload: %r changed, which needs a restart; the running value stays", name)

        # Build everything first: a failure here leaves the running proxy untouched.
        added_groups = sorted({g for g, _ in change.added} - groups.keys())
        new_groups = [self._build(name, new.groups[name]) for name in added_groups]
        new_consumers: list[tuple[ConsumerGroup, TopicConsumer]] = []
        for group_name, topic in change.added:
            if group_name in groups:
                group = groups[group_name]
                new_consumers.append((group, group.make_consumer(topic, new.groups[group_name][topic])))
        replacements = [
            (groups[g], groups[g].make_consumer(topic, new.groups[g][topic])) for g, topic in change.restarted
        ]
        await self._ensure_topics(new, change.topics)

        # Apply. The process-level fields keep their running values.
        self.config = old.model_copy(update={"groups": new.groups, "topics": new.topics, "metrics": new.metrics})
        drains: list[Coroutine[Any, Any, None]] = []
        drains += [groups[name].retire() for name in sorted({g for g, _ in change.removed} - new.groups.keys())]
        drains += [groups[g].remove_topic(topic) for g, topic in change.removed if g in new.groups]
        for group_name, topic in change.updated:
            groups[group_name].consumers[topic].reconfigure(new.groups[group_name][topic])
        for group in new_groups:
            self._adopt(group)
        for group, consumer in new_consumers:
            group.add_topic(consumer)
        drains += [group.replace_topic(consumer) for group, consumer in replacements]
        for outcome in await asyncio.gather(*drains, return_exceptions=True):
            if isinstance(outcome, BaseException):
                log.error("config reload: stopping a consumer failed", exc_info=outcome)
        for group_name in [name for name, group in groups.items() if group.removed]:
            del groups[group_name]
        log.info("config reloaded: %s", change.describe())
        return change

    # lookups ---------------------------------------------------------------------------------

    def group(self, name: str, draining: bool = False) -> ConsumerGroup:
        """The group ``name``; a removed group is unknown, unless ``draining`` (it still takes acks)."""
        group = self.groups.get(name)
        if group is None or (group.removed and not draining):
            serves = sorted(n for n, g in self.groups.items() if not g.removed)
            raise UnknownGroupError(f"unknown group {name!r}; this proxy serves {serves}")
        return group

    def results_buffer(self, group: str, topic: str, qid: int) -> PullBuffer | None:
        """The pull buffer that takes results for queue ``qid`` of ``topic`` in ``group`` (also while a
        reload drains the group or the topic: acks still count); None when this proxy serves no such
        queue."""
        found = self.groups.get(group)
        if found is None:
            return None
        consumer = found.consumers.get(topic) or found.retiring.get(topic)
        if consumer is None or not 0 <= qid < max(consumer.queues, 1):
            return None
        return found.buffer

    def replay_leases(self, group: ConsumerGroup) -> ReplayLeases:
        replays = self.replays.get(group.name)
        if replays is None:
            replays = self.replays[group.name] = ReplayLeases(group.buffer, group.broker, group.commits_of)
        return replays

    def ack_timeout_ms(self, group: str, topic: str) -> int:
        consumer = self.groups[group].consumers.get(topic) if group in self.groups else None
        return consumer.config.timeout_ms if consumer is not None else DEFAULT_ACK_TIMEOUT_MS

    def in_flight(self) -> bool:
        return any(g.buffer.in_flight for g in self.groups.values())

    # stopping --------------------------------------------------------------------------------

    async def stop_reading(self) -> None:
        await asyncio.gather(*(g.stop_reading() for g in self.groups.values()))

    async def hand_off_all(self, drain_ms: int) -> None:
        """Stopping, reads stopped: every group leaves its member set and hands each queue over as soon
        as that queue's messages in flight are settled (within ``drain_ms``), so the other proxies take
        them within a heartbeat instead of after the whole grace period."""
        await asyncio.gather(*(g.hand_off_all(drain_ms) for g in self.groups.values()), return_exceptions=True)

    async def release_leases(self) -> None:
        """Free the queues now rather than letting the leases expire: a successor starts at once."""
        await asyncio.gather(*(g.release_leases() for g in self.groups.values()), return_exceptions=True)

    async def close(self) -> None:
        await asyncio.gather(*(g.close() for g in self.groups.values()), return_exceptions=True)
        if self.upkeep is not None:
            await self.upkeep.close()
        if self.key_watcher is not None:
            await self.key_watcher.close()


class OverRegistry:
    """Read access to a registry's running state, for what is built around one (the service, the
    HTTP server's view of the proxy)."""

    registry: GroupRegistry

    @property
    def config(self) -> ProxyConfig:
        """The config in force (``groups``, ``topics`` and ``metrics`` as last reloaded)."""
        return self.registry.config

    @property
    def groups(self) -> dict[str, ConsumerGroup]:
        return self.registry.groups

    @property
    def redis(self) -> AsyncRedis | None:
        return self.registry.redis
