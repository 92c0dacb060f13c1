"""Breaker: a group and topic's judge of failure storms (``breaker`` in its config, off by default).

It is fed the outcomes of pulled messages' attempts: acks (:mod:`ddmq.proxy.api.results`), fails and
timeouts (:meth:`~ddmq.proxy.engine.redelivery.Redelivery.failed_attempt`). Three states:

- *closed*: it keeps the latest ``window`` outcomes; once it holds ``min_attempts`` of them and the
  failures among them reach ``failure_share``, it opens;
- *open*: the topic hands out nothing and its failed attempts count nothing (a fail or timeout sends the
  message back to wait as its key's head, so the key's order holds); after ``open_ms`` it half-opens;
- *half-open*: at most ``probe`` messages are out at a time (keys' heads, or their ordered runs
  within that count, so each key's order holds), their attempts uncounted too; ``probe`` successes
  in a row close it (the window starts empty), one failure opens it again for twice as long as
  before (at most ``max_open_ms``).

Each proxy judges the queues it serves: the outcomes are its own and the state is not shared, so a
proxy whose clients fail opens alone, and a queue that moves to another proxy is judged there afresh.
The breaker is a state machine only; who holds the topic when it opens is told through ``changed``,
the probes it lets out are counted down in ``allowance`` (shared with the pull buffer's delivery,
which hands out no more than it says), and the time comes from ``clock`` (monotonic seconds), so
tests drive it by hand.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from enum import Enum
from typing import Final, Protocol

__all__ = ["Breaker", "BreakerSettings", "BreakerState"]

log: Final = logging.getLogger(__name__)


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class BreakerSettings(Protocol):
    """What the breaker reads of its topic's ``breaker`` settings (``ddmq.config.schema.BreakerConfig``)."""

    @property
    def window(self) -> int: ...
    @property
    def failure_share(self) -> float: ...
    @property
    def min_attempts(self) -> int: ...
    @property
    def probe(self) -> int: ...
    @property
    def open_ms(self) -> int: ...
    @property
    def max_open_ms(self) -> int: ...


class Breaker:
    """One group and topic's breaker on this proxy. ``changed(breaker)`` is called after every
    transition (the log line is written here, one per transition) and when a success half-open lets
    another probe out."""

    def __init__(
        self,
        group: str,
        topic: str,
        settings: BreakerSettings,
        changed: Callable[[Breaker], None],
        allowance: dict[str, int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self.topic = topic
        self.settings = settings
        self._changed = changed
        #: topic -> probes that may still go out while half-open (the delivery counts it down).
        self._allowance = allowance
        self._clock = clock
        self.state = BreakerState.CLOSED
        #: The latest outcomes while closed, True for a failure.
        self._outcomes: deque[bool] = deque(maxlen=settings.window)
        self._failures = 0
        #: Successes in a row while half-open.
        self.probes_ok = 0
        #: How long the current (or next) opening lasts, in ms: doubled on every failed probe.
        self.open_for_ms = settings.open_ms
        #: When (this clock) an open breaker half-opens.
        self.open_until = 0.0
        #: When the current state began (this clock).
        self.since = clock()
        #: Transitions by the state they went to (a counter: exported as such).
        self.transitions: Counter[str] = Counter()
        #: Why it last opened.
        self.why = ""

    @property
    def holds(self) -> bool:
        """Whether the topic's failed attempts count nothing now (open or half-open)."""
        return self.state is not BreakerState.CLOSED

    @property
    def age_s(self) -> float:
        """Seconds in the current state."""
        return self._clock() - self.since

    @property
    def failure_share(self) -> float:
        """The failures' share of the window (closed); 0 when it is empty."""
        return self._failures / len(self._outcomes) if self._outcomes else 0.0

    def succeeded(self, count: int = 1) -> None:
        """``count`` attempts succeeded (acks)."""
        if self.state is BreakerState.CLOSED:
            for _ in range(min(count, self.settings.window)):
                self._record(False)
        elif self.state is BreakerState.HALF_OPEN:
            self.probes_ok += count
            if self.probes_ok >= self.settings.probe:
                self._close()
            else:  # room for as many more: a few out at a time, not a few in all
                self._allowance[self.topic] = min(self._allowance.get(self.topic, 0) + count, self.settings.probe)
                self._changed(self)
        # Open: answers for what went out before it opened tell nothing of the downstream now.

    def failed(self, reason: str = "") -> None:
        """An attempt failed (a fail or a timeout)."""
        if self.state is BreakerState.CLOSED:
            self._record(True)
            settings = self.settings
            if len(self._outcomes) >= settings.min_attempts and self.failure_share >= settings.failure_share:
                self._open(f"{self._failures} of the last {len(self._outcomes)} attempts failed"
                           f"{f' (last: {reason[:200]})' if reason else ''}")
        elif self.state is BreakerState.HALF_OPEN:
            self.open_for_ms = min(self.open_for_ms * 2, self.settings.max_open_ms)
            self._open(f"a probe failed{f' ({reason[:200]})' if reason else ''}")

    def tick(self, now: float | None = None) -> None:
        """Half-open an open breaker whose time is up (``now``: this clock, or the clock's now)."""
        if self.state is BreakerState.OPEN and (self._clock() if now is None else now) >= self.open_until:
            self._enter(BreakerState.HALF_OPEN)
            self.probes_ok = 0
            self._allowance[self.topic] = self.settings.probe
            log.warning("%s/%s: breaker half-open: probing with %d message(s) at a time", self.group, self.topic,
                        self.settings.probe)
            self._changed(self)

    def _record(self, failure: bool) -> None:
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen and outcomes[0]:
            self._failures -= 1
        outcomes.append(failure)
        self._failures += failure

    def _open(self, why: str) -> None:
        self._enter(BreakerState.OPEN)
        self.why = why
        self.open_until = self.since + self.open_for_ms / 1000
        log.warning("%s/%s: breaker open for %d ms: %s; pulls get nothing, failed attempts count nothing",
                    self.group, self.topic, self.open_for_ms, why)
        self._changed(self)

    def _close(self) -> None:
        self._enter(BreakerState.CLOSED)
        self._outcomes.clear()
        self._failures = 0
        self.open_for_ms = self.settings.open_ms
        log.warning("%s/%s: breaker closed: %d probe(s) in a row succeeded", self.group, self.topic, self.probes_ok)
        self._changed(self)

    def _enter(self, state: BreakerState) -> None:
        if state is not BreakerState.HALF_OPEN:
            self._allowance.pop(self.topic, None)
        self.state = state
        self.since = self._clock()
        self.transitions[state.value] += 1
