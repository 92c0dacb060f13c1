"""Clients that hog or abuse the proxy's servers, against a real proxy, real sockets and real Redis.

Each case checks the behaviour (the connection is refused, closed or answered with the right error)
and that legitimate clients are still served: a full consume afterwards gets every message, each
key in order, and the committed offsets reach the produced ones. Limits are set small so that a few
sockets show them; bench/edges.py measures the same situations at size.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import socket
import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ddmq.client.thrift_client import AsyncProxyClient, ProxyClient, PullError
from ddmq.config import parse
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS
from ddmq.proxy.core.errors import BadRequestError, ConfigError
from ddmq.proxy.service import ProxyService

from ..http_support import ApiClient, OpenApiChecker
from ..proxy.conftest import running_proxy
from ..support import OrderChecker, ProxyProcess, produce_keyed

GUARD_S = 10  # failure guard for waits
Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def produce(redis_url: str, count: int, produced: dict[str, int] | None = None, seed: int = 7) -> dict[str, int]:
    produced = {} if produced is None else produced
    produce_keyed(redis_url, count, produced, random.Random(seed), keys=20)
    return produced


async def consume_everything(
    port: int, produced: dict[str, int], checker: OrderChecker | None = None, group: str = "g"
) -> OrderChecker:
    """Pull and ack over Thrift until every produced message is acked (``checker`` holds what the
    test consumed before); checks per-key order and that the committed offsets reach the produced."""
    checker = checker or OrderChecker()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
        pending: list[wire.ConsumeResult] = []
        while checker.missing(produced):
            assert loop.time() < deadline, f"not consumed: {checker.missing(produced)}"
            response = await client.pull(
                wire.PullRequest(
                    groupId=group, topic="t", maxBatchSize=64, maxLingerTime=200, result=wire.link_results(pending)
                )
            )
            pending = []
            for message in response.messages:
                event = json.loads(message.value)
                checker.delivered(event["k"], event["seq"])
                checker.acked(event["k"], event["seq"])
            if response.messages:
                pending = [
                    wire.ConsumeResult(context=response.context, successOffsets=[m.offset for m in response.messages])
                ]
        if pending:
            await client.submit(wire.link_results(pending))
        assert not checker.violations, checker.violations[:5]
        while True:
            (stats,) = await client.get_consume_stats(wire.ConsumeStatsRequest(group=group, topic="t"))
            if stats.consumeOffsets == stats.produceOffsets:
                break
            assert loop.time() < deadline, f"committed {stats.consumeOffsets} != produced {stats.produceOffsets}"
            await asyncio.sleep(0.05)
    return checker


async def closed_by_peer(reader: asyncio.StreamReader, within_s: float = GUARD_S) -> bool:
    """True once the other side closed the connection (EOF or reset), False if it stayed open."""
    try:
        async with asyncio.timeout(within_s):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


@asynccontextmanager
async def raw_connections(port: int, count: int) -> AsyncIterator[list[Connection]]:
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    try:
        yield connections
    finally:
        for _, writer in connections:
            writer.close()


async def eventually(check: Any, timeout_s: float = GUARD_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def thrift_server(service: ProxyService) -> Any:
    return service._thrift


# -- Thrift ------------------------------------------------------------------------------------------


async def test_thrift_at_max_connections_the_oldest_idle_one_makes_room_and_busy_ones_never(redis_url: str) -> None:
    async with running_proxy(redis_url, thrift={"port": 0, "max_connections": 3}) as service:
        port = service.thrift_port
        assert port is not None
        server = thrift_server(service)
        # Every connection serving a call (long polls on an empty topic): nothing can go, a new one is refused.
        async with (
            AsyncProxyClient("127.0.0.1", port, timeout_s=5) as a,
            AsyncProxyClient("127.0.0.1", port, timeout_s=5) as b,
            AsyncProxyClient("127.0.0.1", port, timeout_s=5) as c,
        ):
            polls = [asyncio.create_task(x.pull(wire.PullRequest(groupId="g", topic="t", maxLingerTime=1500)))
                     for x in (a, b, c)]
            await eventually(lambda: service.groups["g"].buffer.parked == 3)
            async with raw_connections(port, 1) as ((refused, _),):
                assert await closed_by_peer(refused)
            assert server.stats()["refused"] == 1
            assert [len((await poll).messages) for poll in polls] == [0, 0, 0]  # served, not cut
        await eventually(lambda: server.active_connections == 0)
        produced = produce(redis_url, 200)
        async with raw_connections(port, 2) as hogs:
            await eventually(lambda: server.active_connections == 2)
            async with raw_connections(port, 1) as ((third, _),):
                await eventually(lambda: server.active_connections == 3)
                async with raw_connections(port, 1) as ((fourth, _),):
                    assert await closed_by_peer(hogs[0][0])  # the oldest idle one made room
                    assert not await closed_by_peer(fourth, within_s=0.3)
                    assert not await closed_by_peer(hogs[1][0], within_s=0.1)
                    assert not await closed_by_peer(third, within_s=0.1)
            assert (server.stats()["evicted"], server.stats()["refused"], server.timeouts) == (1, 1, 0)
        await eventually(lambda: server.active_connections == 0)
        await consume_everything(port, produced)


async def test_thrift_idle_and_half_sent_connections_are_closed_but_a_long_poll_is_not(redis_url: str) -> None:
    limits = {"port": 0, "idle_timeout_ms": 300, "request_timeout_ms": 300}
    async with running_proxy(redis_url, thrift=limits) as service:
        port = service.thrift_port
        assert port is not None
        async with raw_connections(port, 3) as ((idle, _), (header, header_w), (frame, frame_w)):
            header_w.write(b"\x00\x00")  # half a frame header
            frame_w.write(struct.pack("!i", 1000) + b"x" * 10)  # 10 of 1000 bytes
            async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
                # a long poll three times the idle timeout is answered (empty), not cut
                response = await client.pull(wire.PullRequest(groupId="g", topic="t", maxLingerTime=900))
                assert response.messages == []
                for reader in (idle, header, frame):
                    assert await closed_by_peer(reader)
        assert thrift_server(service).timeouts >= 3
        produced = produce(redis_url, 100)
        await consume_everything(port, produced)


async def test_thrift_big_frames_wait_for_the_shared_byte_budget(redis_url: str) -> None:
    frame = 200 * 1024
    limits = {"port": 0, "max_frame_bytes": frame, "max_buffered_bytes": frame, "request_timeout_ms": 1000}
    async with running_proxy(redis_url, thrift=limits) as service:
        port = service.thrift_port
        assert port is not None
        produced = produce(redis_url, 100)
        server = thrift_server(service)
        async with raw_connections(port, 3) as hogs:
            for _, writer in hogs:  # each declares a full frame and sends half of it
                writer.write(struct.pack("!i", frame) + b"\x00" * (frame // 2))
            await eventually(lambda: server._budget.waits >= 2)
            assert server.buffered_bytes == frame  # one frame's worth, not three
            # small requests never wait for the budget: the consumer is served meanwhile
            await consume_everything(port, produced)
            for reader, _ in hogs:
                assert await closed_by_peer(reader)  # request_timeout_ms: the frames never finished
        assert server.buffered_bytes == 0


def results(offsets: list[int], qid: str = "0") -> wire.ConsumeResult:
    return wire.ConsumeResult(context=wire.Context(groupId="g", topic="t", qid=qid), successOffsets=offsets)


async def test_thrift_too_many_offsets_are_refused_whole_with_1003(redis_url: str) -> None:
    async with running_proxy(redis_url, queues=1) as service:
        port = service.thrift_port
        assert port is not None
        produced = produce(redis_url, 50)
        async with AsyncProxyClient("127.0.0.1", port, timeout_s=10) as client:
            batch = await client.pull(wire.PullRequest(groupId="g", topic="t", maxBatchSize=50, maxLingerTime=2000))
            delivered = [m.offset for m in batch.messages]
            assert delivered
            checker = OrderChecker()
            for message in batch.messages:
                event = json.loads(message.value)
                checker.delivered(event["k"], event["seq"])
            bogus = list(range(10**9, 10**9 + MAX_RESULT_OFFSETS))
            too_many = [
                wire.link_results([results(delivered), results(bogus)]),  # over the limit in two lists
                results(delivered + bogus),  # in one list: refused before it is decoded
            ]
            for result in too_many:
                with pytest.raises(PullError) as info:
                    await client.submit(result)
                assert info.value.code == BadRequestError.code
                assert str(MAX_RESULT_OFFSETS) in str(info.value)
                with pytest.raises(PullError) as info:
                    await client.pull(wire.PullRequest(groupId="g", topic="t", maxLingerTime=0, result=result))
                assert info.value.code == BadRequestError.code
            stats = service.groups["g"].buffer.stats
            assert stats.acked == 0, "nothing of a refused request is applied"
            # at the limit, applied in slices: every delivered offset is acked
            assert await client.submit(results(delivered + bogus[: MAX_RESULT_OFFSETS - len(delivered)]))
            assert service.groups["g"].buffer.stats.acked == len(delivered)
            for message in batch.messages:
                event = json.loads(message.value)
                checker.acked(event["k"], event["seq"])
        await consume_everything(port, produced, checker)
        assert checker.deliveries == sum(produced.values()), "each message delivered once: none lost, none redelivered"


async def test_accept_errors_are_logged_once_per_interval_and_legit_clients_served_after(
    redis_url: str, tmp_path: Path
) -> None:
    proxy = ProxyProcess(tmp_path, redis_url, {"g": {"t": {}}}, {"t": {"queues": 4}})
    proxy.start(max_open_files=48)
    try:
        produced = produce(redis_url, 300)
        sockets = []
        for _ in range(80):  # more than the proxy has descriptors for
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            sock.setblocking(False)
            sockets.append(sock)
        await asyncio.sleep(1.5)  # the proxy runs into EMFILE, over and over
        for sock in sockets:
            sock.close()
        checker = await consume_everything(proxy.port, produced)
        assert checker.deliveries >= 300
    finally:
        assert proxy.stop() == 0
    log = proxy.log()
    assert "cannot accept connections: Too many open files" in log
    assert log.count("cannot accept connections") <= 2, log  # once per 10 s, with a count
    assert "Traceback" not in log, log


# -- HTTP --------------------------------------------------------------------------------------------


@asynccontextmanager
async def http_proxy(
    redis_url: str, topic_config: dict[str, Any] | None = None, **http: Any
) -> AsyncIterator[tuple[ProxyService, ApiClient, int]]:
    async with running_proxy(redis_url, topic_config, http={"enabled": True, "port": 0, **http}) as service:
        assert service.http_port is not None
        async with aiohttp.ClientSession() as session:
            api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
            yield service, api, service.http_port


def http_connections(service: ProxyService) -> Any:
    assert service._http is not None
    return service._http.connections


async def test_http_limits_connections_and_closes_idle_and_half_sent_requests(redis_url: str) -> None:
    limits = {"max_connections": 4, "idle_timeout_ms": 600, "request_timeout_ms": 600}
    async with http_proxy(redis_url, {"timeout_ms": 300}, **limits) as (service, api, port):
        listener = http_connections(service).listener
        produced = produce(redis_url, 100)
        head = b"POST /v1/ack HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
        async with raw_connections(port, 5) as conns:
            (first, _), (idle, _), (header, header_w), (body, body_w), (_, fifth_w) = conns
            assert await closed_by_peer(first)  # the fifth took the place of the oldest idle one
            assert (listener.evicted, listener.refused) == (1, 0)
            fifth_w.close()
            await eventually(lambda: listener.open == 3)
            header_w.write(head[:20])  # headers never finished
            body_w.write(head + b'{"group": ')  # body never finished: 408, then closed
            # a long poll longer than the idle timeout is answered, not cut
            status, batch = await api.call("POST", "/v1/pull", json={"group": "g", "topic": "t", "linger_ms": 1500})
            assert status == 200
            for reader in (idle, header):
                assert await closed_by_peer(reader)
            answer = await asyncio.wait_for(body.read(), GUARD_S)
            assert answer.startswith(b"HTTP/1.1 408 ")
            error = api.checker.check("POST", "/v1/ack", 408, "application/json", answer.partition(b"\r\n\r\n")[2])
            assert error["code"] == 1003 and "request_timeout_ms" in error["message"]
        assert http_connections(service).timeouts >= 3
        checker = OrderChecker()
        for message in batch["messages"]:  # delivered, not acked: redelivered after timeout_ms
            event = json.loads(message["value_text"])
            checker.delivered(event["k"], event["seq"])
        await consume_everything(service.thrift_port or 0, produced, checker)


async def test_http_huge_content_length_gets_413_before_the_body(redis_url: str) -> None:
    async with http_proxy(redis_url) as (_, api, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/ack HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n" + b"[" * 1000)
        answer = await asyncio.wait_for(reader.read(), GUARD_S)  # no more is sent; the proxy closes
        writer.close()
        assert answer.startswith(b"HTTP/1.1 413 ")
        error = api.checker.check("POST", "/v1/ack", 413, "application/json", answer.partition(b"\r\n\r\n")[2])
        assert error["code"] == 1003 and "10000000000" in error["message"]
        status, body = await api.call("POST", "/v1/ack", json={"group": "g", "results": []}, headers={})
        assert (status, body) == (200, {"ok": True})


async def test_http_too_many_offsets_are_refused_whole(redis_url: str) -> None:
    async with http_proxy(redis_url, max_body_bytes=4 << 20, max_buffered_bytes=8 << 20) as (service, api, _):
        produced = produce(redis_url, 30)
        status, batch = await api.call("POST", "/v1/pull", json={"group": "g", "topic": "t", "linger_ms": 2000})
        assert status == 200 and batch["messages"]
        mine = {"topic": "t", "qid": batch["qid"], "success": [m["offset"] for m in batch["messages"]]}
        half = MAX_RESULT_OFFSETS // 2
        # (the real offsets among them too: a refused request applies none)
        bogus = [{"topic": "t", "qid": batch["qid"], "success": list(range(1, half + 2))}] * 2
        for path in ("/v1/ack", "/v1/pull"):
            status, error = await api.call("POST", path, json={"group": "g", "topic": "t", "results": [mine, *bogus]}
                                           if path == "/v1/pull" else {"group": "g", "results": [mine, *bogus]})
            assert (status, error["code"]) == (400, 1003) and str(MAX_RESULT_OFFSETS) in error["message"]
        assert service.groups["g"].buffer.stats.acked == 0
        status, _ = await api.call("POST", "/v1/ack", json={"group": "g", "results": [mine]})
        assert status == 200
        checker = OrderChecker()
        for message in batch["messages"]:
            event = json.loads(message["value_text"])
            checker.delivered(event["k"], event["seq"])
            checker.acked(event["k"], event["seq"])
        await consume_everything(service.thrift_port or 0, produced, checker)
        assert checker.deliveries == sum(produced.values())


async def test_http_dead_letter_id_beyond_64_bits_is_a_bad_request(redis_url: str) -> None:
    async with http_proxy(redis_url) as (_, api, _):
        for entry_id in (f"{2**64}-0", f"1-{2**64}"):
            status, error = await api.call(
                "GET", "/admin/groups/g/topics/t/dead-letters", params={"after": entry_id}
            )
            assert (status, error["code"], error["retriable"]) == (400, 1003, False)
            status, error = await api.call(
                "POST", "/admin/groups/g/topics/t/dead-letters/replay", json={"ids": [entry_id]}
            )
            assert (status, error["code"]) == (400, 1003)
        status, _ = await api.call("GET", "/admin/groups/g/topics/t/dead-letters", params={"after": f"{2**64 - 1}-0"})
        assert status == 200


async def test_http_malformed_chunked_body_is_one_log_line_without_its_bytes(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with http_proxy(redis_url) as (service, _, port):
        produced = produce(redis_url, 20)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/ack HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nSECRET-BYTES\r\n0\r\n\r\n"
        )
        answer = await asyncio.wait_for(reader.read(), GUARD_S)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 400 ") or answer.startswith(b"HTTP/1.1 400 ")
        await consume_everything(service.thrift_port or 0, produced)
    lines = [r for r in caplog.records if "bad HTTP request" in r.getMessage()]
    assert len(lines) == 1 and "Invalid character in chunk size" in lines[0].getMessage()
    assert all(r.exc_info is None and "SECRET" not in r.getMessage() for r in caplog.records)
    assert "SECRET" not in caplog.text


# -- bodies ------------------------------------------------------------------------------------------


async def test_json_nested_too_deep_is_invalid_json_not_a_traceback(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_proxy(redis_url, {"order_key": "$.k", "order_key_fallback": "qid"}) as service:
        port = service.thrift_port
        assert port is not None
        produced = produce(redis_url, 30)
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t", b"[" * 100_000, key="deep")
        async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
            got = []
            while len(got) < 31:
                request = wire.PullRequest(groupId="g", topic="t", maxBatchSize=64, maxLingerTime=500)
                response = await client.pull(request)
                got += response.messages
                if response.messages:
                    await client.submit(results([m.offset for m in response.messages], response.context.qid))
        deep = [m for m in got if m.key == "deep"]
        assert len(deep) == 1
        counters = service.groups["g"].consumers["t"].counters
        assert counters["json_invalid"] == 1
        events = [json.loads(m.value) for m in got if m.key != "deep"]
        checker = OrderChecker()
        for event in events:
            checker.delivered(event["k"], event["seq"])
            checker.acked(event["k"], event["seq"])
        assert not checker.violations and not checker.missing(produced)
    assert not any(r.exc_info for r in caplog.records), "no traceback"


# -- a full proxy makes room ----------------------------------------------------------------------


def _held_sockets(port: int, count: int, send: bytes = b"", answer: bool = False) -> list[socket.socket]:
    """``count`` connections to ``port``, each sending ``send`` (and reading the answer's first bytes
    when ``answer``), left open."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if send:
            sock.sendall(send)
        if answer:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
        held.append(sock)
    return held


def _healthz(port: int) -> float:
    """Seconds until ``GET /healthz`` on a new connection is answered 200."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")
    return time.monotonic() - started


async def test_a_full_proxy_still_serves_a_pull_and_healthz_within_a_second(redis_url: str, tmp_path: Path) -> None:
    """5,000 idle Thrift connections (max_connections 1000), 500 half-sent HTTP requests and 300 idle
    keep-alive HTTP connections (max_connections 256) against a proxy process: a new Thrift client's
    pull and a new /healthz are answered within a second (the oldest half-sent and idle connections
    make room for them), then a full consume gets every message, each key in order."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 16384), hard))  # the test holds ~6,000 sockets
    http_port = free_port()
    proxy = ProxyProcess(tmp_path, redis_url, {"g": {"t": {}}}, {"t": {"queues": 4}},
                         http={"enabled": True, "host": "127.0.0.1", "port": http_port})
    proxy.start(max_open_files=8192)
    held: list[socket.socket] = []
    try:
        produced = produce(redis_url, 2000)
        opening = time.monotonic()
        held += _held_sockets(proxy.port, 5000)
        thrift_s = time.monotonic() - opening
        half_sent = b"POST /v1/ack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Len"
        held += _held_sockets(http_port, 500, half_sent)
        held += _held_sockets(http_port, 300, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", answer=True)
        opened_s = time.monotonic() - opening
        checker = OrderChecker()
        started = time.monotonic()
        with ProxyClient("127.0.0.1", proxy.port, timeout_s=5) as client:
            response = client.pull(wire.PullRequest(groupId="g", topic="t", maxBatchSize=64, maxLingerTime=0))
            pulled_s = time.monotonic() - started
            healthz_s = _healthz(http_port)
            print(f"5,800 connections opened in {opened_s:.1f} s (Thrift's {thrift_s:.1f} s); "
                  f"then a pull took {pulled_s:.3f} s, /healthz {healthz_s:.3f} s")
            assert response.messages and pulled_s < 1.0 and healthz_s < 1.0, (pulled_s, healthz_s)
            for message in response.messages:
                event = json.loads(message.value)
                checker.delivered(event["k"], event["seq"])
                checker.acked(event["k"], event["seq"])
            ack = wire.ConsumeResult(context=response.context, successOffsets=[m.offset for m in response.messages])
            assert client.submit(ack)
        for sock in held:
            sock.close()
        held = []
        await consume_everything(proxy.port, produced, checker)
        assert not checker.violations
    finally:
        for sock in held:
            sock.close()
        assert proxy.stop() == 0
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    log = proxy.log()
    assert "max_connections (1000) reached: closed an idle connection" in log, log
    assert "max_connections (256) reached: closed a half-sent connection" in log, log
    assert "Traceback" not in log, log


async def test_allowed_clients_closes_other_peers_at_accept_and_serves_the_allowed(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    elsewhere = {"allowed_clients": ["10.0.0.0/8", "192.0.2.7"]}
    async with running_proxy(redis_url, thrift={"port": 0, **elsewhere},
                             http={"enabled": True, "port": 0, **elsewhere}) as service:
        assert service.thrift_port is not None and service.http_port is not None
        for port in (service.thrift_port, service.http_port):
            async with raw_connections(port, 3) as conns:
                for reader, _ in conns:
                    assert await closed_by_peer(reader)
        assert thrift_server(service).stats()["not_allowed"] == 3
        assert http_connections(service).stats()["not_allowed"] == 3
        assert thrift_server(service).stats()["accepted"] == 0
    lines = [r.getMessage() for r in caplog.records if "not in allowed_clients" in r.getMessage()]
    assert len(lines) == 2 and "thrift: closed a connection from 127.0.0.1" in lines[0]  # once per 10 s each
    loopback = {"allowed_clients": ["10.0.0.0/8", "127.0.0.0/8", "::1"]}
    async with running_proxy(redis_url, thrift={"port": 0, **loopback}) as service:
        produced = produce(redis_url, 100)
        await consume_everything(service.thrift_port or 0, produced)
        assert thrift_server(service).stats()["not_allowed"] == 0


def test_allowed_clients_must_be_networks() -> None:
    with pytest.raises(ConfigError, match=r"thrift.allowed_clients.*'10.0.0.0/33' is not an IP address or CIDR"):
        parse({"thrift": {"allowed_clients": ["10.0.0.0/33"]}})
    assert parse({"http": {"allowed_clients": ["10.1.2.3/8"]}}).http.allowed_clients == ["10.1.2.3/8"]


async def test_http_at_max_connections_a_half_sent_body_goes_before_an_idle_connection(redis_url: str) -> None:
    async with http_proxy(redis_url, max_connections=2) as (service, api, port):
        listener = http_connections(service).listener
        head = (b"POST /v1/ack HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n")
        async with raw_connections(port, 2) as ((body, body_w), (idle, _)):
            body_w.write(head + b'{"group": ')  # headers whole, the body never finishes
            opened = http_connections(service)._open
            await eventually(lambda: listener.open == 2 and any(p.phase == "body" for p in opened.values()))
            status, answer = await api.call("GET", "/healthz")
            assert status == 200, answer
            assert await closed_by_peer(body)  # the half-sent body made room, not the idle connection
            assert not await closed_by_peer(idle, within_s=0.2)
        assert listener.evicted == 1 and service.groups["g"].buffer.stats.acked == 0
