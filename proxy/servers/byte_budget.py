"""ByteBudget: a cap on the request bytes buffered at once across all connections of a server.

A frame or body is read only after its size is reserved; the reservation is given back once it has
been decoded. Each connection alone is bounded by ``max_frame_bytes`` (``max_body_bytes``), but only
this bounds their sum: without it, N clients each sending most of a large frame make the proxy hold
N such frames. A reader that cannot reserve waits (its socket is not read meanwhile, so TCP pushes
back on its sender) until others give bytes back, within the caller's deadline.

>>> budget = ByteBudget(64 << 20)
>>> async with budget.reserve(length):
...     payload = await reader.readexactly(length)
...     request = decode(payload)
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class ByteBudget:
    """``capacity`` bytes shared by every reservation; waiters are served first come, first served."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.used = 0
        #: Reservations that had to wait for bytes to be given back (for metrics and tests).
        self.waits = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @asynccontextmanager
    async def reserve(self, size: int) -> AsyncIterator[None]:
        """Hold ``size`` bytes for the ``async with`` block; raises ValueError above the capacity."""
        if size > self.capacity:
            raise ValueError(f"{size} bytes exceed the whole budget of {self.capacity}")
        if self._waiters or self.used + size > self.capacity:
            self.waits += 1
            granted = asyncio.get_running_loop().create_future()
            self._waiters.append((size, granted))
            try:
                await granted
            except BaseException:
                if granted.done() and not granted.cancelled():
                    self._give_back(size)  # granted just as the wait was cancelled
                else:
                    if (size, granted) in self._waiters:
                        self._waiters.remove((size, granted))
                    self._grant()  # a big waiter leaving may let smaller ones behind it in
                raise
        else:
            self.used += size
        try:
            yield
        finally:
            self._give_back(size)

    def _give_back(self, size: int) -> None:
        self.used -= size
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            size, granted = self._waiters.popleft()
            if granted.done():  # its waiter was cancelled and has not run yet
                continue
            self.used += size
            granted.set_result(None)
