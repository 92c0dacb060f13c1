"""ThriftServer: DDMQ's ``ConsumerService`` over framed compact Thrift, in front of a ConsumeService.

A thin adapter: it reads frames, decodes them with :mod:`ddmq.protocol.wire` and hands each call to a
:class:`~ddmq.proxy.servers.thrift.handler.ThriftHandler`, which calls one method of the
:class:`~ddmq.proxy.api.surface.ConsumeService` and encodes the answer. This module owns the connections and
frames; request rules, ordering, offsets and retries live behind the service. Built on a
:class:`~ddmq.proxy.servers.listener.Listener` and a protocol of its own
(:class:`~ddmq.proxy.servers.thrift.channel.FrameChannel`) rather than thriftpy2's server so that every
frame is size-checked before it is buffered and every payload is decoded by the bounded reader.

Per connection, requests are served one after another (a long-poll ``pull`` holds its connection);
connections are served concurrently. A frame whose declared length is not in ``1..max_frame_bytes``
or whose payload does not decode closes that connection only. Limits, each closing the connection
that breaks it (logged): ``max_connections`` open at once (at the limit a new connection takes the
place of one past its deadline, inside a frame, or idle, oldest first: see
:class:`~ddmq.proxy.servers.listener.Evictions`; with every one busy it is closed at once); ``allowed_clients``
(networks a peer must be in); ``idle_timeout_ms`` without a request (a call being served, a long
poll included, is not idle);
``frame_timeout_ms`` for a frame whose first byte arrived to arrive whole, and for a reply to be
taken by the client; ``max_buffered_bytes`` for the frames above :data:`INLINE_DECODE_MAX_BYTES`
being read or decoded at once, over all connections (a frame waits for room within its
``frame_timeout_ms``).

>>> async with ThriftServer(service.endpoint(30_000), "0.0.0.0", 9713, max_frame_bytes=1 << 20):
...     await stop.wait()
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Final, cast

from ddmq.protocol.wire import DEFAULT_MAX_FRAME_BYTES, FRAME_HEADER_BYTES, Envelope, decode
from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS, ConsumeService
from ddmq.proxy.servers.byte_budget import ByteBudget
from ddmq.proxy.servers.clients import ClientTracker
from ddmq.proxy.servers.listener import Evictions, Listener, parse_networks
from ddmq.proxy.servers.thrift.channel import FrameChannel
from ddmq.proxy.servers.thrift.frame_loop import (
    BUSY,
    FRAME,
    IDLE,
    INLINE_DECODE_MAX_BYTES,
    REPLY,
    Connection,
    FrameLoop,
)
from ddmq.proxy.servers.thrift.handler import ThriftHandler, args_for

__all__ = ["INLINE_DECODE_MAX_BYTES", "ThriftServer"]

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS: Final = 1000
DEFAULT_IDLE_TIMEOUT_MS: Final = 60_000
DEFAULT_FRAME_TIMEOUT_MS: Final = 10_000
DEFAULT_MAX_BUFFERED_BYTES: Final = 64 * 1024 * 1024

# What the log says a connection was doing when its deadline passed, or it made room for another.
_EXPIRED: Final = {
    IDLE: "no request within idle_timeout_ms",
    FRAME: "the frame did not arrive whole within frame_timeout_ms",
    REPLY: "the reply was not taken within frame_timeout_ms",
}
_DOING: Final = {IDLE: "an idle", FRAME: "a half-sent", REPLY: "a stalled", BUSY: "a busy"}


class ThriftServer:
    """Serves ``ConsumerService`` (pull, submit, getConsumeStats, fetch, ack) on one port.

    ``port=0`` binds a free port; read it back from :attr:`port` after :meth:`start`. Counters for
    metrics: :attr:`connections` (accepted so far), :attr:`frames_rejected` (bad length),
    :attr:`decode_errors` (undecodable payload), :attr:`timeouts` (closed by a timeout),
    :attr:`connections_refused` and :attr:`accept_errors` (from the listener).
    """

    def __init__(
        self,
        service: ConsumeService,
        host: str,
        port: int,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        frame_timeout_ms: int = DEFAULT_FRAME_TIMEOUT_MS,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
        allowed_clients: Sequence[str] | None = None,
        clients: ClientTracker | None = None,
    ) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be positive, got {max_frame_bytes}")
        if idle_timeout_ms < 1 or frame_timeout_ms < 1:
            raise ValueError("idle_timeout_ms and frame_timeout_ms must be positive")
        if max_buffered_bytes < max_frame_bytes:
            raise ValueError(f"max_buffered_bytes ({max_buffered_bytes}) must hold one frame of max_frame_bytes")
        self._handler = ThriftHandler(service, clients)
        self._idle_s = idle_timeout_ms / 1000
        self._frame_s = frame_timeout_ms / 1000
        self._frames = FrameLoop(self._handler, max_frame_bytes, self._idle_s, self._frame_s, self._read_big_frame)
        self._host = host
        self._budget = ByteBudget(max_buffered_bytes)
        # One big frame decoded at a time: each decoding thread takes the GIL from the loop, so
        # several at once would slow every other connection's requests that many times over.
        self._decoding = asyncio.Semaphore(1)
        allowed = parse_networks(allowed_clients) if allowed_clients is not None else None
        self._listener = Listener(
            "thrift", host, port, max_connections, self._accepted, make_room=self._make_room, allowed=allowed
        )
        self._started = False
        self._closing = False
        self._connections: dict[asyncio.Task[None], Connection] = {}
        self._evictions = Evictions(self._connections.values, frozenset({FRAME}), IDLE)
        self._sweeper: asyncio.Task[None] | None = None
        self.connections = 0
        self.timeouts = 0

    # lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("ThriftServer.start() called twice")
        self._started = True
        await self._listener.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="thrift-timeouts")
        log.info("thrift server listening on %s:%d", self._host, self.port)

    async def close(self) -> None:
        """Stop listening and drop every connection (an in-flight call is cancelled)."""
        if not self._started or self._closing:
            return
        self._closing = True
        await self._listener.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [*self._connections, *([self._sweeper] if self._sweeper else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        log.info("thrift server closed")

    @property
    def port(self) -> int:
        """The bound port (the chosen one when constructed with port 0)."""
        return self._listener.port

    @property
    def frames_rejected(self) -> int:
        """Frames whose declared length was outside ``1..max_frame_bytes`` (each closed its connection)."""
        return self._frames.frames_rejected

    @property
    def decode_errors(self) -> int:
        """Payloads that did not decode (each closed its connection)."""
        return self._frames.decode_errors

    @property
    def active_connections(self) -> int:
        return len(self._connections)

    @property
    def connections_refused(self) -> int:
        return self._listener.refused

    @property
    def accept_errors(self) -> int:
        return self._listener.accept_errors

    def stats(self) -> dict[str, int]:
        """Counters (accepted, refused, evicted, not_allowed, accept_errors, timeouts, frames_rejected,
        decode_errors) and gauges (open, buffered_bytes), for metrics."""
        return {
            "open": self.active_connections,
            "accepted": self._listener.accepted,
            "refused": self._listener.refused,
            "evicted": self._listener.evicted,
            "not_allowed": self._listener.not_allowed,
            "accept_errors": self._listener.accept_errors,
            "timeouts": self.timeouts,
            "frames_rejected": self.frames_rejected,
            "decode_errors": self.decode_errors,
            "buffered_bytes": self._budget.used,
        }

    @property
    def buffered_bytes(self) -> int:
        """Bytes of big frames being read or decoded now (bounded by ``max_buffered_bytes``)."""
        return self._budget.used

    async def __aenter__(self) -> ThriftServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # connections -------------------------------------------------------------------------------

    def _accepted(self, sock: socket.socket) -> None:
        task = asyncio.get_running_loop().create_task(self._serve_connection(sock))
        self._connections[task] = Connection(task, _peer_name(sock))

    def _make_room(self) -> str | None:
        """At max_connections: close the connection :class:`Evictions` picks; what it was, for the log."""
        now = asyncio.get_running_loop().time()
        victim = self._evictions.pick(now)
        if victim is None:
            return None
        victim.task.cancel()
        late = " past its deadline" if victim.deadline <= now else ""
        return f"{_DOING[victim.phase]} connection from {victim.peer}{late}"

    async def _serve_connection(self, sock: socket.socket) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = self._connections[task]
        peer = connection.peer
        self.connections += 1
        channel = None
        try:
            with contextlib.suppress(OSError):  # a peer already gone: the transport says so next
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # FrameChannel is a protocol by its methods (see its docstring), which typeshed cannot see.
            _, protocol = await asyncio.get_running_loop().connect_accepted_socket(
                cast("Callable[[], asyncio.Protocol]", FrameChannel), sock
            )
            channel = cast(FrameChannel, protocol)
            log.debug("thrift connection from %s", peer)
            await self._frames.serve(channel, connection)
        except asyncio.CancelledError:
            if self._closing or (connection.expired is None and not connection.evicted):
                raise
            if connection.evicted:
                log.debug("closed thrift connection from %s to admit a new one", peer)
            else:
                self.timeouts += 1
                log.info("closing thrift connection from %s: %s", peer, connection.expired)
        except (ConnectionError, TimeoutError) as exc:
            log.debug("thrift connection from %s lost: %s", peer, exc)
        except Exception:
            log.exception("thrift connection from %s failed", peer)
        finally:
            del self._connections[task]
            self._listener.closed()
            if channel is None:
                sock.close()
            else:
                await channel.close()

    async def _sweep(self) -> None:
        """Cancel the connections past their deadline, a few times per shortest timeout."""
        loop = asyncio.get_running_loop()
        period = min(max(min(self._idle_s, self._frame_s) / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for connection in list(self._connections.values()):
                if now > connection.deadline and connection.expired is None:
                    connection.expired = _EXPIRED[connection.phase]
                    connection.task.cancel()

    async def _read_big_frame(self, channel: FrameChannel, length: int, connection: Connection) -> Envelope:
        """Read and decode a frame above INLINE_DECODE_MAX_BYTES within the byte budget; its payload is
        gone when this returns (a method of its own so that no local outlives the reservation)."""
        async with self._budget.reserve(length):
            await channel.wait_for(FRAME_HEADER_BYTES + length)
            payload = channel.take_payload(length)
            connection.phase, connection.deadline = BUSY, float("inf")
            async with self._decoding:
                return await asyncio.to_thread(decode, payload, args_for, MAX_RESULT_OFFSETS)


def _peer_name(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
