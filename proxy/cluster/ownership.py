"""Queue ownership of one group's topic: which queues of it this proxy reads, under which lease.

Each round of the proxy's upkeep (:mod:`ddmq.proxy.cluster.upkeep`, which heartbeats every group and
renews every lease in batches) hands it the group's live members: it claims the queues assigned to
this proxy and hands off those assigned elsewhere, and drops a queue whose renewal was refused.
Opening a queue (its tracker, its reader) and dropping one (:class:`QueueDrops`: its reader, its
unfinished jobs, its lease) live here too, so that a queue is read exactly while its lease is held.
The fencing itself is in :mod:`ddmq.proxy.cluster.leases`; why it works this way is in DESIGN.md,
"Leases and fencing".

Both act on the topic's queue states (:class:`~ddmq.proxy.cluster.queue_state.OwnedQueues`) with the
lease store, the broker and the lease settings they are given; what concerns the topic's jobs (its
parked keys, its jobs in the buffer) they reach through the callbacks they are given, so neither knows
who consumes the topic.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ddmq.config.schema import LeaseConfig
from ddmq.proxy.cluster.commits import OffsetCommitter
from ddmq.proxy.cluster.leases import Lease, LeaseStore
from ddmq.proxy.cluster.membership import Membership, assign
from ddmq.proxy.cluster.queue_state import OwnedQueues
from ddmq.proxy.cluster.upkeep import Upkeep
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.engine.reader import QueueReader, TopicReads
from ddmq.proxy.store.broker import Broker

log = logging.getLogger(__name__)

#: How often a consumer whose topic has no metadata yet looks again.
METADATA_POLL_S = 1.0
#: While a rebalance's hand-offs run, how often a queue assigned here but still held by its previous
#: owner is claimed again: that owner releases it as soon as its clients acked what they hold, and
#: the next heartbeat round (a second away) would leave the queue unserved meanwhile.
CLAIM_RETRY_S = 0.05
#: How often a queue being let go looks whether its clients acked what they hold.
DRAIN_POLL_S = 0.02


class QueueDrops:
    """Letting one of the topic's queues go: its reader stopped, its state forgotten (``owned``), its
    jobs dropped (``forget_jobs``: parked keys and the buffer's jobs, each finished as dropped) and,
    when asked, its lease released for the next owner. Ownership and commits both drop through it."""

    def __init__(self, group: str, topic: str, owned: OwnedQueues, leases: LeaseStore,
                 forget_jobs: Callable[[int], None]) -> None:
        self._name = f"{group}/{topic}#"
        self._owned = owned
        self._leases = leases
        self._forget_jobs = forget_jobs

    async def drop(self, qid: int, release: bool = False) -> None:
        """Stop reading ``qid`` and forget its unfinished jobs (they stay uncommitted, so the queue's
        next owner delivers them again). With ``release``, free the lease for the next owner."""
        reader = self._owned.take_reader(qid)
        if reader is not None:
            await reader.stop()
        lease = self._owned.drop(qid)
        self._forget_jobs(qid)
        if release and lease is not None:
            try:
                await self._leases.release(lease)
            except DdmqError as exc:
                log.warning("%s%d: releasing the lease failed (%s); it expires by itself", self._name, qid, exc)


class QueueOwnership:
    """The leases one group's topic holds here (in ``owned``): claims, hand-offs and drops, on the
    upkeep's rounds. A claimed queue is opened from its commit point (``commits``) with its parked keys
    (``load_keys``) and read by a :class:`~ddmq.proxy.engine.reader.QueueReader` over ``reads``; a
    retiring topic waits for its jobs in flight (``in_flight``), a queue let go for those of the queue
    (``in_flight_of``)."""

    def __init__(
        self,
        group: str,
        topic: str,
        owned: OwnedQueues,
        *,
        broker: Broker,
        leases: LeaseStore,
        membership: Membership,
        upkeep: Upkeep,
        settings: LeaseConfig,
        commits: OffsetCommitter,
        drops: QueueDrops,
        reads: TopicReads,
        load_keys: Callable[[int], Awaitable[None]],
        in_flight: Callable[[], int],
        in_flight_of: Callable[[int], int],
    ) -> None:
        self.group = group
        self.topic = topic
        self.owned = owned
        self._broker = broker
        self._leases = leases
        self._membership = membership
        self._upkeep = upkeep
        self._settings = settings
        self._commits = commits
        self._drops = drops
        self._reads = reads
        self._load_keys = load_keys
        self._in_flight = in_flight
        self._in_flight_of = in_flight_of
        #: The topic's number of queues, once its metadata is known (0 until then).
        self.queues = 0
        #: The queues this proxy should own, from the last heartbeat (none until the first one).
        self.assigned: range = range(0)
        #: The claims under way (one task at a time, claiming every missing queue at once).
        self._claiming: asyncio.Task[None] | None = None
        #: ``owned.leases_version`` when a rebalance last found the held queues equal to the assigned
        #: ones (-1: it did not).
        self._settled_at = -1
        #: Loop time until which claims refused are tried again every :data:`CLAIM_RETRY_S` (the
        #: hand-offs of the last change of assignment are under way until then).
        self._claim_until = 0.0

    def _name(self, qid: int) -> str:
        return f"{self.group}/{self.topic}#{qid}"

    # the upkeep's rounds ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Find the topic's queues (waiting for its metadata if need be), then take part in the upkeep
        until cancelled."""
        broker = self._broker
        warned = False
        while True:
            try:
                async with broker.opening:  # every consumer of the proxy starts at once (see Broker.opening)
                    queues = await broker.topic_queues(self.topic)
            except DdmqError as exc:
                log.warning("%s/%s: %s", self.group, self.topic, exc)
                queues = None
            if queues:
                break
            if not warned:
                log.warning("topic %s has no metadata yet; group %s waits for its first producer",
                            self.topic, self.group)
                warned = True
            await asyncio.sleep(METADATA_POLL_S)
        self.queues = queues
        # The upkeep heartbeats, rebalances and renews for every consumer of the proxy at once.
        self._upkeep.join(self)
        try:
            # Until cancelled. A bare future, not an Event: an Event's waiter deque costs ~0.7 KB, per consumer.
            await asyncio.get_running_loop().create_future()
        finally:
            self._upkeep.leave(self)
            claiming = self._claiming
            if claiming is not None:  # no claim may open a reader once the consumer stops
                claiming.cancel()
                await asyncio.gather(claiming, return_exceptions=True)

    def rebalance(self, members: list[str] | None) -> None:
        """A round of the upkeep: with the group's live ``members`` (None: its heartbeat failed, so the
        last assignment stands; leases keep it safe), hand off the held queues no longer assigned here
        and claim the assigned ones not held (in a task, one claim after another)."""
        owned = self.owned
        assigned = self.assigned
        if members is not None:
            assigned = assign(members, self.queues, self._membership.instance_id)
        # Held exactly what is assigned, and no lease taken or let go since: nothing to hand off or claim.
        # Most rounds of a settled proxy end here, for every consumer it serves.
        if assigned == self.assigned and owned.leases_version == self._settled_at:
            return
        if assigned != self.assigned:
            settings = self._settings
            window_ms = settings.handoff_drain_ms + 2 * settings.claim_interval_ms
            self._claim_until = asyncio.get_running_loop().time() + window_ms / 1000
        self.assigned = assigned
        held = owned.held()
        self._settled_at = owned.leases_version if held.keys() == set(assigned) else -1
        for qid in held:
            if qid not in assigned and not owned.handing_off(qid):
                task = asyncio.create_task(self._hand_off(qid), name=f"handoff:{self._name(qid)}")
                owned.set_handoff(qid, task)
        if self._claiming is None or self._claiming.done():
            if any(owned.lease(qid) is None for qid in assigned):
                name = f"claims:{self.group}/{self.topic}"
                self._claiming = asyncio.create_task(self._claim_all(), name=name)

    async def _claim_all(self) -> None:
        """Claim the assigned queues not held, all at once (bounded by ``Broker.opening``): queues
        opened together share the topic's read-ahead room from their first reads, where one opened
        after the others would wait for room they filled. Those another proxy still holds are tried
        again every :data:`CLAIM_RETRY_S` while the hand-off window lasts (their owner hands them
        over); after it, at the upkeep's rounds (a crashed owner's lease runs out by itself)."""
        loop = asyncio.get_running_loop()
        while True:
            missing = [qid for qid in self.assigned if self.owned.lease(qid) is None]
            claimed = await asyncio.gather(*(self._try_claim(qid) for qid in missing))
            if all(claimed) or loop.time() >= self._claim_until:
                return
            await asyncio.sleep(CLAIM_RETRY_S)

    async def _try_claim(self, qid: int) -> bool:
        """:meth:`_claim`, False only when another proxy holds the lease."""
        try:
            return await self._claim(qid)
        except Exception:  # the next round claims again; the upkeep must not stop for it
            log.exception("%s: claiming failed", self._name(qid))
            return True

    def leases(self) -> dict[int, Lease]:
        return self.owned.held()

    def confirmed(self, qid: int) -> bool:
        return self.owned.confirmed(qid)

    def renewed(self, qid: int, lease: Lease, asked_at: float) -> None:
        self.owned.confirm(qid, lease, asked_at)

    async def lost(self, qid: int, lease: Lease) -> None:
        if self.owned.holds(qid, lease):
            log.warning("%s: lease term %d was taken over; dropping the queue", self._name(qid), lease.term)
            await self.drop_queue(qid)

    async def _claim(self, qid: int) -> bool:
        """Claim and open ``qid``; False when another proxy holds its lease."""
        async with self._broker.opening:  # a few queues of the proxy at a time (see Broker.opening)
            asked_at = asyncio.get_running_loop().time()
            try:
                lease = await self._acquire(qid)
            except DdmqError as exc:
                log.warning("%s: cannot claim: %s", self._name(qid), exc)
                return True
            if lease is None:
                return False
            self.owned.claim(qid, lease, asked_at)
            try:
                await self.open_queue(qid, lease.term)
            except DdmqError as exc:
                # Nothing read yet: free the lease so that the next round (here or elsewhere) opens it again.
                log.warning("%s: cannot open the queue (%s); claiming it again later", self._name(qid), exc)
                await self.drop_queue(qid, release=True)
            return True

    async def _acquire(self, qid: int) -> Lease | None:
        """The lease on ``qid``, if free. A claim cancelled (the consumer stops) while its script runs
        still learns whether it took the lease, and releases it: a lease taken and forgotten would
        keep the queue from every proxy for a TTL."""
        acquiring = asyncio.ensure_future(self._leases.acquire(self.group, self.topic, qid))
        try:
            return await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            with contextlib.suppress(DdmqError, asyncio.CancelledError):
                lease = await acquiring
                if lease is not None:
                    await self._leases.release(lease)
            raise

    async def _hand_off(self, qid: int) -> None:
        """The queue is assigned elsewhere: let it go (:meth:`let_go`) within ``handoff_drain_ms``.
        The lease keeps being renewed until then."""
        try:
            await self.let_go(qid, self._settings.handoff_drain_ms)
        finally:
            self.owned.set_handoff(qid, None)

    async def let_go(self, qid: int, drain_ms: int) -> int:
        """Hand ``qid`` over: hand out nothing more of it and stop reading it, give clients up to
        ``drain_ms`` to ack or fail what they hold, commit, release. What was read and not handed out
        is not waited for: the next owner reads it again from the commit point, so the queue is served
        again as soon as its messages in flight are settled, with each key in order. Returns how many
        were still in flight (delivered again by the next owner)."""
        owned = self.owned
        owned.stop_serving(qid)
        left = 0
        try:
            reader = owned.take_reader(qid)
            if reader is not None:
                await reader.stop()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + drain_ms / 1000
            while self._in_flight_of(qid) and loop.time() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(DRAIN_POLL_S)
            left = self._in_flight_of(qid)
            if owned.lease(qid) is not None:
                await self._commits.commit(qid)
                await self.drop_queue(qid, release=True)
                log.info("%s: handed off%s", self._name(qid), f" ({left} in flight left)" if left else "")
        except DdmqError as exc:
            log.warning("%s: hand-off failed (%s); the lease expires by itself", self._name(qid), exc)
            await self.drop_queue(qid)
        return left

    # the state of one queue ----------------------------------------------------------------------

    async def open_queue(self, qid: int, term: int) -> None:
        """Start reading ``qid`` (just claimed under ``term``) from its committed offset."""
        # the queue's parked keys before reading it (a parked key's message must not go out), in the
        # same round trip as its offsets (a task, not gather: gather's list is no tuple to compiled code)
        parked = asyncio.ensure_future(self._load_keys(qid))
        try:
            tracker = await self._commits.load(qid)
        finally:
            await parked
        reader = QueueReader(self._reads, qid, tracker, term)
        self.owned.open(qid, tracker, reader)
        reader.start()
        log.info("%s: lease term %d, reading from offset %d", self._name(qid), term, tracker.committed)

    async def drop_queue(self, qid: int, release: bool = False) -> None:
        """Let ``qid`` go (:meth:`QueueDrops.drop`); with ``release``, free the lease for the next owner."""
        await self._drops.drop(qid, release)

    # giving every queue up -----------------------------------------------------------------------

    async def give_up(self, drain_ms: int) -> int:
        """Retire: with reading stopped, wait for running hand-offs, give clients up to ``drain_ms`` to
        ack or fail what they hold, commit and release every held queue. Returns how many jobs were
        left unfinished (they stay uncommitted: whoever reads the queue next delivers them again)."""
        await asyncio.gather(*self.owned.handoffs(), return_exceptions=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_ms / 1000
        log.info("%s/%s: retiring: reading stopped; clients have up to %d ms to ack %d jobs in flight",
                 self.group, self.topic, drain_ms, self._in_flight())
        # Once per reload, so polling is fine; the ack path stays free of retirement bookkeeping.
        while self._in_flight() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        left = sum(tracker.unfinished for tracker in self.owned.trackers().values())
        for qid in self.owned.held():
            try:
                await self._commits.commit(qid)
            except DdmqError as exc:
                log.warning("%s: final commit failed (%s); the unacked part is redelivered", self._name(qid), exc)
            await self.drop_queue(qid, release=True)
        return left

    async def hand_off_all(self, drain_ms: int) -> None:
        """Stopping (after the upkeep let go of this consumer): leave the member set, so the other
        proxies take the group's queues at their next round, and let every held queue go at once
        (:meth:`let_go`), each as soon as its own messages in flight are settled, within ``drain_ms``."""
        try:
            await self._membership.leave(self.group)
        except DdmqError as exc:
            log.warning("%s: leaving the member set failed: %s", self.group, exc)
        owned = self.owned
        running = owned.handoffs()
        for qid in owned.held():  # a hand-off under way hands out nothing more either
            owned.stop_serving(qid)
        letting = [self.let_go(qid, drain_ms) for qid in owned.held() if not owned.handing_off(qid)]
        await asyncio.gather(*letting)
        if running:
            await asyncio.wait(running, timeout=drain_ms / 1000)

    async def release_all(self) -> None:
        """Leave the member set and give every held queue up (graceful shutdown, after the final flush)."""
        try:
            await self._membership.leave(self.group)
        except DdmqError as exc:
            log.warning("%s: leaving the member set failed: %s", self.group, exc)
        for qid in self.owned.held():
            await self.drop_queue(qid, release=True)
