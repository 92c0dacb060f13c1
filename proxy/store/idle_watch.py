"""IdleWatcher: one blocking ``XREAD`` over many idle queues instead of one per queue.

A queue reader whose blocking read of its own stream came back empty waits here
(:meth:`IdleWatcher.wait`) instead of blocking on its stream again. The watcher sends one
``XREAD COUNT 1 BLOCK <ms> STREAMS s1 .. sN id1 .. idN`` over the streams waited on, at most
``chunk`` streams per call, each chunk's call on a connection of its own (taken from the client's
pool and kept while the chunk has streams), and wakes exactly the waiters whose streams answered.
It only says *that* a stream holds something after an id; the reader then reads it itself, with the
same decoding, foreign-entry, gap, rollback and lease checks as any read. An idle proxy thus sends
``ceil(idle queues / chunk)`` reads per block period (8,000 queues, chunks of 512: 16 a second) and
holds that many connections, where one blocking read per queue sent 8,000 and could hold 8,000.

Each waiter names its own id (the last offset its reader read), never ``$``: an entry appended between
the reader's empty read and its wait is after that id, so the next call answers at once and nothing is
missed. Two readers of one stream (two groups) share its place in the call under the lower id.

A call in flight does not name a stream that starts waiting after it was sent. Rather than leave that
stream unwatched until the call's block ends, the watcher ends the call with ``CLIENT UNBLOCK <id>``
from another connection (the call returns as if timed out) and sends the next one, so a queue that
goes idle is watched within a round trip or two. The unblock is retried for a few milliseconds when it
finds the call not blocked yet (still on its way); if Redis refuses ``CLIENT`` (an ACL), the newcomer
waits for the block to end (at most ``block_ms``) and the watcher says so once. A chunk whose waiters
all left (their readers stopped: lease lost, hand-off, shutdown) is ended the same way, freeing its
connection. A waiter leaving needs nothing of Redis: cancelling :meth:`wait` is prompt.

A failed call (Redis down, a connection lost, an error reply) fails every waiter of its chunk with
:class:`BrokerError` and gives its connection back to the pool: the readers go through their failure
path, which checks the stream is intact (Redis may have restarted without its last writes) before
reading on, exactly as after a failed read of their own.

One server only: a Redis Cluster refuses a multi-key ``XREAD`` across slots, and every queue has a slot
of its own (``{<topic>:<qid>}``), so there is nothing to group; :class:`~ddmq.proxy.store.broker.Broker`
makes no watcher there and its readers block on their own streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import REDIS_FAILURES
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.core.supervise import note_restart
from ddmq.proxy.store.read_link import give_back

log = logging.getLogger(__name__)

#: What CLIENT UNBLOCK raises when it fails: redis-py's errors, or the proxy client's BrokerError.
_UNBLOCK_FAILURES: tuple[type[Exception], ...] = (*REDIS_FAILURES, BrokerError)

__all__ = ["CHUNK_STREAMS", "WATCH_BLOCK_MS", "IdleWatcher"]

#: How long one watching call blocks. Newcomers and leavers interrupt it, so this bounds only the idle
#: cost (calls per second = chunks / block) and stays well under any client socket timeout.
WATCH_BLOCK_MS = 1000
#: Streams named by one call: a larger chunk means fewer calls and connections, a smaller one a cheaper
#: call to send again after each answer or newcomer (Redis registers the client on every key it names).
CHUNK_STREAMS = 512
#: Pauses between unblock attempts that found the call not blocked yet (on its way to Redis), seconds.
_UNBLOCK_PAUSES = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016)


class _Link:
    """A connection held by the watcher, and its id on the server (for ``CLIENT UNBLOCK``)."""

    __slots__ = ("client_id", "connection")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.client_id: int | None = None


class _Chunk:
    """Up to ``chunk`` streams watched by one call at a time."""

    __slots__ = ("call", "generation", "interrupting", "link", "sent", "task", "waiters")

    def __init__(self) -> None:
        #: stream -> (after, future) of each reader waiting on it
        self.waiters: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        #: stream -> id of the call in flight (None: no call in flight)
        self.sent: dict[str, int] | None = None
        #: counts calls, so an unblock meant for one call never ends a later one
        self.generation = 0
        self.interrupting = False
        self.link: _Link | None = None
        self.task: asyncio.Task[None] | None = None
        #: The next call's streams and its packed command, while ``waiters`` has not changed (None: build
        #: them again). An idle chunk sends the same call every block period.
        self.call: tuple[dict[str, int], list[bytes]] | None = None


class IdleWatcher:
    """Wakes readers of idle streams, watching them all with one blocking ``XREAD`` per ``chunk`` streams.

    >>> watcher = IdleWatcher(redis)
    >>> await watcher.wait("ddmq:{rides:3}:q", 41)   # returns once the stream has an entry after 0-41
    """

    def __init__(self, redis: Redis, block_ms: int = WATCH_BLOCK_MS, chunk: int = CHUNK_STREAMS) -> None:
        if block_ms <= 0 or chunk <= 0:
            raise ValueError(f"IdleWatcher needs a positive block_ms and chunk, not {block_ms} and {chunk}")
        self._redis = redis
        self.block_ms = block_ms
        self.chunk = chunk
        self._chunks: list[_Chunk] = []
        self._where: dict[str, _Chunk] = {}
        self._spare: list[_Link] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._can_unblock = True
        self._closed = False
        #: Watching calls sent so far.
        self.calls = 0

    @property
    def streams(self) -> int:
        """How many streams are watched now."""
        return len(self._where)

    @property
    def connections(self) -> int:
        """How many watching calls can be in flight now (one connection each)."""
        return len(self._chunks)

    async def wait(self, stream: str, after: int) -> None:
        """Return once ``stream`` holds an entry with an id above ``0-<after>``. Raises
        :class:`BrokerError` when the watch failed (Redis down, a connection lost): the caller then
        treats its stream like after a failed read."""
        if self._closed:
            raise BrokerError("the idle watcher is closed")
        chunk = self._where.get(stream)
        if chunk is None:
            chunk = self._where[stream] = self._room()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        chunk.waiters.setdefault(stream, []).append((after, future))
        chunk.call = None
        sent = chunk.sent
        if chunk.task is None:
            chunk.task = asyncio.create_task(self._watch(chunk), name="idle-watch")
        elif sent is not None and (stream not in sent or after < sent[stream]):
            self._interrupt(chunk)
        try:
            await future
        finally:
            if not future.done() or future.cancelled():
                self._leave(chunk, stream, future)

    def _room(self) -> _Chunk:
        for chunk in self._chunks:
            if len(chunk.waiters) < self.chunk:
                return chunk
        chunk = _Chunk()
        self._chunks.append(chunk)
        return chunk

    def _leave(self, chunk: _Chunk, stream: str, future: asyncio.Future[None]) -> None:
        waiters = chunk.waiters.get(stream)
        if waiters is None:
            return
        waiters[:] = [waiter for waiter in waiters if waiter[1] is not future]
        chunk.call = None
        if waiters:
            return
        del chunk.waiters[stream]
        if self._where.get(stream) is chunk:
            del self._where[stream]
        if not chunk.waiters and chunk.sent is not None:
            self._interrupt(chunk)  # nobody left: end the call and free its connection now

    async def _watch(self, chunk: _Chunk) -> None:
        link: _Link | None = None
        failed: BaseException | None = None
        try:
            link = chunk.link = await self._link()
            while chunk.waiters and not self._closed:
                call = chunk.call
                if call is None:
                    call = chunk.call = self._call(link, chunk)
                streams, packed = call
                chunk.sent, chunk.interrupting = streams, False
                chunk.generation += 1
                try:
                    answered = await self._xread(link, packed)
                finally:
                    chunk.sent = None
                for stream in answered:
                    self._wake(chunk, stream, None)
        except REDIS_FAILURES as exc:
            failed = exc
        except Exception as exc:  # not Redis's: its waiters read on their own, and the next wait starts a new call
            note_restart("idle-watcher", f"idle watch of {len(chunk.waiters)} stream(s)", exc, 0.0)
            failed = exc
        except asyncio.CancelledError as exc:  # closing: nobody may be left waiting
            failed = exc
            raise
        finally:
            self._end(chunk, link, failed)

    def _end(self, chunk: _Chunk, link: _Link | None, failed: BaseException | None) -> None:
        """Chunk done: its waiters failed if any are left, its connection kept or handed back."""
        self._chunks.remove(chunk)
        chunk.task = chunk.link = None
        if self._closed or failed is None or isinstance(failed, asyncio.CancelledError):
            error = BrokerError("the idle watcher is closed")
        else:
            error = BrokerError(f"redis failed while watching idle queues: {failed}")
            log.debug("idle watch of %d stream(s) failed: %s", len(chunk.waiters), failed)
        for stream in list(chunk.waiters):
            self._wake(chunk, stream, error)
        if link is None:
            return
        if failed is None and not self._closed:
            self._spare.append(link)
        else:
            self._release(link)

    def _wake(self, chunk: _Chunk, stream: str, error: BaseException | None) -> None:
        chunk.call = None
        for _, future in chunk.waiters.pop(stream, ()):
            if not future.done():
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)
        if self._where.get(stream) is chunk:
            del self._where[stream]

    async def _link(self) -> _Link:
        """A connected connection of the watcher's own, its server-side id known when Redis tells it."""
        link = self._spare.pop() if self._spare else _Link(await self._redis.connection_pool.get_connection())
        connection = link.connection
        try:
            if not connection.is_connected or link.client_id is None:
                await connection.connect()
                link.client_id = None
                if self._can_unblock:
                    await connection.send_command("CLIENT", "ID")
                    link.client_id = int(await connection.read_response())
        except ResponseError as exc:
            self._refuse_unblock(exc)
        except BaseException:
            self._release(link)
            raise
        return link

    def _call(self, link: _Link, chunk: _Chunk) -> tuple[dict[str, int], list[bytes]]:
        """The streams ``chunk``'s waiters wait on (each after the oldest id one of them has seen), and
        the blocking ``XREAD`` over them, packed."""
        streams = {stream: min(after for after, _ in waiters) for stream, waiters in chunk.waiters.items()}
        ids = [keys.stream_id_after(after) for after in streams.values()]
        packed = link.connection.pack_command("XREAD", "COUNT", 1, "BLOCK", self.block_ms, "STREAMS", *streams, *ids)
        return streams, packed

    async def _xread(self, link: _Link, packed: list[bytes]) -> list[str]:
        """One blocking call (packed by :meth:`_call`); the streams that answered."""
        connection = link.connection
        self.calls += 1
        await connection.send_packed_command(packed)
        reply = await connection.read_response()
        if not reply:
            return []
        answered = reply.keys() if isinstance(reply, dict) else [page[0] for page in reply]
        return [name.decode() if isinstance(name, bytes) else name for name in answered]

    def _interrupt(self, chunk: _Chunk) -> None:
        """End ``chunk``'s call in flight, so the next one names who waits now."""
        link = chunk.link
        if chunk.interrupting or not self._can_unblock or link is None or link.client_id is None:
            return
        chunk.interrupting = True
        task = asyncio.create_task(self._unblock(chunk, chunk.generation, link.client_id), name="idle-unblock")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unblock(self, chunk: _Chunk, generation: int, client_id: int) -> None:
        for pause in (*_UNBLOCK_PAUSES, None):
            if chunk.generation != generation or chunk.sent is None:
                return  # that call ended: the next one names every waiter
            try:
                if await self._redis.client_unblock(client_id):
                    return
            except _UNBLOCK_FAILURES as exc:
                refused = exc.__cause__ if isinstance(exc, BrokerError) else exc
                if isinstance(refused, ResponseError):
                    self._refuse_unblock(refused)
                return  # else the call itself fails too, and says so to its waiters
            if pause is None:
                return  # never seen blocked: the newcomers wait for the block to end
            await asyncio.sleep(pause)  # not blocked yet: the call is still on its way to Redis

    def _refuse_unblock(self, exc: ResponseError) -> None:
        if self._can_unblock:
            self._can_unblock = False
            log.warning("Redis refuses CLIENT ID/UNBLOCK (%s): a queue that goes idle is watched once the "
                        "current watching call ends (up to %d ms later)", exc, self.block_ms)

    def _release(self, link: _Link) -> None:
        """Hand ``link``'s connection back to the pool, closed (its state is unknown)."""
        task = asyncio.create_task(give_back(self._redis.connection_pool, link.connection), name="idle-watch-release")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop watching (every waiter left gets :class:`BrokerError`) and hand the connections back."""
        self._closed = True
        tasks = [chunk.task for chunk in self._chunks if chunk.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for chunk in list(self._chunks):  # cancelled before it ever ran
            self._end(chunk, None, asyncio.CancelledError())
        spare, self._spare = self._spare, []
        for link in spare:
            with contextlib.suppress(KeyError):
                await self._redis.connection_pool.release(link.connection)
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
