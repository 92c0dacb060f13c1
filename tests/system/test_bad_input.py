"""Bad input against the real proxy: each case gets a clear answer and the proxy keeps serving."""

from __future__ import annotations

import asyncio
import json
import struct

import pytest

from ddmq.client.thrift_client import AsyncProxyClient, PullError
from ddmq.protocol import wire
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.core.errors import UnknownGroupError

from ..proxy.conftest import running_proxy

# A valid compact "pull" call header followed by bytes that are no struct.
GARBAGE = b"\x82\x21\x01\x04pull\xff\xff\xff"
CONFIG = {"order_key": "$.rider_id", "actions": ["Json", "Order", "PullServer"]}


async def still_serving(port: int, value: bytes) -> None:
    """A fresh client pulls the message that was produced: the proxy is alive and correct."""
    async with AsyncProxyClient("127.0.0.1", port) as client:
        response = await client.pull(wire.PullRequest(groupId="g", topic="t", maxBatchSize=10, maxLingerTime=3000))
        assert [m.value for m in response.messages] == [value]


async def raw_exchange(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 5)  # b"" once the proxy closes the connection
    finally:
        writer.close()


async def test_unknown_group_is_a_pull_exception_with_its_code(redis_url: str) -> None:
    async with running_proxy(redis_url, CONFIG) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            with pytest.raises(PullError) as info:
                await client.pull(wire.PullRequest(groupId="nobody", maxLingerTime=0))
            assert info.value.code == UnknownGroupError.code == 1001
            assert "nobody" in str(info.value)
            # the same connection keeps working
            await client.get_consume_stats(wire.ConsumeStatsRequest(group="g"))


@pytest.mark.parametrize(
    "payload",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # reads as a 1.2 GB frame length
        struct.pack("!i", 64 * 1024 * 1024) + b"x" * 100,  # over the frame cap
        struct.pack("!i", len(GARBAGE)) + GARBAGE,
        struct.pack("!i", -5),
    ],
    ids=["http-request", "oversized-frame", "garbage-frame", "negative-length"],
)
async def test_malformed_frames_close_only_that_connection(redis_url: str, payload: bytes) -> None:
    async with running_proxy(redis_url, CONFIG) as service:
        assert service.thrift_port is not None
        producer = AsyncProducer(redis_url)
        await producer.send("t", json.dumps({"rider_id": "r1"}), key="r1")
        await producer.close()
        assert await raw_exchange(service.thrift_port, payload) == b""
        await still_serving(service.thrift_port, json.dumps({"rider_id": "r1"}).encode())


async def test_body_that_is_not_json_is_delivered_and_counted(redis_url: str) -> None:
    async with running_proxy(redis_url, CONFIG) as service:
        assert service.thrift_port is not None
        producer = AsyncProducer(redis_url)
        await producer.send("t", b"\xff not json", key="r1")
        await producer.close()
        await still_serving(service.thrift_port, b"\xff not json")
        counters = service.groups["g"].consumers["t"].counters
        assert counters["json_invalid"] == 1 and counters["order_key_missing"] == 1
