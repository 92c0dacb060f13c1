"""FrameChannel: one Thrift connection's bytes, buffered for the task that serves its frames.

The channel is the connection's asyncio protocol. ``data_received`` appends to one buffer, and the
serving task (:meth:`ThriftServer._serve_frames`) checks how much is buffered and takes a whole frame's
payload in one call; it awaits only when the bytes it needs have not arrived. A request nearly always
arrives in one segment, so a frame costs one buffer append, one length read and one copy out, and a
reply one ``transport.write``, awaited only while the transport holds more than its high-water mark.
(asyncio's streams, measured against this in bench/README.md, await three reads per request: a byte,
the rest of the header, the payload; and a drain per reply.)

Bounds: reading pauses while more than ``high_water`` bytes wait to be taken (a client pipelining
requests behind a long poll) unless the task is waiting for a longer frame, whose share of the byte
budget it reserved first: until then the channel holds at most ``high_water`` bytes of it.
"""

from __future__ import annotations

import asyncio
from typing import Final, cast

from ddmq.protocol.wire import FRAME_HEADER_BYTES, frame_length
from ddmq.proxy.servers.thrift.errors import ChannelClosedError

__all__ = ["ChannelClosedError", "FrameChannel"]

#: Bytes a channel buffers beyond what its task waits for before it stops reading the socket.
DEFAULT_HIGH_WATER: Final = 128 * 1024


class FrameChannel:
    """A connection's buffer and flow control, read by one task.

    An asyncio protocol by its methods, not by subclassing ``asyncio.Protocol``: event loops call
    them by name, and as a class of its own it compiles to a native class (``protocol/native.py``)."""

    def __init__(self, high_water: int = DEFAULT_HIGH_WATER) -> None:
        self._buffer = bytearray()
        self._high_water = high_water
        self._transport: asyncio.Transport | None = None
        #: Bytes the task waits for (0: it is not waiting), and the future it waits on.
        self._wanted = 0
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._eof = False
        self._lost = False
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # the transport's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if self._waiter is not None and len(buffer) >= self._wanted:
            _wake(self._waiter)
        if not self._reading_paused and len(buffer) > max(self._high_water, self._wanted):
            self._reading_paused = True
            assert self._transport is not None
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        if self._waiter is not None:
            _wake(self._waiter)
        return True  # keep the write side open: the reply to a request read before the EOF still goes

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = self._lost = True
        if self._waiter is not None:
            _wake(self._waiter)
        if self._drain is not None:
            _wake(self._drain)
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        if self._drain is not None:
            _wake(self._drain)

    # the serving task's side -------------------------------------------------------------------

    @property
    def reading(self) -> bool:
        """Whether the socket is being read (False while the buffer is over its bound)."""
        return not self._reading_paused

    @property
    def buffered(self) -> int:
        """Bytes received and not taken yet."""
        return len(self._buffer)

    def frame_length(self) -> int:
        """The length the buffered frame header declares (at least FRAME_HEADER_BYTES are buffered)."""
        return frame_length(bytes(self._buffer[:FRAME_HEADER_BYTES]))

    def head(self) -> bytes:
        """A copy of every byte buffered (for a connection that is about to be closed)."""
        return bytes(self._buffer)

    async def wait_for(self, size: int) -> None:
        """Until ``size`` bytes are buffered; ChannelClosedError when the peer closed first."""
        while len(self._buffer) < size:
            if self._eof:
                raise ChannelClosedError(len(self._buffer))
            self._wanted = size
            if self._reading_paused:
                self._resume_reading()
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
                self._wanted = 0

    def take_payload(self, length: int) -> bytes:
        """The buffered frame's payload (its header dropped); the whole frame must be buffered."""
        end = FRAME_HEADER_BYTES + length
        buffer = self._buffer
        with memoryview(buffer) as view:
            payload = bytes(view[FRAME_HEADER_BYTES:end])
        if len(buffer) == end:  # the common case: nothing behind it
            buffer.clear()
        elif end > self._high_water:
            # A new buffer for what follows a big frame: deleting from the front would keep the
            # frame's capacity allocated for as long as the connection lives.
            buffer = self._buffer = bytearray(buffer[end:])
        else:
            del buffer[:end]
        if self._reading_paused and len(buffer) <= self._high_water:
            self._resume_reading()
        return payload

    def write(self, data: bytes) -> None:
        """Send ``data`` (buffered by the transport as far as the socket does not take it)."""
        if self._lost or self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("connection lost")
        self._transport.write(data)

    @property
    def must_drain(self) -> bool:
        """Whether the transport holds more than its high-water mark: :meth:`drain` before writing more."""
        return self._writing_paused

    async def drain(self) -> None:
        """Until the transport's buffer is under its low-water mark; ConnectionResetError if lost."""
        while self._writing_paused:
            if self._lost:
                raise ConnectionResetError("connection lost")
            drain = self._drain = asyncio.get_running_loop().create_future()
            try:
                await drain
            finally:
                self._drain = None
        if self._lost:
            raise ConnectionResetError("connection lost")

    async def close(self) -> None:
        """Close the connection and wait until the transport let go of it."""
        if self._transport is not None:
            self._transport.close()
            await asyncio.shield(self._closed)

    def _resume_reading(self) -> None:
        self._reading_paused = False
        if self._transport is not None and not self._lost:
            self._transport.resume_reading()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
