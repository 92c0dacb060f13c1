"""ReplayLeases: replayable pulls, for readers that may read the same batch more than once (Spark).

A *replay lease* (named by the client: ``PullRequest.leaseId``) is unrelated to the queue leases of
:mod:`ddmq.proxy.cluster.leases`, which decide which proxy reads a queue.


A pull that names a lease (``PullRequest.leaseId`` + ``leaseIndex``) is remembered: the first pull of
``(lease, index)`` takes messages from the group's :class:`~ddmq.proxy.engine.pull_buffer.PullBuffer` as
usual (they stay in flight for the lease's timeout instead of the topic's ``timeout_ms``), and every
later pull of the same ``(lease, index)`` answers the very same messages, until the lease is acked
(:meth:`ReplayLeases.ack`) or expires. An empty answer is remembered too, so a replay stops where the
first read stopped.

Why: a Spark task may read its partition several times (each action of ``foreachBatch``, task
retries, a restart from the checkpoint), and Spark acks only after the micro-batch committed. With
replay, every read of a partition sees the same rows, and the messages stay in flight (holding their
keys' gates) until the batch is committed. A pull asking for ordered runs (``maxPerKey``) replays the
same runs: the batch is remembered, not re-taken.

With runs, a lease's later pulls also *continue* the runs of keys it holds: the messages waiting behind
the last message of a key handed out under the lease may go out in a later pull of the same lease
(after the ready heads of that pull's queue, or alone when no queue has ready heads). The reader reads
a lease's pulls in index order, so a key's messages still reach it in order, and the lease's ack
finishes them all. Without this a key whose head went out in the first pull of a micro-batch, before
its later messages were read from Redis or while the reply was full of other keys' heads, would
advance one message per micro-batch.

A lease is only replayed while every message in it is still in flight *under this lease* (same
attempt). Once one of them timed out and moved on (redelivered, dead-lettered, or its queue moved to
another proxy), or the lease expired, it becomes a *tombstone* that answers empty to every pull for
one more lease period: replaying it could hand out a message after its key's successor, and letting
a re-read take fresh messages instead would have them acked with the batch although an earlier read
of the same partition (the one that reached the sink, say) never saw them. Expired leases and
tombstones are swept lazily, at most once per second.

Leases are kept in the memory of one proxy: a lease's replays must go to the proxy that served it.
What a lease handed out is also *recorded* in Redis (:func:`ddmq.protocol.redis.keys.replay_lease`, written
before the pull is answered, kept for the lease timeout plus :data:`RECORD_GRACE_MS`), so that its ack
outlives the proxy: an ack of a lease this proxy does not hold (the proxy that served it died, or
restarted) reads the record and marks those offsets finished for whoever reads the queue next (and
skips them here if this proxy reads the queue). An ack of a lease held here finishes its messages and
commits their queues before it answers, so an answered ack is durable. A lease *abandoned* by its
reader (its proxy refused connections, so the micro-batch goes on without its rows) is marked so in
its record, and no later ack finishes anything of it. docs/design/spark.md, "A proxy's death
under a Spark query", walks through the races.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import eval_script
from ddmq.protocol.redis.scripts import LEASE_RECORD_LUA
from ddmq.proxy.core.errors import BadRequestError, DdmqError, UnavailableError
from ddmq.proxy.core.types import PullBatch, QueueId, ReplySize
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.offsets import OffsetTracker, decode_ranges, encode_ranges
from ddmq.proxy.engine.pull_buffer import THRIFT_REPLY, PullBuffer
from ddmq.proxy.store.broker import Broker


class ReplayCommits(Protocol):
    """A topic's commits, as acks of replay leases reach them: its queues' offsets, and their commit."""

    async def commit(self, qid: int) -> None: ...
    def tracker(self, qid: int) -> OffsetTracker | None: ...


#: The commits of a topic the group consumes (``draining``: also while a reload drains the topic),
#: None when it consumes no such topic.
CommitsOf = Callable[[str, bool], ReplayCommits | None]

log = logging.getLogger(__name__)

#: Longest lease a client may ask for (one hour).
MAX_LEASE_TIMEOUT_MS: Final = 3_600_000
#: Most leases (acked or not) one group keeps at once; beyond it new leases are refused (retriable).
MAX_LEASES_PER_GROUP: Final = 100_000
#: Longest lease id accepted.
MAX_LEASE_ID_CHARS: Final = 512
#: Most pulls one lease may hold.
MAX_LEASE_INDEX: Final = 10_000
#: A lease's record in Redis outlives the lease by this much: the driver acks after Spark committed,
#: which may take a while after the last read, and a dead proxy's queues move only after their TTL.
RECORD_GRACE_MS: Final = 600_000
#: The field of a lease record that says its reader gave it up: an ack then finishes nothing.
_ABANDONED: Final = "abandoned"
_SWEEP_INTERVAL_S: Final = 1.0
_EMPTY = PullBatch(None, [])


@dataclass(eq=False)
class _Lease:
    expires: float
    timeout_s: float
    dead: bool = False
    #: One future per pull of the lease, in index order (a replay waits for a first pull under way).
    batches: list[asyncio.Future[PullBatch]] = field(default_factory=list)
    #: Every job handed out under the lease, with its attempt number at that time.
    jobs: list[tuple[UpstreamJob, int]] = field(default_factory=list)
    #: The last message handed out under the lease of each key with runs: later pulls of the lease
    #: may continue those keys' runs.
    tails: list[UpstreamJob] = field(default_factory=list)
    #: Every offset handed out under the lease, per queue (what its record in Redis says).
    offsets: dict[QueueId, list[int]] = field(default_factory=lambda: defaultdict(list))

    def live(self) -> bool:
        return all(job.state is JobState.IN_FLIGHT and job.attempts == attempts for job, attempts in self.jobs)


class ReplayLeases:
    """The replay leases of one consumer group, on top of its pull buffer. Records go to Redis
    through ``broker``, acks commit through ``commits_of`` (the group's lookup of its topics'
    committers); without them leases are kept in memory only (no records, no commits)."""

    def __init__(self, buffer: PullBuffer, broker: Broker | None = None, commits_of: CommitsOf | None = None) -> None:
        self._buffer = buffer
        self._broker = broker
        self._commits_of = commits_of
        self._leases: dict[str, _Lease] = {}
        self._next_sweep = 0.0
        self.replayed = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._leases)

    async def pull(
        self,
        lease_id: str,
        index: int,
        timeout_ms: int,
        topic: str | None,
        max_batch: int,
        linger_ms: int,
        max_per_key: int = 1,
        reply: ReplySize = THRIFT_REPLY,
    ) -> PullBatch:
        """The ``index``-th pull of lease ``lease_id``: a replay when it was served before."""
        _check(lease_id, index, timeout_ms)
        loop = asyncio.get_running_loop()
        lease = self._lease_for(lease_id, index, timeout_ms, loop.time())
        if lease is None:
            return _EMPTY
        if index < len(lease.batches):
            self.replayed += 1
            future = lease.batches[index]
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                if future.cancelled():  # the first pull of this index was abandoned: try again
                    raise UnavailableError(f"lease {lease_id!r} pull {index} was abandoned; retry") from None
                raise
        if index > len(lease.batches):
            raise BadRequestError(f"lease {lease_id!r} has {len(lease.batches)} pulls; cannot serve pull {index}")
        future = loop.create_future()
        lease.batches.append(future)
        try:
            batch = await self._buffer.pull(topic, max_batch, linger_ms, timeout_ms, max_per_key, lease.tails, reply)
        except BaseException:
            # Nothing was handed out: forget this index so a retry takes a fresh batch.
            if lease.batches and lease.batches[-1] is future:
                lease.batches.pop()
            future.cancel()
            raise
        if batch.queue is not None:
            self._note_taken(lease, batch, max_per_key)
        lease.expires = max(lease.expires, loop.time() + timeout_ms / 1000)
        try:
            if batch.queue is not None and batch.messages:
                offsets = lease.offsets[batch.queue]
                offsets.extend(message.offset for message in batch.messages)
                await self._record(lease_id, batch.queue, offsets, timeout_ms)
        finally:
            future.set_result(batch)  # replays must not hang on a record that failed or was cancelled
        return batch

    def _lease_for(self, lease_id: str, index: int, timeout_ms: int, now: float) -> _Lease | None:
        """The live lease ``lease_id`` (a new one for its first pull); None when its pulls answer empty:
        it is dead (expired, or a message of it moved on), or unknown past its first pull."""
        self._sweep(now)
        lease = self._leases.get(lease_id)
        if lease is not None and not lease.dead:
            if lease.expires <= now:
                self._bury(lease, now, "expired")
            elif not lease.live():
                self._bury(lease, now, "a message of it was redelivered or finished elsewhere")
        if lease is not None and lease.dead:
            return None
        if lease is None:
            if index > 0:
                return None  # unknown (acked, or swept long ago): a reader continuing it stops here
            if len(self._leases) >= MAX_LEASES_PER_GROUP:
                raise UnavailableError(f"too many replay leases ({MAX_LEASES_PER_GROUP}) in group {self._buffer.group}")
            lease = self._leases[lease_id] = _Lease(now + timeout_ms / 1000, timeout_ms / 1000)
        return lease

    def _note_taken(self, lease: _Lease, batch: PullBatch, max_per_key: int) -> None:
        """Record the jobs ``batch`` handed out under ``lease`` (and, with runs, the tails of their keys)."""
        assert batch.queue is not None
        taken = []
        for message in batch.messages:
            job = self._buffer.job(batch.queue, message.offset)
            if job is not None:
                lease.jobs.append((job, job.attempts))
                taken.append(job)
        if max_per_key > 1:
            lease.tails = _tails(lease.tails, taken)

    async def _record(self, lease_id: str, queue: QueueId, offsets: list[int], timeout_ms: int) -> None:
        """Write what the lease handed out of ``queue`` to its record, before the pull is answered: an ack
        that reaches another proxy after this one died finds it there. A Redis error costs only that:
        the lease's messages are then delivered again after a death (at least once), as without records."""
        if self._broker is None:
            return
        key = keys.replay_lease(self._buffer.group, lease_id)
        redis = self._broker.redis
        try:
            await eval_script(redis, LEASE_RECORD_LUA, [key], [
                f"{queue.qid} {queue.topic}", encode_ranges(sorted(offsets)), timeout_ms + RECORD_GRACE_MS,
            ])
        except DdmqError as exc:
            log.warning("replay lease %r of group %s not recorded (%s): a proxy death would deliver it again",
                        lease_id, self._buffer.group, exc)

    async def ack(self, lease_ids: list[str]) -> int:
        """Ack every message of the named leases and forget them. A lease held here is finished and its
        queues committed before this returns (DdmqError when that commit fails: ack again). A lease not
        held here is taken from its record in Redis (see :meth:`_ack_recorded`). Returns the number of
        messages acked (those of leases held here)."""
        before = self._buffer.stats.acked
        touched: set[QueueId] = set()
        held: list[str] = []
        recorded: list[str] = []
        for lease_id in lease_ids:
            lease = self._leases.pop(lease_id, None)
            if lease is None:
                recorded.append(lease_id)
                continue
            held.append(lease_id)
            if lease.dead:
                continue
            by_queue: dict[QueueId, list[int]] = defaultdict(list)
            for job, _ in lease.jobs:
                if job.state is not JobState.FINISHED:
                    by_queue[job.queue].append(job.offset)
                    touched.add(job.queue)
            for queue, offsets in by_queue.items():
                self._buffer.ack(queue, offsets)
        acked = self._buffer.stats.acked - before
        if self._broker is None or self._commits_of is None:
            return acked
        if recorded:
            touched |= await self._ack_recorded(recorded)
        for queue in touched:
            commits = self._commits_of(queue.topic, True)
            if commits is not None:
                await commits.commit(queue.qid)
        if held:
            try:
                await self._broker.redis.delete(*(keys.replay_lease(self._buffer.group, i) for i in held))
            except DdmqError as exc:  # they expire by themselves; a later ack of them finishes nothing new
                log.debug("replay lease records of group %s not deleted: %s", self._buffer.group, exc)
        return acked

    async def _ack_recorded(self, lease_ids: list[str]) -> set[QueueId]:
        """Ack leases another proxy (or an earlier incarnation of this one) served, from their records:
        their offsets are appended to each queue's finished offsets, which the queue's next owner skips
        when it loads them, and skipped here when this proxy reads the queue. Returns the queues held
        here whose trackers changed (to commit). Records marked abandoned, or gone, finish nothing."""
        assert self._broker is not None and self._commits_of is not None
        redis = self._broker.redis
        touched: set[QueueId] = set()
        for lease_id in lease_ids:
            record = await redis.hgetall(keys.replay_lease(self._buffer.group, lease_id))
            fields = {_text(name): _text(value) for name, value in record.items()}
            if not fields or _ABANDONED in fields:
                continue
            for name, ranges in fields.items():
                qid_text, _, topic = name.partition(" ")
                commits = self._commits_of(topic, False)
                try:
                    qid, offsets = int(qid_text), decode_ranges(ranges)
                except ValueError:
                    log.warning("replay lease %r: unreadable record field %r; ignored", lease_id, name)
                    continue
                if commits is None or not offsets:
                    continue
                # APPEND keeps the ranges valid (decode_ranges takes the union of comma-separated parts)
                # and is one command on one key, so no owner's commit can interleave inside it.
                await redis.append(keys.finished(self._buffer.group, topic, qid), "," + ranges)
                tracker = commits.tracker(qid)
                if tracker is not None:
                    # This proxy reads the queue (it took it from the dead proxy, or is that proxy
                    # restarted): its tracker and buffer must learn it, or its next commit drops the
                    # appended ranges and it delivers them again.
                    queue = QueueId(topic, qid)
                    tracker.skip_ahead(offsets)
                    read = [offset for offset in offsets if tracker.commit_point <= offset < tracker.next_offset]
                    late = self._buffer.finish_elsewhere(queue, read)
                    if late:
                        log.warning("replay lease %r acked here after this proxy took %s#%d and handed out %d "
                                    "of its %d messages again", lease_id, topic, qid, late, len(offsets))
                    touched.add(queue)
        return touched

    async def abandon(self, lease_ids: list[str]) -> None:
        """Mark the named leases given up by their reader: no later ack finishes anything of them."""
        if self._broker is None:
            return
        redis = self._broker.redis
        for lease_id in lease_ids:
            _check(lease_id, 0, 1)
            key = keys.replay_lease(self._buffer.group, lease_id)
            abandoned = [_ABANDONED, "1", MAX_LEASE_TIMEOUT_MS + RECORD_GRACE_MS]
            await eval_script(redis, LEASE_RECORD_LUA, [key], abandoned)

    def _sweep(self, now: float) -> None:
        if now < self._next_sweep:
            return
        self._next_sweep = now + _SWEEP_INTERVAL_S
        for lease_id, lease in list(self._leases.items()):
            if lease.expires > now:
                continue
            if lease.dead:
                del self._leases[lease_id]
            else:
                self._bury(lease, now, "expired")

    def _bury(self, lease: _Lease, now: float, why: str) -> None:
        """Turn ``lease`` into a tombstone: it answers empty for one more lease period."""
        lease.dead = True
        lease.expires = now + lease.timeout_s
        lease.batches.clear()
        lease.jobs.clear()
        self.dropped += 1
        log.debug("replay lease of group %s dropped: %s", self._buffer.group, why)


def _tails(tails: list[UpstreamJob], taken: list[UpstreamJob]) -> list[UpstreamJob]:
    """The lease's last message per key once ``taken`` went out too: a message whose successor is now
    in flight (in this lease: nobody else may take a key this lease holds) is no longer the last."""
    return [job for job in (*tails, *taken) if job.next is None or job.next.state is not JobState.IN_FLIGHT]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _check(lease_id: str, index: int, timeout_ms: int) -> None:
    if not 0 < len(lease_id) <= MAX_LEASE_ID_CHARS:
        raise BadRequestError(f"leaseId must have 1..{MAX_LEASE_ID_CHARS} characters")
    if not 0 <= index <= MAX_LEASE_INDEX:
        raise BadRequestError(f"leaseIndex must be in 0..{MAX_LEASE_INDEX}, got {index}")
    if not 0 < timeout_ms <= MAX_LEASE_TIMEOUT_MS:
        raise BadRequestError(f"leaseTimeoutMs must be in 1..{MAX_LEASE_TIMEOUT_MS}, got {timeout_ms}")
