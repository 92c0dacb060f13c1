"""LeaseClock: Redis's time as this proxy knows it, and whether a lease confirmed at some moment is
still surely valid, whatever this host's clock says.

Two proxies never compare their own clocks. A lease expires in Redis (``PX``), member heartbeats are
scored with Redis's ``TIME`` inside the heartbeat script, and that script's reply carries the time
too: each round of the upkeep hands it here as a sample (loop time sent, Redis ms, loop time
answered). From the samples the clock knows

- Redis's time now (:meth:`redis_now_ms`), for whatever the proxy compares with times other hosts
  wrote (retention's idle and age checks, the read audit);
- this host's clock rate against Redis's (:attr:`rate`, local seconds per Redis second, from samples
  at least :data:`RATE_SPAN_S` apart): a lease confirmed at loop time ``t`` has been running for
  ``(now - t) / rate`` of Redis's seconds, so a host whose clock runs slow does not think its lease
  lasts longer than Redis keeps it, and one whose clock runs fast does not give up early. The upkeep
  times its rounds with it too (:meth:`local_s`).

A lease counts as valid (:meth:`valid`) while that age, plus :data:`RATE_MARGIN` of it (a rate that
changed since the last samples) and :data:`REPLY_MARGIN_S` (the time a reply takes to reach its
client), is under the TTL. Renewals are sent every ``renew_ms``, so an age past that means the upkeep
did not run: the event loop stalled or the process was paused (SIGSTOP, a VM freeze). A tick every
:data:`TICK_S` shows it: when :meth:`valid` finds the last tick older than the stall limit, every
confirmation made before that moment stops counting and ``on_stall`` asks for a renewal at once, so
nothing prepared after the pause goes out before Redis has said the lease is still ours.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

__all__ = ["RATE_MARGIN", "REPLY_MARGIN_S", "LeaseClock"]

#: A lease's age is counted this much longer than measured: covers a clock rate that drifts by up to
#: 1 % between the samples it was measured from.
RATE_MARGIN = 0.01
#: Counted on top of a lease's age: the time between the check and the client receiving the reply
#: (a twentieth of the TTL where that is less).
REPLY_MARGIN_S = 0.2
#: How often the stall detector ticks (loop seconds).
TICK_S = 0.25
#: Samples this far apart (Redis seconds) give the rate; closer ones are too noisy to use.
RATE_SPAN_S = 2.0
#: Samples kept for the rate: about a minute of heartbeats at the default claim interval.
_SAMPLES = 64
#: The quickest answer among this many of the newest (and of the oldest) samples anchors the estimate.
_ANCHOR_SAMPLES = 8
#: A measured rate outside these bounds is not believed (a clock stepped between two samples).
_RATE_BOUNDS = (0.1, 10.0)
#: The rate differs from 1 by more than this: said once in the log (and on /metrics always).
_RATE_WARNING = 0.05


class LeaseClock:
    """Redis's time and this host's rate against it, from the upkeep's samples (see the module)."""

    def __init__(self, ttl_ms: int, renew_ms: int, on_stall: Callable[[], None] | None = None) -> None:
        self.ttl_s = ttl_ms / 1000
        self._reply_margin_s = min(REPLY_MARGIN_S, self.ttl_s / 20)
        #: A loop that did not tick for this long stalled (or the process was paused): half a renewal
        #: interval, at most 2 s and at least a second (a busy loop may lag a few hundred ms).
        self.stall_s = max(1.0, min(renew_ms / 2000, 2.0))
        self.on_stall = on_stall
        #: Local seconds per Redis second (1.0 until measured).
        self.rate = 1.0
        #: (loop time, Redis ms, round trip) of recent samples, oldest first.
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=_SAMPLES)
        #: The sample Redis's time now is extrapolated from.
        self._anchor: tuple[float, float, float] | None = None
        #: Confirmations made before this loop time do not count (a stall was seen after them).
        self._valid_after = float("-inf")
        self._tick: float | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self._warned_rate = False
        #: Stalls seen so far (for /metrics).
        self.stalls = 0

    # samples ---------------------------------------------------------------------------------------

    def sample(self, sent_at: float, redis_ms: float, received_at: float) -> None:
        """Redis answered ``redis_ms`` to a call sent at loop time ``sent_at`` and answered at
        ``received_at``: it read its clock somewhere in between, the middle is the best guess, and the
        quicker the answer the better the guess (a late answer may only have been noticed late)."""
        local = (sent_at + received_at) / 2
        samples = self._samples
        if samples and (redis_ms < samples[-1][1] or local <= samples[-1][0]):
            samples.clear()  # Redis's clock went back (a restart, a failover to another host): start again
        samples.append((local, redis_ms, received_at - sent_at))
        kept = list(samples)
        self._anchor = min(kept[-_ANCHOR_SAMPLES:], key=lambda sample: (sample[2], -sample[0]))  # the newest of equals
        oldest = min(kept[:_ANCHOR_SAMPLES], key=lambda sample: (sample[2], sample[0]))
        span_s = (self._anchor[1] - oldest[1]) / 1000
        if span_s >= RATE_SPAN_S:
            rate = (self._anchor[0] - oldest[0]) / span_s
            if _RATE_BOUNDS[0] <= rate <= _RATE_BOUNDS[1]:
                self.rate = rate
                self._warn_rate()

    def _warn_rate(self) -> None:
        if abs(self.rate - 1) > _RATE_WARNING and not self._warned_rate:
            self._warned_rate = True
            log.warning("this host's clock runs at %.2f x Redis's: leases and timings follow Redis's clock "
                        "(check the host's time keeping)", self.rate)


    def redis_now_ms(self) -> int:
        """Redis's time now (ms), from the last sample; this host's wall clock until there is one."""
        if self._anchor is None:
            return int(time.time() * 1000)
        local, redis_ms, _ = self._anchor
        return int(redis_ms + (asyncio.get_running_loop().time() - local) / self.rate * 1000)

    def offset_s(self) -> float | None:
        """This host's wall clock minus Redis's (seconds), or None before the first sample."""
        if self._anchor is None:
            return None
        return time.time() - self.redis_now_ms() / 1000

    def local_s(self, redis_s: float) -> float:
        """How long to wait on this host's clock for ``redis_s`` of Redis's seconds to pass."""
        return redis_s * self.rate

    # leases ----------------------------------------------------------------------------------------

    def valid(self, confirmed_at: float) -> bool:
        """Whether a lease last confirmed by a call sent at loop time ``confirmed_at`` is surely valid."""
        now = asyncio.get_running_loop().time()
        tick = self._tick
        if tick is not None and now - tick > self.stall_s:
            self._stalled(now)
        if confirmed_at < self._valid_after:
            return False
        age_s = (now - confirmed_at) / self.rate
        return age_s * (1 + RATE_MARGIN) + self._reply_margin_s < self.ttl_s

    def _stalled(self, now: float) -> None:
        assert self._tick is not None
        log.warning("the event loop did not run for %.1fs (the process was paused or overloaded): serving "
                    "nothing until Redis confirms this proxy's leases again", now - self._tick)
        self._tick = now
        self._valid_after = now
        self.stalls += 1
        if self.on_stall is not None:
            self.on_stall()

    def start(self) -> None:
        """Tick (the stall detector) until :meth:`stop`; starting twice is harmless."""
        if self._ticker is None:
            self._on_tick()

    def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        self._tick = None

    def _on_tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._tick is not None and now - self._tick > self.stall_s:
            self._stalled(now)  # nothing asked valid() since the loop woke up: the tick tells
        self._tick = now
        self._ticker = loop.call_later(TICK_S, self._on_tick)
