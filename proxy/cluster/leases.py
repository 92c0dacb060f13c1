"""Queue leases: one proxy reads a (group, queue) at a time, and a stale owner cannot write.

A lease is the string ``"<owner> <term>"`` under :func:`keys.lease`, with a PX expiry. ``term`` comes
from a per-(group, queue) counter that only grows, so it is a fencing token: every write a lease
holder makes (offset commits) runs in a Lua script that first checks the holder still has *its*
term. A proxy that was paused past its lease and wakes up finds a newer term and writes nothing.

A lease that expired but that nobody took over (the term counter still shows our term) is still
ours: renewing it restores it, and commits go through, because no other proxy can have read the
queue in between. So a short stall costs nothing, and a real takeover always bumps the term.

Acquiring is allowed when the lease is free (missing or expired) or held by the same ``owner``: an
instance restarted under the same instance id reclaims its leases at once (with a new term, which
fences any leftover of its previous incarnation).

All keys of one queue share its Cluster hash tag, so each script touches a single slot. Every script
starts with :data:`~ddmq.protocol.redis.scripts.OOM_PASS_LUA`, so leases and commits keep working while Redis
is full and refuses producers.

Timing (defaults, see ``leases`` in the config): lease TTL 30 s, renewed every 10 s. Three renewals
fit in a TTL, so one slow or lost round trip never costs the lease; a crashed owner's queues move
after at most 30 s. (RocketMQ's broker lock uses 60 s / 20 s; we halve it because a proxy's queues
hold no state another proxy cannot rebuild from Redis.)
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from enum import IntEnum
from typing import Any, NamedTuple

from redis.asyncio.cluster import RedisCluster

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import AsyncRedis, eval_script, eval_scripts
from ddmq.protocol.redis.scripts import (
    LEASE_ACQUIRE_LUA,
    LEASE_COMMIT_LUA,
    LEASE_RELEASE_LUA,
    LEASE_RENEW_LUA,
    LEASE_RENEW_MANY_LUA,
)
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.store.broker import read_mark

log = logging.getLogger(__name__)

#: Most leases one renewal script call renews: a few hundred microseconds of Redis time, so a batch
#: never holds Redis up noticeably for the other clients.
RENEW_BATCH = 256


class CommitResult(IntEnum):
    FENCED = 0
    WRITTEN = 1
    ROLLED_BACK = 2


class Lease(NamedTuple):
    group: str
    topic: str
    qid: int
    owner: str
    term: int

    @property
    def token(self) -> str:
        return f"{self.owner} {self.term}"

    def keys(self) -> list[str]:
        return [keys.lease(self.group, self.topic, self.qid), keys.lease_term(self.group, self.topic, self.qid)]


class LeaseHolder(NamedTuple):
    owner: str
    term: int
    expires_in_ms: int


class LeaseStore:
    """Lease operations for one proxy instance (``owner``)."""

    def __init__(self, redis: AsyncRedis, owner: str, ttl_ms: int) -> None:
        if " " in owner:
            raise ValueError(f"instance id {owner!r} must not contain spaces")
        self.redis = redis
        self.owner = owner
        self.ttl_ms = ttl_ms

    async def _run(self, script: str, keys_: list[str], args: list[Any]) -> int:
        return int(await eval_script(self.redis, script, keys_, args))

    async def acquire(self, group: str, topic: str, qid: int) -> Lease | None:
        """Take the lease if it is free or already ours (restart); None when someone else holds it."""
        probe = Lease(group, topic, qid, self.owner, 0)
        term = await self._run(LEASE_ACQUIRE_LUA, probe.keys(), [self.owner, self.ttl_ms])
        return probe._replace(term=term) if term else None

    async def renew(self, lease: Lease) -> bool:
        return bool(await self._run(LEASE_RENEW_LUA, lease.keys(), [lease.token, self.ttl_ms]))

    async def renew_many(self, leases: Sequence[Lease]) -> list[bool | None]:
        """Renew ``leases`` with :data:`~ddmq.protocol.redis.scripts.LEASE_RENEW_MANY_LUA`, in one pipeline of
        script calls of at most :data:`RENEW_BATCH` leases each (on a Cluster, one call per slot: the
        leases of one queue, whatever their group, are in its slot). Per lease, in order: True =
        renewed, False = lost (its term was taken over), None = not known (its call failed; the lease
        stays valid until its TTL runs out and the next round tries again)."""
        batches: list[list[int]] = []
        if isinstance(self.redis, RedisCluster):
            by_slot: dict[int, list[int]] = defaultdict(list)
            for index, lease in enumerate(leases):
                by_slot[self.redis.keyslot(lease.keys()[0])].append(index)
            for indexes in by_slot.values():
                batches += [indexes[i:i + RENEW_BATCH] for i in range(0, len(indexes), RENEW_BATCH)]
        else:
            every = list(range(len(leases)))
            batches = [every[i:i + RENEW_BATCH] for i in range(0, len(every), RENEW_BATCH)]
        calls = [
            (LEASE_RENEW_MANY_LUA, [key for i in batch for key in leases[i].keys()],
             [self.ttl_ms, *(leases[i].token for i in batch)])
            for batch in batches
        ]
        out: list[bool | None] = [None] * len(leases)
        try:
            replies = await eval_scripts(self.redis, calls)
        except BrokerError as exc:  # the upkeep's link health says it once, not every round
            log.debug("renewing %d leases failed: %s", len(leases), exc)
            return out
        for batch, reply in zip(batches, replies, strict=True):
            if isinstance(reply, Exception):
                log.warning("renewing %d leases failed: %s", len(batch), reply)
                continue
            for index, flag in zip(batch, reply, strict=True):
                out[index] = bool(flag)
        return out

    async def release(self, lease: Lease) -> bool:
        return bool(await self._run(LEASE_RELEASE_LUA, lease.keys(), [lease.token]))

    async def commit(
        self, lease: Lease, offset: int, finished: str = "", mark: list[str | int] | None = None
    ) -> CommitResult:
        """Write the committed offset, and the ``finished`` ranges past it, only while ``lease`` still
        holds (else FENCED) and the queue still holds what the reader read (``mark``, from
        :func:`~ddmq.proxy.store.broker.read_mark`; else ROLLED_BACK)."""
        group, topic, qid = lease.group, lease.topic, lease.qid
        return CommitResult(await self._run(
            LEASE_COMMIT_LUA,
            [*lease.keys(), keys.committed(group, topic, qid), keys.finished(group, topic, qid),
             keys.stream(topic, qid), keys.sequence(topic, qid)],
            [lease.token, offset, finished, *(mark or read_mark(0, None))],
        ))

    async def holder(self, group: str, topic: str, qid: int) -> LeaseHolder | None:
        """Who holds a queue's lease now (for status views)."""
        key = keys.lease(group, topic, qid)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            raw, ttl = await pipe.execute()
        if raw is None:
            return None
        owner, _, term = raw.decode().rpartition(" ")
        return LeaseHolder(owner, int(term), int(ttl))
