"""QueueState: what this proxy keeps of one queue of a consumer's topic, in one object, and
:class:`OwnedQueues`, a consumer's states by qid (the one owner of them).

While the queue is held, its state has the lease and when it was last confirmed, the offset tracker,
the reader and a hand-off under way; across holds it keeps the rollbacks counted (for the metrics)
and the gap to step over after a rollback (set after the queue was dropped, taken by the next reader).
Ownership (:mod:`ddmq.proxy.cluster.ownership`) claims, confirms, hands off and drops; commits
(:mod:`ddmq.proxy.cluster.commits`) read the tracker and the lease; the topic's readers take the gap
and its jobs (:class:`~ddmq.proxy.engine.topic_jobs.TopicJobs`) ask whether a lease is confirmed
before every delivery: each through the methods here, which the consumer hands them when it wires
the topic (:mod:`ddmq.proxy.groups.group`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import TYPE_CHECKING

from ddmq.proxy.cluster.lease_clock import LeaseClock
from ddmq.proxy.cluster.leases import Lease
from ddmq.proxy.engine.offsets import OffsetTracker

if TYPE_CHECKING:
    from ddmq.proxy.engine.reader import QueueReader


class QueueState:
    __slots__ = ("confirmed_at", "gap_until", "handoff", "lease", "leaving", "qid", "reader", "rollbacks", "tracker")

    def __init__(self, qid: int) -> None:
        self.qid = qid
        #: The lease held on the queue; None while this proxy does not hold it.
        self.lease: Lease | None = None
        #: Loop time before the call that last confirmed the lease (None: not confirmed).
        self.confirmed_at: float | None = None
        #: The queue's offsets, once loaded after the claim.
        self.tracker: OffsetTracker | None = None
        self.reader: QueueReader | None = None
        #: The hand-off under way (the queue is assigned elsewhere), if any.
        self.handoff: asyncio.Task[None] | None = None
        #: Being let go (a hand-off, a stop): nothing more of it is handed out, acks still count.
        self.leaving = False
        #: The sequence raised after a rollback: the next reader steps over the unused offsets up to it.
        self.gap_until: int | None = None
        #: Rollbacks of Redis detected on the queue (monotonic).
        self.rollbacks = 0


class OwnedQueues:
    """A consumer's :class:`QueueState` by qid; whether a lease still counts as confirmed is ``clock``'s
    to say (:meth:`LeaseClock.valid <ddmq.proxy.cluster.lease_clock.LeaseClock.valid>`)."""

    def __init__(self, clock: LeaseClock) -> None:
        self._clock = clock
        self._states: dict[int, QueueState] = {}
        #: Raised whenever a lease is taken or let go: a rebalance that saw this value and had nothing
        #: to do has nothing to do while it stands (and the assignment stays).
        self.leases_version = 0

    def _state(self, qid: int) -> QueueState:
        state = self._states.get(qid)
        if state is None:
            state = self._states[qid] = QueueState(qid)
        return state

    # holding -------------------------------------------------------------------------------------

    def claim(self, qid: int, lease: Lease, asked_at: float) -> None:
        """``qid`` is held under ``lease``, confirmed as of ``asked_at``."""
        state = self._state(qid)
        state.lease, state.confirmed_at = lease, asked_at
        self.leases_version += 1

    def open(self, qid: int, tracker: OffsetTracker, reader: QueueReader) -> None:
        state = self._state(qid)
        state.tracker, state.reader = tracker, reader

    def confirm(self, qid: int, lease: Lease, asked_at: float) -> None:
        """A renewal of ``lease`` succeeded: confirmed as of ``asked_at``, if the lease is still the one held."""
        state = self._states.get(qid)
        if state is not None and state.lease == lease:
            state.confirmed_at = asked_at

    def unconfirm(self, qid: int) -> None:
        state = self._states.get(qid)
        if state is not None:
            state.confirmed_at = None

    def confirmed(self, qid: int) -> bool:
        """True while the lease on ``qid`` is surely valid (its last confirmation is younger than the
        TTL by Redis's clock, with the margins, and no stall of the process came after it) and the
        queue is not being let go."""
        state = self._states.get(qid)
        if state is None or state.confirmed_at is None or state.leaving:
            return False
        return self._clock.valid(state.confirmed_at)

    def stop_serving(self, qid: int) -> None:
        """Hand out nothing more of ``qid`` (what clients hold may still be acked): it is being let go."""
        state = self._states.get(qid)
        if state is not None and state.lease is not None:
            state.leaving = True

    def take_reader(self, qid: int) -> QueueReader | None:
        """The queue's reader, no longer the queue's (the caller stops it)."""
        state = self._states.get(qid)
        if state is None:
            return None
        reader, state.reader = state.reader, None
        return reader

    def drop(self, qid: int) -> Lease | None:
        """Forget what was held of ``qid`` (its tracker is marked dropped); returns the lease it had."""
        state = self._states.get(qid)
        if state is None:
            return None
        if state.tracker is not None:
            state.tracker.dropped = True
        lease = state.lease
        state.lease = state.confirmed_at = state.tracker = state.reader = state.gap_until = None
        state.leaving = False
        self.leases_version += 1
        return lease

    # hand-offs -----------------------------------------------------------------------------------

    def handing_off(self, qid: int) -> bool:
        state = self._states.get(qid)
        return state is not None and state.handoff is not None

    def set_handoff(self, qid: int, task: asyncio.Task[None] | None) -> None:
        self._state(qid).handoff = task

    def handoffs(self) -> list[asyncio.Task[None]]:
        return [s.handoff for s in self._states.values() if s.handoff is not None]

    # reading the state ---------------------------------------------------------------------------

    def lease(self, qid: int) -> Lease | None:
        state = self._states.get(qid)
        return state.lease if state is not None else None

    def holds(self, qid: int, lease: Lease) -> bool:
        return self.lease(qid) == lease

    def tracker(self, qid: int) -> OffsetTracker | None:
        """The tracker of a queue held and opened, else None."""
        state = self._states.get(qid)
        return state.tracker if state is not None else None

    def held(self) -> dict[int, Lease]:
        """The leases held, by qid."""
        return {qid: s.lease for qid, s in self._states.items() if s.lease is not None}

    def trackers(self) -> dict[int, OffsetTracker]:
        return {qid: s.tracker for qid, s in self._states.items() if s.tracker is not None}

    def moved(self) -> bool:
        """Whether a commit point moved since it was last written. Asked of every consumer at every
        commit interval, so it builds nothing."""
        for state in self._states.values():
            tracker = state.tracker
            if tracker is not None and tracker.version != tracker.committed_version:
                return True
        return False

    def readers(self) -> list[QueueReader]:
        return [s.reader for s in self._states.values() if s.reader is not None]

    def rollbacks(self) -> Counter[int]:
        return Counter({qid: s.rollbacks for qid, s in self._states.items() if s.rollbacks})

    # rollbacks -----------------------------------------------------------------------------------

    def count_rollback(self, qid: int) -> None:
        self._state(qid).rollbacks += 1

    def set_gap(self, qid: int, upto: int) -> None:
        self._state(qid).gap_until = upto

    def take_gap(self, qid: int) -> int | None:
        """The gap to step over, once (see :attr:`QueueState.gap_until`)."""
        state = self._states.get(qid)
        if state is None or state.gap_until is None:
            return None
        gap, state.gap_until = state.gap_until, None
        return gap
