"""How fast a topic's work may go: the token bucket behind its rate limits.

A topic's ``max_tps`` paces its readers and ``AsyncHttp``'s ``http_max_tps`` its requests; both take
tokens from a :class:`TokenBucket`. It lives with the actions, the lowest layer of the server side that
paces anything, so the engine's readers above use the same one.
"""

from __future__ import annotations

import asyncio
import time

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` tokens per second, bursts up to one second's worth; shared by a topic's readers."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self._tokens = self.capacity
        self._stamp = time.monotonic()

    async def take(self, wanted: int) -> int:
        """Wait for at least one token; take up to ``wanted``. Returns how many were taken."""
        while True:
            now = time.monotonic()
            self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            if self._tokens >= 1:
                granted = min(wanted, int(self._tokens))
                self._tokens -= granted
                return granted
            await asyncio.sleep((1 - self._tokens) / self.rate)
