"""A connection Redis reset is a Redis error on every event loop: under uvloop a write on a closed
transport raises RuntimeError, which the project's connection classes turn into redis.ConnectionError
(protocol/redis/connection.py), so the callers' failure paths (and the proxy's mapping to BrokerError) take it."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ddmq.protocol.redis.connection import async_redis
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.store.broker import Broker


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
