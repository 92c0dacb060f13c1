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
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Final

from ddmq.proxy.core.errors import BadRequestError, UnavailableError
from ddmq.proxy.core.types import PullBatch, QueueId, ReplySize
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.pull_buffer import THRIFT_REPLY, PullBuffer

log = logging.getLogger(__name__)

#: Longest lease a client may ask for (one hour).
MAX_LEASE_TIMEOUT_MS: Final = 3_600_000
#: Most leases (acked or not) one group keeps at once; beyond it new leases are refused (retriable).
MAX_LEASES_PER_GROUP: Final = 100_000
#: Longest lease id accepted.
MAX_LEASE_ID_CHARS: Final = 512
#: Most pulls one lease may hold.
MAX_LEASE_INDEX: Final = 10_000
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

    def live(self) -> bool:
        return all(job.state is JobState.IN_FLIGHT and job.attempts == attempts for job, attempts in self.jobs)


class ReplayLeases:
    """The replay leases of one consumer group, on top of its pull buffer."""

    def __init__(self, buffer: PullBuffer) -> None:
        self._buffer = buffer
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
        now = loop.time()
        self._sweep(now)
        lease = self._leases.get(lease_id)
        if lease is not None and not lease.dead:
            if lease.expires <= now:
                self._bury(lease, now, "expired")
            elif not lease.live():
                self._bury(lease, now, "a message of it was redelivered or finished elsewhere")
        if lease is not None and lease.dead:
            return _EMPTY
        if lease is None:
            if index > 0:
                return _EMPTY  # unknown (acked, or swept long ago): a reader continuing it stops here
            if len(self._leases) >= MAX_LEASES_PER_GROUP:
                raise UnavailableError(f"too many replay leases ({MAX_LEASES_PER_GROUP}) in group {self._buffer.group}")
            lease = self._leases[lease_id] = _Lease(now + timeout_ms / 1000, timeout_ms / 1000)
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
            taken = []
            for message in batch.messages:
                job = self._buffer.job(batch.queue, message.offset)
                if job is not None:
                    lease.jobs.append((job, job.attempts))
                    taken.append(job)
            if max_per_key > 1:
                lease.tails = _tails(lease.tails, taken)
        lease.expires = max(lease.expires, loop.time() + timeout_ms / 1000)
        future.set_result(batch)
        return batch

    def ack(self, lease_ids: list[str]) -> int:
        """Ack every message of the named leases and forget them; unknown ids are ignored. Returns the
        number of messages acked."""
        before = self._buffer.stats.acked
        for lease_id in lease_ids:
            lease = self._leases.pop(lease_id, None)
            if lease is None or lease.dead:
                continue
            by_queue: dict[QueueId, list[int]] = defaultdict(list)
            for job, _ in lease.jobs:
                if job.state is not JobState.FINISHED:
                    by_queue[job.queue].append(job.offset)
            for queue, offsets in by_queue.items():
                self._buffer.ack(queue, offsets)
        return self._buffer.stats.acked - before

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


def _check(lease_id: str, index: int, timeout_ms: int) -> None:
    if not 0 < len(lease_id) <= MAX_LEASE_ID_CHARS:
        raise BadRequestError(f"leaseId must have 1..{MAX_LEASE_ID_CHARS} characters")
    if not 0 <= index <= MAX_LEASE_INDEX:
        raise BadRequestError(f"leaseIndex must be in 0..{MAX_LEASE_INDEX}, got {index}")
    if not 0 < timeout_ms <= MAX_LEASE_TIMEOUT_MS:
        raise BadRequestError(f"leaseTimeoutMs must be in 1..{MAX_LEASE_TIMEOUT_MS}, got {timeout_ms}")
