"""A connection Redis reset is a Redis error on every event loop: under uvloop a write on a closed
transport raises RuntimeError, which the project's connection classes turn into redis.ConnectionError
(protocol/redis/connection.py), so the callers' failure paths (and the proxy's mapping to BrokerError) take it."""

from __future__ import annotations

import asyncio
import socket
import struct

import pytest
import redis

from ddmq.protocol.redis.connection import Deadlines, async_redis
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.store.broker import Broker, ConnectionCounter
from ddmq.proxy.store.client import broker_client


@pytest.mark.both_loops
async def test_a_write_on_a_reset_connection_is_a_connection_error(redis_url: str) -> None:
    client = async_redis(redis_url, retry=None)
    try:
        pool = client.connection_pool
        connection = await pool.get_connection()
        await connection.send_command("PING")
        assert await connection.read_response() in (b"PONG", "PONG")
        connection._writer.transport.abort()  # as a reset from Redis leaves it: the transport closed
        await asyncio.sleep(0.05)  # its connection_lost has run (uvloop then raises RuntimeError on a write)
        with pytest.raises(redis.ConnectionError):
            await connection.send_command("PING")
            await connection.read_response()
        await pool.release(connection)
    finally:
        await client.aclose()


@pytest.mark.both_loops
async def test_a_queue_read_on_a_reset_link_fails_as_a_broker_error_and_the_next_one_reads(redis_url: str) -> None:
    client = async_redis(redis_url, decode_responses=False)
    broker = Broker(client)
    from ddmq.proxy.store.read_link import ReadLink

    link = ReadLink()
    try:
        assert await broker.read("t", 0, 0, 10, None, link) == []
        assert link.connection is not None
        link.connection._writer.transport.abort()
        await asyncio.sleep(0.05)
        with pytest.raises(BrokerError):
            await broker.read("t", 0, 0, 10, None, link)
        assert await broker.read("t", 0, 0, 10, None, link) == []  # a new connection from the pool
    finally:
        await broker.close()
        await client.aclose()


class _ResettingServer:
    """Accepts every connection, reads the client's first bytes (its handshake) and resets it (RST):
    a middlebox that drops connections as soon as they carry anything."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._reset, "127.0.0.1", 0)
        return f"redis://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/0"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _reset(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await reader.read(1)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()


@pytest.mark.both_loops
@pytest.mark.parametrize("kind", ["proxy", "plain"])
async def test_connections_reset_during_their_handshake_fail_the_call_and_do_not_recurse(kind: str) -> None:
    # redis-py pings a new connection's first command when health checks are on; a reconnect inside that
    # ping ran the handshake again, so a link that reset every new connection recursed until the stack ran out.
    server = _ResettingServer()
    async with server as url:
        deadlines = Deadlines(health_check_interval_ms=10_000)
        client = (broker_client(url, deadlines, ConnectionCounter()) if kind == "proxy"
                  else async_redis(url, deadlines))  # the producers' and the CLI's
        try:
            for calls in range(1, 4):
                with pytest.raises((BrokerError, redis.ConnectionError)):
                    await client.ping()
                # a call costs its connection and the one retry on a new one, not a connection per stack frame
                assert server.connections <= 3 * calls
        finally:
            await client.aclose()
