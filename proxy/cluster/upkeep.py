"""The proxy's upkeep: one task per process heartbeats every group it serves and renews every lease it holds.

Each consumer (one group's topic) owns its queues (:mod:`ddmq.proxy.cluster.ownership`: assignment,
claims, hand-offs, drops), but the periodic Redis work of all of them runs here, batched, so that an
idle proxy costs about the same whatever the number of groups, topics and queues it holds:

- every ``claim_interval_ms``, one heartbeat for every group (:meth:`Membership.heartbeat_many
  <ddmq.proxy.cluster.membership.Membership.heartbeat_many>`: one script call for up to 100 groups on a
  single Redis, one per group on a Cluster, all in one pipeline), then each consumer rebalances with
  its group's live members (computing its share, starting hand-offs and claims, which run in their
  own tasks);
- every ``renew_ms``, one renewal of every lease held (:meth:`LeaseStore.renew_many
  <ddmq.proxy.cluster.leases.LeaseStore.renew_many>`: one script call per 256 leases on a single Redis,
  per slot on a Cluster, all in one pipeline). The fencing is the single renewal's, lease by lease: a
  lease whose term was taken over is reported lost, and its queue dropped, while the others of the
  batch are renewed.

Between rounds the upkeep also waits for a proxy to join or leave one of its groups
(:meth:`Membership.wait_for_change <ddmq.proxy.cluster.membership.Membership.wait_for_change>`), and
runs the next round at once when one does, so queues change hands within milliseconds of a start or a
stop rather than up to a round later (single Redis; on a Cluster at the next round).

Rounds are timed on Redis's clock as the proxy's :class:`~ddmq.proxy.cluster.lease_clock.LeaseClock`
knows it (a host whose clock runs at half speed still heartbeats every ``claim_interval_ms`` of real
time), every call has the client's deadline, and the state of the link is said once each way
(:mod:`~ddmq.proxy.cluster.link_health`). A stall of the process (the clock's stall detector) makes
the next round renew at once, as no lease counts until it has.

A consumer joins once its topic's queues are known and leaves when it stops; the task runs while
at least one consumer is joined, under a supervisor (an unexpected error restarts it). Its Redis work
per round does not depend on the number of consumers (only its size does), and a consumer with
nothing to do costs a few attribute reads per round.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from redis.asyncio.cluster import RedisCluster

from ddmq.config.schema import LeaseConfig
from ddmq.proxy.cluster.leases import Lease, LeaseStore
from ddmq.proxy.cluster.link_health import LinkHealth
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.supervise import supervised

log = logging.getLogger(__name__)


class Upkept(Protocol):
    """One consumer's ownership, as the upkeep sees it."""

    @property
    def group(self) -> str: ...
    @property
    def topic(self) -> str: ...

    def rebalance(self, members: list[str] | None) -> None:
        """The group's live members (None: the heartbeat failed, keep the last assignment)."""

    def leases(self) -> dict[int, Lease]:
        """The leases to renew, by qid."""

    def confirmed(self, qid: int) -> bool:
        """Whether the lease on ``qid`` still counts (the queue is served)."""

    def renewed(self, qid: int, lease: Lease, asked_at: float) -> None:
        """``lease`` was renewed by a call sent at loop time ``asked_at``."""

    async def lost(self, qid: int, lease: Lease) -> None:
        """``lease``'s term was taken over: the queue must be dropped."""


class Upkeep:
    """The heartbeats and renewals of every consumer of one proxy (see the module's docstring)."""

    def __init__(
        self, leases: LeaseStore, membership: Membership, config: LeaseConfig, health: LinkHealth | None = None
    ) -> None:
        self.leases = leases
        self.membership = membership
        self.config = config
        self.health = health or LinkHealth()
        self.clock = membership.clock
        self.clock.on_stall = self.renew_soon
        #: The members, in the order they joined (a dict: each round asks of every member whether it is
        #: still here, which a list would answer in time proportional to the members).
        self._joined: dict[Upkept, None] = {}
        self._task: asyncio.Task[None] | None = None
        #: Waits for member changes (see :meth:`_watch`); none on a Cluster.
        self._watcher: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        #: Held while a renewal is in flight (see :meth:`settled`).
        self._renewing = asyncio.Lock()
        self._next_renew = 0.0
        self._renew_now = False

    @property
    def joined(self) -> int:
        return len(self._joined)

    def join(self, member: Upkept) -> None:
        """Heartbeat, rebalance and renew for ``member`` from the next round on (which starts soon)."""
        if member in self._joined:
            raise RuntimeError(f"{member.group}/{member.topic} already joined the upkeep")
        self._joined[member] = None
        self._wake.set()
        if self._task is None or self._task.done():
            self.clock.start()
            self._task = asyncio.create_task(supervised("upkeep", self._run), name="upkeep")
        if (self._watcher is None or self._watcher.done()) and not isinstance(self.membership.redis, RedisCluster):
            self._watcher = asyncio.create_task(supervised("member watch", self._watch), name="member-watch")

    def leave(self, member: Upkept) -> None:
        """No more rounds for ``member`` (a renewal in flight still reports to it: see :meth:`settled`)."""
        self._joined.pop(member, None)
        if not self._joined and self._task is not None:
            self._task.cancel()
            self._task = None
            self.clock.stop()
        if not self._joined and self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def renew_soon(self) -> None:
        """Renew every lease at the next round, which starts now (a stall made them stop counting)."""
        self._renew_now = True
        self._wake.set()

    async def settled(self) -> None:
        """Return once no renewal is in flight: after :meth:`leave` and this, nothing of the upkeep
        renews a lease of the member that left (so a release that follows stays released)."""
        async with self._renewing:
            pass

    async def close(self) -> None:
        self._joined.clear()
        self.clock.stop()
        tasks = [task for task in (self._task, self._watcher) if task is not None]
        self._task = self._watcher = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._next_renew = loop.time() + self.clock.local_s(self.config.renew_ms / 1000)
        while True:
            self._wake.clear()
            await self.round()
            try:
                async with asyncio.timeout(self.clock.local_s(self.config.claim_interval_ms / 1000)):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _watch(self) -> None:
        """Wake the rounds whenever a proxy joins or leaves a group served here (until cancelled)."""
        while True:
            groups = sorted({member.group for member in self._joined})
            try:
                changed = groups and await self.membership.wait_for_change(groups)
            except DdmqError as exc:  # the rounds say how Redis is; wait for the next one here
                log.debug("waiting for member changes failed: %s", exc)
                changed = False
                await asyncio.sleep(self.clock.local_s(self.config.claim_interval_ms / 1000))
            if changed:
                self._wake.set()
            elif not groups:
                await asyncio.sleep(self.clock.local_s(self.config.claim_interval_ms / 1000))

    async def round(self) -> None:
        """One heartbeat of every group and a rebalance of every consumer; the renewals when due."""
        joined = list(self._joined)
        topics: dict[str, list[str]] = {}
        for member in joined:
            topics.setdefault(member.group, []).append(member.topic)
        loop = asyncio.get_running_loop()
        started = loop.time()
        live = await self.membership.heartbeat_many(topics)
        failure = self.membership.failure
        if failure is None:
            self.health.answered(loop.time() - started)
        else:
            self.health.failed(failure, sum(len(member.leases()) for member in joined), self.clock.ttl_s)
        for member in joined:
            if member in self._joined:  # it may have left while the heartbeat was out
                member.rebalance(live.get(member.group))
        if self._renew_now or loop.time() >= self._next_renew:
            self._renew_now = False
            self._next_renew = loop.time() + self.clock.local_s(self.config.renew_ms / 1000)
            await self.renew()
        if not self.health.reachable:
            self.health.lapsed([f"{member.group}/{member.topic}#{qid}" for member in joined
                                for qid in member.leases() if not member.confirmed(qid)])

    async def renew(self) -> None:
        """Renew every lease held, in one pipeline; drop the queues whose lease was taken over."""
        async with self._renewing:
            held = [(member, qid, lease) for member in self._joined for qid, lease in member.leases().items()]
            if not held:
                return
            asked_at = asyncio.get_running_loop().time()
            results = await self.leases.renew_many([lease for _, _, lease in held])
            for (member, qid, lease), renewed in zip(held, results, strict=True):
                if renewed:
                    member.renewed(qid, lease, asked_at)
                elif renewed is not None:
                    await member.lost(qid, lease)

