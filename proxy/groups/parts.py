"""ProxyParts: what every consumer of one proxy shares, handed to each group and each topic's consumer.

Built once per proxy by the registry (:class:`~ddmq.proxy.groups.registry.GroupRegistry`), or by
:meth:`ProxyParts.of` for consumers run outside a service (the tests'): Redis, the lease store and its
settings, the member set, the upkeep that heartbeats and renews for every consumer, the one watcher of
key commands, the board of committers the service's committer flushes, and the read audit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddmq.config.schema import LeaseConfig
from ddmq.proxy.cluster.audit import ReadAudit
from ddmq.proxy.cluster.commits import CommitBoard
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.cluster.link_health import LinkHealth
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.cluster.upkeep import Upkeep
from ddmq.proxy.store.broker import Broker
from ddmq.proxy.store.key_commands import KeyCommandWatcher

__all__ = ["ProxyParts"]


@dataclass(frozen=True, eq=False)
class ProxyParts:
    broker: Broker
    leases: LeaseStore
    lease_config: LeaseConfig
    membership: Membership
    #: The heartbeats and renewals of every consumer (one task for the whole proxy).
    upkeep: Upkeep
    #: The key commands of every consumer, from one blocking read.
    key_watcher: KeyCommandWatcher
    #: Every topic's committer, by group (the service's committer flushes it).
    committers: CommitBoard = field(default_factory=CommitBoard)
    #: Each read batch, when ``audit_log`` is configured.
    read_audit: ReadAudit | None = None

    @classmethod
    def of(
        cls,
        broker: Broker,
        leases: LeaseStore,
        lease_config: LeaseConfig,
        membership: Membership,
        *,
        health: LinkHealth | None = None,
        read_audit: ReadAudit | None = None,
    ) -> ProxyParts:
        """The parts over these stores, with an upkeep and a key-command watcher of their own."""
        upkeep = Upkeep(leases, membership, lease_config, health)
        return cls(broker, leases, lease_config, membership, upkeep, KeyCommandWatcher(broker.redis),
                   read_audit=read_audit)
