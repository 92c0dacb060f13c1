"""End-to-end latency of one group's topic on this proxy: produce to first delivery, produce to ack, and
the attempts a message took, counted into preallocated buckets as the buffer works.

A message's produce time is its entry's ``ts`` field (:mod:`ddmq.protocol.redis.stream_entry`), the
producer host's clock when it sent the message; the stream id says nothing of time (it is ``0-<offset>``).
The buffer reads "now" once per delivered batch and once per ack call, from Redis's clock as this
proxy knows it (the group is wired to :meth:`LeaseClock.redis_now_ms
<ddmq.proxy.cluster.lease_clock.LeaseClock.redis_now_ms>`), so the proxy host's own skew drops out;
the producer host's skew against Redis stays in the figure (docs/operating.md, "End-to-end latency").
A figure below 0 (a producer's clock ahead of Redis's) counts as 0, in the first bucket, and in
:attr:`EndToEnd.ahead`.

An observation is a subtraction, one bisect over integer milliseconds and two additions: no
prometheus-client call and no object per message. :class:`~ddmq.proxy.ops.collector.EngineCollector`
exports the counts (``ddmq_end_to_end_seconds``, ``ddmq_message_attempts``) and
:mod:`~ddmq.proxy.ops.views` reads quantiles from them.

>>> figures = EndToEnd()
>>> figures.delivered.observe(1_000, 1_012)       # produced at 1000 ms, delivered at 1012 ms
>>> figures.delivered.quantile(0.5)               # seconds, read off the buckets
0.0175
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

__all__ = ["ATTEMPT_BOUNDS", "LATENCY_BOUNDS_S", "Distribution", "EndToEnd"]

#: Upper bounds (seconds) of the end-to-end buckets: a few milliseconds (a caught-up group on one host)
#: to an hour (a backlog); the +Inf bucket above them.
LATENCY_BOUNDS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                           900.0, 3600.0)
#: Upper bounds of the attempts buckets (1: delivered once and acked).
ATTEMPT_BOUNDS: Final = (1, 2, 3, 4, 5, 8, 16)


class Distribution:
    """Counts of observations per bucket (not cumulative; the last: above every bound) and their sum,
    in the unit of ``bounds`` (whole numbers: the bisect compares ints). The exported unit is that over
    ``divisor``; ``les``: the buckets' ``le`` labels in it. ``counted``: the values are counts (attempts),
    whose quantile is a bucket's bound, not a point inside it."""

    __slots__ = ("bounds", "counted", "counts", "divisor", "les", "total")

    def __init__(self, bounds: tuple[int, ...], divisor: int = 1, counted: bool = False) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0
        self.divisor = divisor
        self.counted = counted
        self.les = [str(bound / divisor) for bound in bounds] + ["+Inf"]

    def observe(self, since: int, now: int) -> None:
        """One observation of ``now - since`` (at least 0)."""
        value = now - since
        if value < 0:
            value = 0
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile in the exported unit, interpolated in its bucket as Prometheus's
        ``histogram_quantile`` does (a count: the bucket's bound; the highest bound when it falls in +Inf);
        None without observations."""
        total = sum(self.counts)
        if not total:
            return None
        rank = q * total
        seen = 0
        for at, count in enumerate(self.counts):
            if count and seen + count >= rank:
                if at == len(self.bounds):
                    return self.bounds[-1] / self.divisor
                if self.counted:
                    return self.bounds[at] / self.divisor
                low = self.bounds[at - 1] if at else 0
                return (low + (self.bounds[at] - low) * (rank - seen) / count) / self.divisor
            seen += count
        return self.bounds[-1] / self.divisor


#: :data:`LATENCY_BOUNDS_S` in milliseconds, written out: compiled, a Final computed from another at import is unset.
_LATENCY_BOUNDS_MS: Final = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 300_000, 900_000,
                             3_600_000)


class EndToEnd:
    """One (group, topic)'s figures: produce to first delivery, produce to ack (milliseconds, exported
    in seconds), and the attempts of the messages acked and dead-lettered."""

    __slots__ = ("acked", "ahead", "attempts_acked", "attempts_dead", "delivered")

    def __init__(self) -> None:
        self.delivered = Distribution(_LATENCY_BOUNDS_MS, 1000)
        self.acked = Distribution(_LATENCY_BOUNDS_MS, 1000)
        self.attempts_acked = Distribution(ATTEMPT_BOUNDS, counted=True)
        self.attempts_dead = Distribution(ATTEMPT_BOUNDS, counted=True)
        #: Observations whose produce time was after "now": the producer's clock is ahead of Redis's.
        self.ahead = 0

    def first_delivery(self, produce_ms: int, now_ms: int) -> None:
        if produce_ms > 0:  # 0: an entry without a produce time (written around the produce script)
            if produce_ms > now_ms:
                self.ahead += 1
            self.delivered.observe(produce_ms, now_ms)

    def ack(self, produce_ms: int, attempts: int, now_ms: int) -> None:
        self.attempts_acked.observe(0, attempts)
        if produce_ms > 0:
            if produce_ms > now_ms:
                self.ahead += 1
            self.acked.observe(produce_ms, now_ms)

    def dead_lettered(self, attempts: int) -> None:
        self.attempts_dead.observe(0, attempts)
