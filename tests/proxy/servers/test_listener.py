"""Listener and Evictions: the accept loop both servers share, over real sockets."""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from ddmq.proxy.servers.listener import Evictions, Listener, is_allowed, parse_networks


@dataclass(eq=False)
class Conn:
    phase: str
    deadline: float
    evicted: bool = False


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _closed_by_peer(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), timeout=5) == b""


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110  (counters of another task: nothing to wait on)
            await asyncio.sleep(0.01)


def test_evictions_take_expired_then_partial_then_idle_and_never_a_busy_connection() -> None:
    busy = Conn("serving", math.inf)
    idle_old, idle_new = Conn("idle", 50.0), Conn("idle", 60.0)
    partial = Conn("frame", 70.0)
    expired = Conn("idle", 5.0)
    evictions = Evictions(lambda: [busy, idle_new, partial, idle_old, expired], frozenset({"frame"}), "idle")
    picked = [evictions.pick(now=10.0) for _ in range(5)]
    assert picked == [expired, partial, idle_old, idle_new, None]
    assert all(conn.evicted for conn in (expired, partial, idle_old, idle_new)) and not busy.evicted


def test_evictions_skip_a_connection_that_moved_on_since_it_was_ranked() -> None:
    first, second = Conn("idle", 50.0), Conn("idle", 60.0)
    evictions = Evictions(lambda: [first, second], frozenset(), "idle")
    assert evictions.pick(now=0.0) is first
    second.phase, second.deadline = "serving", math.inf  # it started serving a call meanwhile
    assert evictions.pick(now=0.0) is None


async def test_at_the_limit_a_new_connection_is_refused_until_one_closes() -> None:
    served: list[socket.socket] = []
    listener = Listener("test", "127.0.0.1", 0, max_connections=1, serve=served.append)
    await listener.start()
    try:
        _, first = await _connect(listener.port)
        await _until(lambda: listener.accepted == 1)
        second_reader, second = await _connect(listener.port)
        assert await _closed_by_peer(second_reader)
        assert (listener.refused, listener.open) == (1, 1)
        served.pop().close()
        listener.closed()
        _, third = await _connect(listener.port)
        await _until(lambda: listener.accepted == 2)
        assert listener.open == 1
        for writer in (first, second, third):
            writer.close()
    finally:
        for sock in served:
            sock.close()
        await listener.close()


async def test_make_room_admits_the_new_connection_and_counts_the_eviction() -> None:
    served: list[socket.socket] = []

    def make_room() -> str:
        served.pop(0).close()
        listener.closed()
        return "the oldest"

    listener = Listener("test", "127.0.0.1", 0, max_connections=1, serve=served.append, make_room=make_room)
    await listener.start()
    try:
        first_reader, first = await _connect(listener.port)
        await _until(lambda: listener.accepted == 1)
        _, second = await _connect(listener.port)
        await _until(lambda: listener.accepted == 2)
        assert await _closed_by_peer(first_reader)
        assert (listener.evicted, listener.refused, listener.open) == (1, 0, 1)
        first.close()
        second.close()
    finally:
        for sock in served:
            sock.close()
        await listener.close()


async def test_a_peer_outside_allowed_clients_is_closed_at_accept() -> None:
    served: list[socket.socket] = []
    listener = Listener(
        "test", "127.0.0.1", 0, max_connections=10, serve=served.append, allowed=parse_networks(["10.0.0.0/8"])
    )
    await listener.start()
    try:
        reader, writer = await _connect(listener.port)
        assert await _closed_by_peer(reader)
        assert (listener.not_allowed, listener.accepted, served) == (1, 0, [])
        writer.close()
    finally:
        await listener.close()


def test_networks_parse_bare_addresses_and_match_ipv4_mapped_peers() -> None:
    networks = parse_networks(["10.0.0.0/8", "127.0.0.1", "::1"])
    assert is_allowed("10.1.2.3", networks) and is_allowed("::ffff:127.0.0.1", networks)
    assert is_allowed("::1", networks) and not is_allowed("192.168.0.1", networks)
    assert not is_allowed("/tmp/socket", networks)
    with pytest.raises(ValueError, match="not an IP address"):
        parse_networks(["10.0.0.0/33"])
    with pytest.raises(ValueError, match="positive"):
        Listener("test", "127.0.0.1", 0, max_connections=0, serve=lambda sock: None)
