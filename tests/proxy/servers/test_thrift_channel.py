"""FrameChannel, the Thrift server's protocol, over real sockets: frames split or packed anyhow arrive
whole and in order, the buffer stays bounded, a peer that goes away is reported."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from ddmq.protocol.wire import FRAME_HEADER_BYTES
from ddmq.protocol.wire.layout import FRAME_HEADER
from ddmq.proxy.servers.thrift.channel import ChannelClosedError, FrameChannel

pytestmark = pytest.mark.both_loops


def frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload)) + payload


@asynccontextmanager
async def channel_pair(high_water: int = 1024) -> AsyncIterator[tuple[FrameChannel, socket.socket]]:
    """A channel on the accepted end of a real TCP connection, and the client's blocking socket."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    accepted, _ = listener.accept()
    listener.close()
    accepted.setblocking(False)
    loop = asyncio.get_running_loop()
    _, channel = await loop.connect_accepted_socket(lambda: FrameChannel(high_water), accepted)
    try:
        yield channel, client
    finally:
        client.close()
        await channel.close()


async def next_payload(channel: FrameChannel) -> bytes:
    """What the server's frame loop does, in short: header, then the whole payload."""
    await channel.wait_for(FRAME_HEADER_BYTES)
    length = channel.frame_length()
    await channel.wait_for(FRAME_HEADER_BYTES + length)
    return channel.take_payload(length)


async def test_frames_packed_in_one_segment_or_sent_byte_by_byte_come_out_whole_and_in_order() -> None:
    payloads = [b"a", b"bb" * 50, b"c" * 300, b"", b"d" * 7]
    async with channel_pair() as (channel, client):
        client.sendall(b"".join(frame(p) for p in payloads))
        assert [await next_payload(channel) for _ in payloads] == payloads
        assert channel.buffered == 0
        reading = asyncio.create_task(next_payload(channel))  # waiting before the bytes come
        for byte in frame(b"split"):
            await asyncio.sleep(0.002)
            client.sendall(bytes([byte]))
        assert await asyncio.wait_for(reading, 5) == b"split"


async def test_reading_stops_while_unread_frames_pass_the_bound_and_goes_on_once_taken() -> None:
    payloads = [bytes([n]) * 500 for n in range(40)]  # 20 KB: far past the 1 KB bound
    async with channel_pair(high_water=1024) as (channel, client):
        client.setblocking(False)
        client.send(b"".join(frame(p) for p in payloads))
        for _ in range(100):
            if not channel.reading:
                break
            await asyncio.sleep(0.01)
        assert not channel.reading
        held = channel.buffered
        client.send(b"".join(frame(p) for p in payloads))  # sent while paused: stays in the kernel
        await asyncio.sleep(0.05)
        assert channel.buffered == held
        got = [await next_payload(channel) for _ in payloads * 2]
        assert got == payloads * 2
        assert channel.reading


async def test_a_frame_longer_than_the_bound_is_read_whole_when_awaited() -> None:
    big = bytes(range(256)) * 400  # 100 KB, the bound 1 KB
    async with channel_pair(high_water=1024) as (channel, client):
        sender = asyncio.get_running_loop().run_in_executor(None, client.sendall, frame(big) + frame(b"after"))
        assert await next_payload(channel) == big
        assert await next_payload(channel) == b"after"
        await sender


async def test_a_peer_gone_mid_frame_is_reported_with_what_arrived() -> None:
    async with channel_pair() as (channel, client):
        client.sendall(frame(b"0123456789")[:9])
        client.shutdown(socket.SHUT_WR)
        with pytest.raises(ChannelClosedError) as closed:
            await next_payload(channel)
        assert closed.value.partial == 9


async def test_a_reply_to_a_peer_that_reset_the_connection_raises() -> None:
    async with channel_pair() as (channel, client):
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        client.close()  # linger 0: a reset
        with pytest.raises(ConnectionError):
            for _ in range(100):
                channel.write(b"x" * 1024)
                if channel.must_drain:
                    await channel.drain()
                await asyncio.sleep(0.01)
