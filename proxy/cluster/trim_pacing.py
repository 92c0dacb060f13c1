"""When the trimmer looks at each queue: every round while something happens on it, less often while not.

A queue whose last probe found nothing to do (empty, or nothing to trim and its first entry and
sequence as at the probe before; or its trimmer lease held by another proxy) waits twice as many
rounds before its next probe as before, up to :data:`MAX_GAP_ROUNDS`; a probe that finds it changed,
or finds something to trim, brings it back to every round, and so does a commit of this proxy on it
(:meth:`Broker.note_commit <ddmq.proxy.store.broker.Broker.note_commit>`). A queue is probed at least every
:data:`MAX_GAP_ROUNDS` intervals of wall time too, however long the rounds take, so the trimmer lease,
renewed by each probe and lasting :func:`lease_ttl_ms`, does not lapse between two probes of a live
holder.

What that costs retention (docs/retention.md): a change nobody tells this proxy about (a produce, a
commit of another proxy, an entry growing older than ``max_age_s``) is acted on at the queue's next
probe, at most :data:`MAX_GAP_ROUNDS` rounds later, instead of at the next round.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ddmq.proxy.store.trim import Probe

#: The most rounds between two probes of a queue (and of its trimmer lease's renewals).
MAX_GAP_ROUNDS = 8
#: What a queue's probes "saw" before its first one: no probe answers this (no sequence is negative).
_NEVER = Probe(None, -1)

Queue = tuple[str, int]


def lease_ttl_ms(interval_ms: int) -> int:
    """The trimmer lease's TTL: the longest gap between two probes of its holder, two rounds more for
    a slow round, and at least 5 s. A dead holder's queues are taken over once it lapses, at another
    proxy's next probe: within this TTL and :data:`MAX_GAP_ROUNDS` rounds more."""
    return max((MAX_GAP_ROUNDS + 2) * interval_ms, 5_000)


@dataclass
class _Pace:
    #: Rounds from one probe to the next, now: 1, 2, 4 ... MAX_GAP_ROUNDS.
    gap: int = 1
    #: The round of the next probe.
    due: int = 0
    #: Monotonic time of the last probe (0: never).
    at: float = 0.0
    #: This proxy held the trimmer lease at the last probe.
    ours: bool = False
    #: What the last probe found: None when another proxy trims the queue.
    seen: Probe | None = _NEVER


class TrimPacing:
    """Per queue, when it is probed next and what its last probe found; owned by the trimmer."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_s = interval_ms / 1000
        #: Rounds begun so far.
        self.round = 0
        self._paces: dict[Queue, _Pace] = {}

    def due(self, queues: Iterable[Queue], committed: Collection[Queue]) -> list[Queue]:
        """Begin a round over ``queues`` (the ones known now; the others are forgotten): those to probe
        in it. ``committed``: the queues this proxy committed on since the last round (their gap
        starts over, from this round)."""
        now = time.monotonic()
        longest = MAX_GAP_ROUNDS * self.interval_s
        paces: dict[Queue, _Pace] = {}
        out = []
        for queue in queues:
            pace = paces[queue] = self._paces.get(queue) or _Pace(due=self.round)
            if queue in committed:
                pace.gap, pace.due = 1, self.round
            if pace.due <= self.round or now - pace.at >= longest:
                out.append(queue)
        self._paces = paces
        self.round += 1
        return out

    def probed(self, queue: Queue, found: Probe | None, busy: bool) -> None:
        """What the probe of ``queue`` in this round found (None: another proxy trims it), and whether
        there was something to trim (``busy``): when it is probed next."""
        pace = self._paces.get(queue)
        if pace is None:
            return
        pace.gap = 1 if busy or found != pace.seen else min(2 * pace.gap, MAX_GAP_ROUNDS)
        pace.due = self.round - 1 + pace.gap
        pace.at = time.monotonic()
        pace.ours = found is not None
        pace.seen = found

    def held(self, queue: Queue) -> bool:
        """This proxy held the queue's trimmer lease at its last probe."""
        pace = self._paces.get(queue)
        return pace is not None and pace.ours

    def quiet(self, queue: Queue) -> Probe | None:
        """What the last probe found of a queue this proxy trims and that was unchanged then (backed
        off); None for any other queue."""
        pace = self._paces.get(queue)
        if pace is None or not pace.ours or pace.gap == 1:
            return None
        return pace.seen

    def gap(self, queue: Queue) -> int:
        """Rounds from the queue's last probe to its next one (1 for a queue never probed)."""
        pace = self._paces.get(queue)
        return pace.gap if pace is not None else 1
