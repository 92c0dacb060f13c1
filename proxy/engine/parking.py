"""Parked and sequenced keys: what ``on_exhausted`` does besides dead-lettering, and the operator's
actions on one key (retry, skip, park, resume).

A *parked* key stops at one message: the job stays its key's head in the state ``PARKED`` (neither
ready nor in flight), so the key's later messages wait behind it in the key chain, counting no
attempts, while other keys go on. The park is written to Redis (:class:`ParkStore`); the proxy that
takes the queue over (after a kill -9 or a lease hand-off) loads the queue's parked keys before reading
it, and parks the same message again when it arrives. An operator's ``park`` on a key with nothing
parked yet writes a *hold* (no offset): the key stops at its next message handed out.

A *sequenced* key (``on_exhausted: dead_letter_key``) has a message in the dead-letter stream: every
later message of the key goes there too, in order, until the key's dead letters are replayed (which
or purged: both ``resume`` the key first, so the replayed messages are delivered).

Key states, for the keys view and ``ddmq_keys{state}``: ``parked``; ``failing`` (the head failed at
least once); ``in_flight``; ``waiting`` (only a backlog).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable, Iterable
from typing import Any, Final, Protocol

from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.store.key_commands import ParkRecord, ParkStore, now_ms

log = logging.getLogger(__name__)

__all__ = ["KEY_STATES", "KeyParking", "KeyRow", "ParkingBuffer", "key_text"]

#: Key states, stuck ones first (the keys view sorts by this order).
KEY_STATES: Final = ("parked", "failing", "in_flight", "waiting")
#: Marks a sequenced key's record (``on_exhausted: dead_letter_key``).
SEQUENCED: Final = "sequenced"

_PARKED = JobState.PARKED
_IN_FLIGHT = JobState.IN_FLIGHT
#: States of a head the pull buffer holds (an action may take it out of delivery).
_SETTLED = frozenset({JobState.READY, JobState.IN_FLIGHT, JobState.RETRY_WAIT, JobState.PARKED})


def key_text(order_key: Hashable) -> str:
    """An order key as the keys view and Redis name it (a message key is itself)."""
    return order_key if isinstance(order_key, str) else repr(order_key)


KeyRow = dict[str, Any]


class KeyChains(Protocol):
    """The topic's key gate (``UpstreamJobBlockingQueue``), as the views read it."""

    def heads(self) -> list[tuple[Hashable, UpstreamJob]]: ...

    def chain_length(self, key: Hashable) -> int: ...


class ParkingBuffer(Protocol):
    """What parking needs of the group's pull buffer."""

    def hold(self, job: UpstreamJob) -> None: ...

    def unhold(self, job: UpstreamJob) -> None: ...

    def drop_head(self, job: UpstreamJob, reason: str) -> None: ...


class KeyParking:
    """The parked and sequenced keys of one (group, topic) on this proxy, and the key views."""

    def __init__(self, buffer: ParkingBuffer, store: ParkStore, keys: KeyChains, *, pull_chain: bool) -> None:
        self._buffer = buffer
        self._store = store
        self._heads = keys.heads
        self._chain_length = keys.chain_length
        #: A push chain has no pull buffer to park in: its exhausted messages are dead-lettered.
        self._pull_chain = pull_chain
        #: qid -> key -> record, for the queues this proxy reads. Empty dicts are dropped, so the pull
        #: buffer's check on every job is one truth test while nothing is parked.
        self.records: dict[int, dict[str, ParkRecord]] = {}
        self._writes: set[asyncio.Task[None]] = set()

    # queues ------------------------------------------------------------------------------------

    async def load(self, qid: int) -> None:
        """The queue was just claimed: take over its parked keys before reading it (raises DdmqError)."""
        records = {r.key: r for r in await self._store.of_queue(qid)}
        if records:
            self.records[qid] = records
            log.info("%d parked or sequenced keys on queue %d", len(records), qid)
        else:
            self.records.pop(qid, None)

    def forget(self, qid: int) -> None:
        self.records.pop(qid, None)

    async def close(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    # the engine's hooks ------------------------------------------------------------------------

    def exhausted(self, job: UpstreamJob, reason: str) -> bool:
        """``job`` used up its retries under its topic's ``on_exhausted`` (park or dead_letter_key). True
        when parking took it (parked); False when it is to be dead-lettered (for dead_letter_key, its
        key is sequenced from now on)."""
        key = key_text(job.order_key) if job.order_key is not None else None
        if key is None or not self._pull_chain:
            return False  # no key to keep whole, or nowhere to park: dead-lettered as usual
        policy = job.consumer.config.on_exhausted
        if policy == "park":
            self._park(job, key, reason, "proxy")
            return True
        record = ParkRecord(job.qid, key, job.offset, reason, job.attempts, SEQUENCED, now_ms())
        self._remember(record)
        return False

    def arrived(self, job: UpstreamJob) -> str | None:
        """A runnable job reached the pull buffer while its queue has records. Returns ``"parked"``
        when it is held here, a dead-letter reason when its key is sequenced, None to deliver it."""
        records = self.records.get(job.qid)
        if records is None or job.order_key is None:
            return None
        record = records.get(key_text(job.order_key))
        if record is None:
            return None
        if record.parked_by == SEQUENCED:
            if record.offset is not None and job.offset >= record.offset:
                return f"sequenced: its key has offset {record.offset} in the dead letters ({record.reason})"
            return None
        if record.offset is None or record.offset == job.offset:
            self._park(job, record.key, record.reason, record.parked_by, record)
            return "parked"
        if record.offset < job.offset:  # the parked message was finished elsewhere: the park is stale
            self._forget(record)
        return None

    # operator actions --------------------------------------------------------------------------

    def act(self, action: str, key: str, qid: int | None, by: str, held: Iterable[int]) -> list[dict[str, Any]]:
        """Apply ``action`` to ``key`` on the queues this proxy reads (``held``); one entry per queue
        where the key is known: ``{"qid", "state"}`` after the action."""
        applied: list[dict[str, Any]] = []
        heads = {(job.qid, key_text(k)): job for k, job in self._heads()}
        for q in held:
            if qid is not None and q != qid:
                continue
            job = heads.get((q, key))
            if job is not None and job.state not in _SETTLED:
                # between the key gate and the pull buffer (its chain runs next): act on it when it
                # arrives, through the record, as on a key with nothing read yet
                job = None
            record = self.records.get(q, {}).get(key)
            if job is None and record is None and not (action == "park" and qid == q):
                continue
            if action == "park":
                if job is not None and job.state is not _IN_FLIGHT:
                    self._park(job, key, f"parked by {by}", by)
                elif record is None or record.parked_by == SEQUENCED:
                    self._remember(ParkRecord(q, key, None, f"parked by {by}", 0, by, now_ms()))
            elif action in ("retry", "resume"):
                if record is not None:  # a sequenced key resumes too (its dead letters replayed or purged)
                    self._forget(record)
                if job is not None and (job.state is _PARKED or action == "retry") and job.state is not _IN_FLIGHT:
                    job.attempts = 0
                    self._buffer.unhold(job)
            elif action == "skip":
                if record is not None and record.parked_by != SEQUENCED:
                    self._forget(record)
                if job is not None:
                    self._buffer.drop_head(job, f"skipped by {by}")
                    # the key's state once the dead-letter write (under way) lets its next message go
                    successor = job.next
                    applied.append({"qid": q, "state": _state(successor) if successor is not None else "idle"})
                    continue
            applied.append({"qid": q, "state": self.state_of(q, key)})
        return applied

    # views -------------------------------------------------------------------------------------

    def state_of(self, qid: int, key: str) -> str:
        for k, job in self._heads():
            if job.qid == qid and key_text(k) == key:
                return _state(job)
        record = self.records.get(qid, {}).get(key)
        return "parked" if record is not None and record.parked_by != SEQUENCED else "idle"

    def rows(self) -> list[KeyRow]:
        """Every key with an unfinished message here, and every parked key of the queues read here."""
        rows: list[KeyRow] = []
        seen: set[tuple[int, str]] = set()
        for order_key, job in self._heads():
            key = key_text(order_key)
            record = self.records.get(job.qid, {}).get(key)
            seen.add((job.qid, key))
            state = _state(job)
            rows.append({
                "key": key, "qid": job.qid, "state": state, "head_offset": job.offset, "attempts": job.attempts,
                # an action may note an error and go on (a body that is not JSON): only a stuck head's counts
                "reason": (job.last_error if state in ("parked", "failing") else None)
                or (record.reason if record is not None else None),
                "waiting": self._chain_length(order_key) - 1,
                "parked_by": record.parked_by if record is not None and state == "parked" else None,
                "parked_at_ms": record.parked_at_ms if record is not None and state == "parked" else None,
            })
        for qid, records in self.records.items():
            for record in records.values():
                if (qid, record.key) not in seen and record.parked_by != SEQUENCED:
                    rows.append(record_row(record))
        return rows

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(KEY_STATES, 0)
        for _, job in self._heads():
            counts[_state(job)] += 1
        return counts

    # records -----------------------------------------------------------------------------------

    def _park(
        self, job: UpstreamJob, key: str, reason: str, by: str, record: ParkRecord | None = None
    ) -> None:
        self._buffer.hold(job)
        job.state = _PARKED
        if record is None or record.offset != job.offset:
            record = ParkRecord(job.qid, key, job.offset, reason, job.attempts, by, now_ms())
        self._remember(record)
        log.info("parked %r: %s", job, reason)

    def _remember(self, record: ParkRecord) -> None:
        self.records.setdefault(record.qid, {})[record.key] = record
        self._write(self._store.put(record), record)

    def _forget(self, record: ParkRecord) -> None:
        records = self.records.get(record.qid)
        if records is not None and records.get(record.key) is record:
            del records[record.key]
            if not records:
                del self.records[record.qid]
        self._write(self._store.delete(record.qid, record.key), record)

    def _write(self, write: Any, record: ParkRecord) -> None:
        task = asyncio.ensure_future(_persist(write, record))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)


async def _persist(write: Any, record: ParkRecord) -> None:
    try:
        await write
    except DdmqError as exc:  # the in-memory state holds; the next holder may not see it
        log.warning("writing the park of %r on queue %d failed: %s", record.key, record.qid, exc)


def record_row(record: ParkRecord) -> KeyRow:
    """A parked key with no message read here (its queue held by nobody, or on hold)."""
    return {
        "key": record.key, "qid": record.qid, "state": "parked", "head_offset": record.offset,
        "attempts": record.attempts, "reason": record.reason, "waiting": None,
        "parked_by": record.parked_by, "parked_at_ms": record.parked_at_ms,
    }


def _state(job: UpstreamJob) -> str:
    if job.state is _PARKED:
        return "parked"
    # ``attempts`` counts deliveries (a release takes its own back): more than the current one means
    # the head failed or timed out before.
    in_flight = job.state is _IN_FLIGHT
    if job.state is JobState.RETRY_WAIT or job.attempts > (1 if in_flight else 0):
        return "failing"
    return "in_flight" if in_flight else "waiting"
