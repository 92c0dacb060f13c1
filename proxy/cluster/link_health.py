"""LinkHealth: whether this proxy reaches Redis, as its upkeep's rounds find it, said once each way.

Every round of the upkeep heartbeats (and every ``renew_ms`` renews) in one call; when that call
fails, times out or takes longer than ``slow_ms``, the proxy is cut off from Redis or about to be:
it cannot renew its leases or claim queues, and serves what it holds only until those leases lapse.
An operator needs to hear that once, when it starts, with what the proxy stops doing, and once when it
is over; not a line per queue per retry. The readers' own failures stay at DEBUG after their first.
``/metrics`` has the same state (``ddmq_redis_reachable``, ``ddmq_redis_failures_total``,
``ddmq_redis_slow_rounds_total``, ``ddmq_redis_round_seconds``) and an alert rule watches it.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

__all__ = ["LinkHealth"]


class LinkHealth:
    """The state of the link to ``where`` (a Redis URL as it may be shown)."""

    def __init__(self, where: str = "redis", slow_ms: int = 500) -> None:
        self.where = where
        self.slow_s = slow_ms / 1000
        #: False from the first failed round until one goes through.
        self.reachable = True
        self.slow = False
        #: Rounds that failed, and rounds slower than ``slow_ms``, since the start.
        self.failures = 0
        self.slow_rounds = 0
        #: How long the last round took (seconds).
        self.last_round_s = 0.0
        self._since: float | None = None
        self._lapsed_said = False

    def failed(self, error: BaseException, held: int, lease_s: float) -> None:
        """A round's call failed (``held``: the leases this proxy holds, valid at most ``lease_s`` more)."""
        self.failures += 1
        if not self.reachable:
            return
        self.reachable = False
        self._since = time.monotonic()
        self._lapsed_said = False
        log.warning("%s unreachable (%s): not renewing leases nor claiming queues; the %d queue(s) held are "
                    "served until their leases lapse (within %.0fs), then none until Redis answers",
                    self.where, _short(error), held, lease_s)

    def lapsed(self, queues: list[str]) -> None:
        """While cut off, the leases of ``queues`` stopped counting: they are no longer served."""
        if self.reachable or self._lapsed_said or not queues:
            return
        self._lapsed_said = True
        shown = ", ".join(queues[:8]) + (f" and {len(queues) - 8} more" if len(queues) > 8 else "")
        log.warning("%s still unreachable: leases unconfirmed, no longer serving %s", self.where, shown)

    def answered(self, took_s: float) -> None:
        """A round went through in ``took_s`` seconds."""
        self.last_round_s = took_s
        if not self.reachable:
            self.reachable = True
            away = time.monotonic() - self._since if self._since is not None else 0.0
            log.info("%s answers again after %.1fs: renewing leases and claiming queues", self.where, away)
        if took_s > self.slow_s:
            self.slow_rounds += 1
            if not self.slow:
                self.slow = True
                log.warning("%s is slow: a heartbeat round took %.2fs (slow_ms is %.0f); leases lapse if rounds "
                            "take longer than the lease TTL", self.where, took_s, self.slow_s * 1000)
        elif self.slow:
            self.slow = False
            log.info("%s answers in time again (%.3fs a round)", self.where, took_s)


def _short(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text if len(text) <= 200 else text[:200] + "..."
