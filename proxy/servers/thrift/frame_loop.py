"""FrameLoop: one Thrift connection's requests, frame by frame, and :class:`Connection`, what the
server's timeout sweep knows of each connection.

The loop runs inside the connection's task (:meth:`ThriftServer._serve_connection
<ddmq.proxy.servers.thrift.server.ThriftServer>` owns the task, its cancellation and its logging): it
waits for a frame, checks its length, decodes it and hands the call to the
:class:`~ddmq.proxy.servers.thrift.handler.ThriftHandler`, then writes the reply. It is compiled with
the hot path (``protocol/native.py``): it runs once per request, and as interpreted code each of its
steps (the channel's buffer checks, the frame's length, its payload, the write) would be a Python call.
Frames above :data:`INLINE_DECODE_MAX_BYTES` go to the server's ``big_frame`` coroutine, which holds
them to the byte budget and decodes them in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from ddmq.protocol.wire import FRAME_HEADER_BYTES, Envelope, FrameDecodeError, FrameRefusedError, decode
from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS
from ddmq.proxy.servers.thrift.channel import ChannelClosedError, FrameChannel
from ddmq.proxy.servers.thrift.handler import ThriftHandler, args_for
from ddmq.proxy.servers.thrift.wrong_protocol import answer_refused

__all__ = ["BUSY", "FRAME", "IDLE", "INLINE_DECODE_MAX_BYTES", "REPLY", "Connection", "FrameLoop"]

# The server's logger: these lines are about its connections, and operators filter on its name.
log = logging.getLogger("ddmq.proxy.servers.thrift.server")

#: Payloads above this size are decoded in a worker thread, so one big frame cannot stall the loop, and
#: count against ``max_buffered_bytes``. A pull is a few hundred bytes: pulls never wait for that budget.
INLINE_DECODE_MAX_BYTES: Final = 64 * 1024

# What a connection is doing, for the timeout sweep.
IDLE: Final = "idle"
FRAME: Final = "frame"
REPLY: Final = "reply"
BUSY: Final = "busy"

_INFINITY: Final = float("inf")


class Connection:
    """One client connection: its task and the deadline of what it is doing (the server's sweep
    cancels the task past it)."""

    def __init__(self, task: asyncio.Task[None], peer: str) -> None:
        self.task = task
        self.peer = peer
        self.phase = IDLE
        self.deadline = _INFINITY
        self.expired: str | None = None
        #: Closed to admit a new connection at max_connections.
        self.evicted = False


class FrameLoop:
    """Serves the frames of each connection it is given; counts what it refused."""

    def __init__(
        self,
        handler: ThriftHandler,
        max_frame_bytes: int,
        idle_s: float,
        frame_s: float,
        big_frame: Callable[[FrameChannel, int, Connection], Awaitable[Envelope]],
    ) -> None:
        self._handler = handler
        self._max_frame_bytes = max_frame_bytes
        self._idle_s = idle_s
        self._frame_s = frame_s
        self._big_frame = big_frame
        #: Frames whose declared length was outside ``1..max_frame_bytes``.
        self.frames_rejected = 0
        #: Payloads that did not decode.
        self.decode_errors = 0

    @staticmethod
    async def _answer_wrong_call(channel: FrameChannel, payload: bytes | None, peer: str) -> None:
        """Answer a refused client whose bytes are a call in a wrong set-up (``wrong_protocol``)."""
        call = await answer_refused(channel, payload)
        if call is not None:
            log.warning(
                "%s called %r over the %s protocol%s: answered that this port speaks framed compact",
                peer, call.name, call.protocol, "" if call.framed else " without framing",
            )

    async def serve(self, channel: FrameChannel, connection: Connection) -> None:
        """Until the peer closes or sends what closes the connection (logged here); raises what the
        connection's task handles (cancellation, a lost connection)."""
        loop = asyncio.get_running_loop()
        peer = connection.peer
        while True:
            connection.phase, connection.deadline = IDLE, loop.time() + self._idle_s
            try:
                if not channel.buffered:
                    await channel.wait_for(1)
                # From the first byte on, the frame has frame_timeout_ms to arrive whole.
                connection.phase, connection.deadline = FRAME, loop.time() + self._frame_s
                if channel.buffered < FRAME_HEADER_BYTES:
                    await channel.wait_for(FRAME_HEADER_BYTES)
            except ChannelClosedError as exc:
                if exc.partial:
                    log.debug("%s closed the connection inside a frame header", peer)
                return
            length = channel.frame_length()
            if not 0 < length <= self._max_frame_bytes:
                self.frames_rejected += 1
                log.warning(
                    "closing thrift connection from %s: frame length %d is outside 1..%d",
                    peer,
                    length,
                    self._max_frame_bytes,
                )
                await self._answer_wrong_call(channel, None, peer)
                return
            payload = b""
            try:
                if length > INLINE_DECODE_MAX_BYTES:
                    envelope = await self._big_frame(channel, length, connection)
                else:
                    if channel.buffered < FRAME_HEADER_BYTES + length:
                        await channel.wait_for(FRAME_HEADER_BYTES + length)
                    payload = channel.take_payload(length)
                    connection.phase, connection.deadline = BUSY, _INFINITY
                    envelope = decode(payload, args_for, MAX_RESULT_OFFSETS)
            except ChannelClosedError as exc:
                got = max(exc.partial - FRAME_HEADER_BYTES, 0)
                log.info("%s closed the connection after %d of %d frame bytes", peer, got, length)
                return
            except FrameRefusedError as exc:
                reply = self._handler.refused(exc, peer)
            except FrameDecodeError as exc:
                self.decode_errors += 1
                log.warning("closing thrift connection from %s: undecodable %d-byte frame: %s", peer, length, exc)
                if payload:
                    await self._answer_wrong_call(channel, payload, peer)
                return
            else:
                reply = await self._handler.dispatch(envelope, peer, channel.write)
            if reply is not None:
                connection.phase, connection.deadline = REPLY, loop.time() + self._frame_s
                channel.write(reply)
            if channel.must_drain:  # after this reply, or a pull's written as it was answered
                connection.phase, connection.deadline = REPLY, loop.time() + self._frame_s
                await channel.drain()
