"""ReadLink: a queue reader's own Redis connection while its queue keeps it reading.

:meth:`~ddmq.proxy.store.broker.Broker.read` sends ``XREAD`` after ``XREAD`` on it, without redis-py's
per-command path (taking a connection from the pool and checking it, the retry wrapper, the
observability hooks, giving it back: about as much Python per read as decoding the batch). The reader
gives it back when it goes to wait with the idle queues, when its consumer had no room for a whole
block, or when it stops (:meth:`ReadLinks.drop`); after a failed or cancelled read it is closed and given
back at once (its state is unknown), and the next read takes another from the pool, which the broker's
:class:`~ddmq.proxy.store.broker.ConnectionCounter` counts like any new connection. One server only:
on a Redis Cluster reads keep redis-py's path.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from redis.asyncio.connection import AbstractConnection, ConnectionPool
from redis.typing import EncodableT

__all__ = ["ReadLink", "ReadLinks", "give_back"]


async def give_back(pool: ConnectionPool, connection: AbstractConnection, close: bool = True) -> None:
    """Hand a connection taken from ``pool`` back to it, closed first with ``close`` (its state unknown)."""
    try:
        if close:
            await connection.disconnect()
    finally:
        with contextlib.suppress(KeyError):  # the pool was reset meanwhile (the client closed)
            await pool.release(connection)


class ReadLink:
    """One reader's connection, or None while it holds none."""

    __slots__ = ("connection",)

    def __init__(self) -> None:
        self.connection: AbstractConnection | None = None


class ReadLinks:
    """Reads on links, and their connections handed back to ``pool`` (None on a cluster: no link is
    ever given a connection there)."""

    def __init__(self, pool: ConnectionPool | None) -> None:
        self._pool = pool
        self._releasing: set[asyncio.Task[None]] = set()

    async def xread(self, link: ReadLink, args: tuple[EncodableT, ...]) -> Any:
        """``XREAD args`` on ``link``'s connection (taken from the pool first when it holds none); the
        server's reply as it is."""
        connection = link.connection
        if connection is None:
            assert self._pool is not None, "no reads on links on a cluster"
            connection = link.connection = await self._pool.get_connection()
        try:
            await connection.send_command("XREAD", *args)
            return await connection.read_response()
        except BaseException:
            self.drop(link, close=True)
            raise

    def drop(self, link: ReadLink, close: bool = False) -> None:
        """Hand ``link``'s connection back to the pool (closed first with ``close``), if it holds one.
        Not a coroutine, so a reader being cancelled can call it: a task does the handing back."""
        connection, link.connection = link.connection, None
        if connection is None:
            return
        task = asyncio.create_task(self._give_back(connection, close), name="read-link-release")
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _give_back(self, connection: AbstractConnection, close: bool) -> None:
        assert self._pool is not None
        await give_back(self._pool, connection, close)

    async def close(self) -> None:
        """Wait until every connection being handed back is back."""
        while self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
