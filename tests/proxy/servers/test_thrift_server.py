"""ThriftServer, the Thrift clients and the pull consumers over real sockets.

The engine is replaced by :class:`FakeService`, a small implementation of the ConsumeService protocol
that records what the adapter hands it; everything else (server, codec, clients, thriftpy2's own stock
client) is real.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, NamedTuple

import pytest
import thriftpy2
from thriftpy2.protocol import TBinaryProtocolFactory, TCompactProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TBufferedTransportFactory, TFramedTransportFactory

from ddmq.client import consumer as consumer_module
from ddmq.client.cli import consume as consume_cli
from ddmq.client.consumer import AsyncPullConsumer, ConsumedMessage, PullConsumer, parse_servers
from ddmq.client.thrift_client import (
    AsyncProxyClient,
    ProxyClient,
    ProxyConnectionError,
    PullError,
    RemoteApplicationError,
)
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.wire import ConsumeResult, ConsumerService, ConsumeStatsRequest, Context, PullRequest, TMessageType
from ddmq.proxy.core.errors import BrokerError, UnknownGroupError, UnknownTopicError
from ddmq.proxy.core.types import (
    ConsumeStatsRow,
    FailNote,
    FetchedQueue,
    PullBatch,
    PullLease,
    QueueId,
    QueueResult,
    StoredMessage,
)
from ddmq.proxy.servers.thrift.server import ThriftServer

GUARD_S = 5  # failure guard for waits: a hang fails the test instead of blocking the run

# The IDL loaded by thriftpy2 on its own, for the stock client: nothing shared with ddmq.protocol.wire.
STOCK = thriftpy2.load(str(wire.IDL_PATH), module_name="stock_consumerProxy_thrift")


class PullCall(NamedTuple):
    group: str
    topic: str | None
    max_batch: int | None
    linger_ms: int | None
    results: list[QueueResult]


class FakeService:
    """The ConsumeService protocol, recorded: batches are queued by the test; a pull with nothing
    ready waits up to its linger for one (like the engine's long poll)."""

    def __init__(self) -> None:
        self.ready: deque[PullBatch] = deque()
        self.errors: deque[Exception] = deque()
        self.pulls: list[PullCall] = []
        self.submits: list[list[QueueResult]] = []
        self.stats: list[ConsumeStatsRow] = []
        self.fetches: list[tuple[str, dict[str, dict[str, int]] | None, int | None, int | None]] = []
        self.fetch_pages: list[FetchedQueue] = []
        self.acks: list[tuple[str, dict[str, dict[str, int]]]] = []
        self.parked = asyncio.Event()
        #: Replies written through the server's early hook (a pull that waited).
        self.early_replies = 0
        self._arrived = asyncio.Event()

    def add(self, queue: QueueId, offsets: list[int], values: list[bytes] | None = None) -> None:
        values = values or [f"v{offset}".encode() for offset in offsets]
        messages = [
            StoredMessage(offset, value, f"k{offset}", "tag", {"p": str(offset)}, 1_700_000_000_000 + offset)
            for offset, value in zip(offsets, values, strict=True)
        ]
        self.ready.append(PullBatch(queue, messages))
        self._arrived.set()

    def acked(self) -> tuple[list[int], list[int]]:
        """Every success and fail offset reported so far, through pulls and submits."""
        success: list[int] = []
        fail: list[int] = []
        for results in [call.results for call in self.pulls] + self.submits:
            for result in results:
                success += result.success
                fail += result.fail
        return sorted(success), sorted(fail)

    async def pull(
        self,
        group: str,
        topic: str | None,
        max_batch: int | None,
        linger_ms: int | None,
        results: list[QueueResult],
        lease: PullLease | None = None,
        max_per_key: int | None = None,
        early: Callable[[PullBatch], None] | None = None,
        request_id: str | None = None,
    ) -> PullBatch:
        self.pulls.append(PullCall(group, topic, max_batch, linger_ms, results))
        if self.errors:
            raise self.errors.popleft()
        waited = not self.ready and linger_ms is not None and linger_ms > 0
        if waited:
            self._arrived.clear()
            self.parked.set()
            try:
                async with asyncio.timeout(linger_ms / 1000):
                    await self._arrived.wait()
            except TimeoutError:
                pass
            finally:
                self.parked.clear()
        if not self.ready:
            return PullBatch(None, [])
        batch = self.ready.popleft()
        if max_batch and len(batch.messages) > max_batch:
            self.ready.appendleft(PullBatch(batch.queue, batch.messages[max_batch:]))
            batch = PullBatch(batch.queue, batch.messages[:max_batch])
        if waited and early is not None:  # as the engine does: the reply goes out before this returns
            early(batch)
            self.early_replies += 1
        return batch

    async def submit(self, results: list[QueueResult], group: str | None = None) -> None:
        self.submits.append(results)

    async def ack_leases(self, group: str, lease_ids: list[str], abandon: bool = False) -> int:
        return 0

    async def consume_stats(self, group: str, topic: str | None) -> list[ConsumeStatsRow]:
        if self.errors:
            raise self.errors.popleft()
        return [row for row in self.stats if row.group == group and topic in (None, row.topic)]

    async def fetch(
        self, group: str, offsets: dict[str, dict[str, int]] | None, max_batch: int | None, linger_ms: int | None
    ) -> list[FetchedQueue]:
        self.fetches.append((group, offsets, max_batch, linger_ms))
        if self.errors:
            raise self.errors.popleft()
        return self.fetch_pages

    async def ack(self, group: str, offsets: dict[str, dict[str, int]]) -> None:
        self.acks.append((group, offsets))
        if self.errors:
            raise self.errors.popleft()


@pytest.fixture
async def service() -> FakeService:
    return FakeService()


@pytest.fixture
async def server(service: FakeService) -> AsyncIterator[ThriftServer]:
    async with ThriftServer(service, "127.0.0.1", 0, max_frame_bytes=4096) as running:
        yield running


async def _call(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str, body: Any, seqid: int = 1
) -> wire.Envelope:
    """One raw call on an open connection; the reply's body is decoded as ``<name>_result`` or a
    TApplicationException."""
    writer.write(wire.encode(name, TMessageType.CALL, seqid, body))
    await writer.drain()
    async with asyncio.timeout(GUARD_S):
        length = wire.frame_length(await reader.readexactly(4))
        payload = await reader.readexactly(length)

    def body_for(reply_name: str, mtype: int) -> Any:
        if mtype == TMessageType.EXCEPTION:
            return TApplicationException()
        return getattr(ConsumerService, f"{name}_result")()

    return wire.decode(payload, body_for)


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    async with asyncio.timeout(GUARD_S):
        try:
            return await reader.read() == b""
        except ConnectionResetError:  # closed with our unread bytes still in its buffer
            return True


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _still_serves(server: ThriftServer) -> None:
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client:
        assert await client.submit(None) is True


# -- the adapter ------------------------------------------------------------------------------------


async def test_pull_round_trip(server: ThriftServer, service: FakeService) -> None:
    service.add(QueueId("t", 3), [10, 11], [b"\xff\x00", "ü".encode()])
    results = wire.link_results(
        [
            ConsumeResult(Context("g", "t", "3"), [7, 8], [9]),
            ConsumeResult(Context(None, "u", "0"), None, [4]),  # no groupId: the service gives it the pull's
            ConsumeResult(None, [1], None),
        ]
    )
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client:
        response = await client.pull(
            PullRequest(groupId="g", topic="t", maxBatchSize=8, maxLingerTime=250, result=results)
        )
    assert service.pulls == [
        PullCall(
            "g",
            "t",
            8,
            250,
            [
                QueueResult("g", "t", "3", [7, 8], [9]),
                QueueResult("", "u", "0", [], [4]),
                QueueResult("", "", "", [1], []),
            ],
        )
    ]
    assert response.context == Context(groupId="g", topic="t", qid="3")
    assert response.messages == [
        wire.Message(
            key="k10", value=b"\xff\x00", tag="tag", offset=10, properties={"p": "10"}, produceTime=1_700_000_000_010
        ),
        wire.Message(
            key="k11", value="ü".encode(), tag="tag", offset=11, properties={"p": "11"}, produceTime=1_700_000_000_011
        ),
    ]


async def test_empty_pull_names_the_asked_topic(server: ThriftServer, service: FakeService) -> None:
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client:
        with_topic = await client.pull(PullRequest(groupId="g", topic="t", maxLingerTime=0))
        without = await client.pull(PullRequest(groupId="g", maxLingerTime=0))
    assert with_topic == wire.PullResponse(context=Context(groupId="g", topic="t", qid=""), messages=[])
    assert without == wire.PullResponse(context=Context(groupId="g", topic="", qid=""), messages=[])
    assert [call.results for call in service.pulls] == [[], []]


@pytest.mark.parametrize("asked", [None, -5, 0, 4999, 10**9])
async def test_linger_is_passed_as_asked(server: ThriftServer, service: FakeService, asked: int | None) -> None:
    """The service bounds it (tests/proxy/api/test_requests.py, tests/system/test_adapters.py)."""
    service.add(QueueId("t", 0), [1])  # ready, so the fake never waits
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client:
        await client.pull(PullRequest(groupId="g", maxLingerTime=asked))
    assert service.pulls[0].linger_ms == asked


async def test_submit_and_consume_stats(server: ThriftServer, service: FakeService) -> None:
    service.stats = [
        ConsumeStatsRow("g", "t", {"0": 5, "1": 7}, {"0": 9, "1": 7}, {"1": "proxy-b"}, {"1": 2500}, {"1": 3}),
        ConsumeStatsRow("g", "u", {"0": 1}, {"0": 1}),
    ]
    results = wire.link_results([ConsumeResult(Context("g", "t", "1"), [3], [4])])
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client:
        assert await client.submit(results) is True
        stats = await client.get_consume_stats(ConsumeStatsRequest(group="g", topic="t"))
    assert service.submits == [[QueueResult("g", "t", "1", [3], [4])]]
    assert stats == [
        wire.ConsumeStats(
            group="g",
            topic="t",
            consumeOffsets={"0": 5, "1": 7},
            produceOffsets={"0": 9, "1": 7},
            owners={"1": "proxy-b"},
            leaseTtlMs={"1": 2500},
            leaseTerms={"1": 3},
        )
    ]


async def test_ddmq_errors_become_pull_exceptions(server: ThriftServer, service: FakeService) -> None:
    service.errors.extend([UnknownGroupError("unknown group 'nope'"), RuntimeError("boom"), BrokerError("down")])
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client:
        with pytest.raises(PullError) as unknown:
            await client.pull(PullRequest(groupId="nope"))
        with pytest.raises(PullError) as internal:
            await client.pull(PullRequest(groupId="g"))
        with pytest.raises(PullError) as broker:
            await client.get_consume_stats(ConsumeStatsRequest(group="g"))
        with pytest.raises(PullError) as bad:
            await client.pull(PullRequest(groupId=""))
        assert await client.submit(None) is True  # the connection survived every error
    assert (unknown.value.code, unknown.value.message) == (1001, "unknown group 'nope'")
    assert (internal.value.code, internal.value.message) == (1500, "internal error")  # no detail leaks
    assert (broker.value.code, broker.value.message) == (1006, "down")
    assert bad.value.code == 1003


async def test_unknown_method_gets_an_application_exception_and_the_connection_lives(
    server: ThriftServer, service: FakeService
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        unknown = await _call(reader, writer, "frobnicate", PullRequest(groupId="g"), seqid=41)
        assert (unknown.name, unknown.type, unknown.seqid) == ("frobnicate", TMessageType.EXCEPTION, 41)
        assert isinstance(unknown.body, TApplicationException)
        assert unknown.body.type == TApplicationException.UNKNOWN_METHOD
        reply = await _call(reader, writer, "submit", ConsumerService.submit_args(result=None), seqid=42)
        assert (reply.type, reply.seqid) == (TMessageType.REPLY, 42)
        assert reply.body == ConsumerService.submit_result(success=True)
    finally:
        await _close(writer)
    assert server.decode_errors == 0


async def test_a_reply_to_a_reply_is_refused(server: ThriftServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(wire.encode("submit", TMessageType.REPLY, 3, ConsumerService.submit_args()))
        await writer.drain()
        async with asyncio.timeout(GUARD_S):
            payload = await reader.readexactly(wire.frame_length(await reader.readexactly(4)))
        reply = wire.decode(payload, lambda name, mtype: TApplicationException())
        assert reply.type == TMessageType.EXCEPTION
        assert reply.body.type == TApplicationException.INVALID_MESSAGE_TYPE  # type: ignore[union-attr]
    finally:
        await _close(writer)


# -- hostile peers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\n\r\n",  # length 0x47455420: far above the cap
        (8192).to_bytes(4, "big") + b"x" * 100,  # above the 4096 cap
        (0).to_bytes(4, "big"),
        (-1).to_bytes(4, "big", signed=True),
    ],
    ids=["http", "oversized", "zero", "negative"],
)
async def test_bad_frame_length_closes_only_that_connection(server: ThriftServer, data: bytes) -> None:
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as bystander:
        await bystander.connect()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(data)
            await writer.drain()
            assert await _closed_by_server(reader)
        finally:
            await _close(writer)
        assert server.frames_rejected == 1
        assert await bystander.submit(None) is True  # opened before, still served
    await _still_serves(server)


async def test_undecodable_payload_closes_only_that_connection(server: ThriftServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        garbage = b"\x82\x21\x01\x04pull\x1c\x18" + b"\xff" * 12
        writer.write(len(garbage).to_bytes(4, "big") + garbage)
        await writer.drain()
        assert await _closed_by_server(reader)
    finally:
        await _close(writer)
    assert server.decode_errors == 1
    await _still_serves(server)


def _wrong_setup_call(port: int, protocol: Any, transport: Any) -> tuple[int, str]:
    """What thriftpy2's stock client, set up with ``protocol`` and ``transport``, gets from a submit."""
    client = make_client(STOCK.ConsumerService, "127.0.0.1", port, proto_factory=protocol, trans_factory=transport,
                         timeout=GUARD_S * 1000)
    try:
        client.submit(None)
    except TApplicationException as exc:
        return exc.type, exc.message
    finally:
        client.close()
    raise AssertionError("a call in the wrong set-up was answered as a call")


@pytest.mark.parametrize(
    ("protocol", "transport", "rejected"),
    [
        (TBinaryProtocolFactory(), TFramedTransportFactory(), (0, 1)),
        (TBinaryProtocolFactory(), TBufferedTransportFactory(), (1, 0)),
        (TCompactProtocolFactory(), TBufferedTransportFactory(), (1, 0)),
    ],
    ids=["binary-framed", "binary-unframed", "compact-unframed"],
)
async def test_a_client_on_the_wrong_protocol_or_transport_is_told_what_the_port_speaks(
    server: ThriftServer, protocol: Any, transport: Any, rejected: tuple[int, int]
) -> None:
    type_, message = await asyncio.to_thread(_wrong_setup_call, server.port, protocol, transport)
    assert type_ == TApplicationException.PROTOCOL_ERROR
    assert "compact protocol over framed transport" in message
    assert (server.frames_rejected, server.decode_errors) == rejected
    await _still_serves(server)


@pytest.mark.parametrize(
    "data", [b"\x80\x01\x00\x01\x00\x00\x10\x00" + b"x" * 64, b"\x82\x21\xff\xff\xff\xff\xff\xff"],
    ids=["binary-name-too-long", "compact-varint-too-long"],
)
async def test_what_only_looks_like_a_wrong_call_is_closed_without_an_answer(server: ThriftServer, data: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        await writer.drain()
        assert await _closed_by_server(reader)  # nothing read before the close
    finally:
        await _close(writer)
    assert server.frames_rejected == 1
    await _still_serves(server)


@pytest.mark.parametrize("data", [b"\x00\x00", (100).to_bytes(4, "big") + b"\x82\x21\x01"], ids=["header", "payload"])
async def test_truncated_frame_then_eof(server: ThriftServer, data: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        writer.write_eof()
        await writer.drain()
        assert await _closed_by_server(reader)
    finally:
        await _close(writer)
    assert (server.frames_rejected, server.decode_errors) == (0, 0)
    await _still_serves(server)


async def test_a_big_frame_is_decoded(service: FakeService) -> None:
    offsets = list(range(10**12, 10**12 + 30_000))  # ~180 KB: decoded off the event loop
    results = wire.link_results([ConsumeResult(Context("g", "t", "0"), offsets, [])])
    async with (
        ThriftServer(service, "127.0.0.1", 0, max_frame_bytes=1 << 20) as server,
        AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client,
    ):
        assert await client.submit(results) is True
    assert service.submits == [[QueueResult("g", "t", "0", offsets, [])]]


async def test_connections_are_served_concurrently(server: ThriftServer, service: FakeService) -> None:
    async with (
        AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as waiting,
        AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as other,
    ):
        long_poll = asyncio.create_task(waiting.pull(PullRequest(groupId="g", maxLingerTime=4000)))
        async with asyncio.timeout(GUARD_S):
            await service.parked.wait()
        assert await other.submit(None) is True  # served while the first connection is parked
        service.add(QueueId("t", 0), [1])
        response = await long_poll
    assert [m.offset for m in response.messages] == [1]
    assert server.connections == 2


async def test_a_parked_pulls_reply_goes_out_once_as_it_is_answered(server: ThriftServer, service: FakeService) -> None:
    """Written through the early hook, not again by the frame loop: the connection's next call reads
    its own reply, not a second copy of the first."""
    async with AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S) as client:
        long_poll = asyncio.create_task(client.pull(PullRequest(groupId="g", maxLingerTime=4000)))
        async with asyncio.timeout(GUARD_S):
            await service.parked.wait()
        service.add(QueueId("t", 0), [1, 2])
        response = await long_poll
        assert [m.offset for m in response.messages] == [1, 2]
        assert service.early_replies == 1
        service.add(QueueId("t", 1), [7])
        again = await client.pull(PullRequest(groupId="g"))
    assert [m.offset for m in again.messages] == [7] and again.context is not None and again.context.qid == "1"
    assert service.early_replies == 1  # answered at once: no early hook


# -- lifecycle --------------------------------------------------------------------------------------


async def test_lifecycle(service: FakeService) -> None:
    server = ThriftServer(service, "127.0.0.1", 0, max_frame_bytes=1024)
    with pytest.raises(RuntimeError):
        _ = server.port
    await server.start()
    try:
        assert server.port > 0
        with pytest.raises(RuntimeError):
            await server.start()
        parked = AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S)
        assert await parked.submit(None) is True
        assert server.active_connections == 1
    finally:
        await server.close()
    assert server.active_connections == 0
    await server.close()  # idempotent
    with pytest.raises(ProxyConnectionError):
        await parked.submit(None)  # the server dropped the connection on close
    await parked.close()
    with pytest.raises(RuntimeError):
        await server.start()


# -- wire compatibility with a stock Thrift client ----------------------------------------------------


def _stock_client(port: int) -> Any:
    return make_client(
        STOCK.ConsumerService,
        "127.0.0.1",
        port,
        proto_factory=TCompactProtocolFactory(),
        trans_factory=TFramedTransportFactory(),
        timeout=GUARD_S * 1000,
    )


def _stock_calls(port: int) -> dict[str, Any]:
    """Call every method with thriftpy2's own client (blocking: run it in a thread)."""
    client = _stock_client(port)
    try:
        out: dict[str, Any] = {}
        result = STOCK.ConsumeResult(STOCK.Context("g", "t", "2"), [5], [6])
        out["pull"] = client.pull(STOCK.PullRequest(groupId="g", topic="t", maxLingerTime=10, result=result))
        out["submit"] = client.submit(STOCK.ConsumeResult(STOCK.Context("g", "t", "2"), [7], []))
        out["stats"] = client.getConsumeStats(STOCK.ConsumeStatsRequest(group="g"))
        for name, call in [
            ("error", lambda: client.pull(STOCK.PullRequest(groupId="nope"))),
            ("ack_error", lambda: client.ack(STOCK.AckResult(consumerId="c", groupId="nope", cluster="k", offsets={}))),
        ]:
            try:
                call()
            except STOCK.PullException as exc:
                out[name] = (exc.code, exc.message)
            except TApplicationException as exc:
                out[name] = (exc.type, exc.message)
        out["empty"] = client.pull(STOCK.PullRequest(groupId="g", maxLingerTime=0))
        fetch = STOCK.FetchRequest(
            consumerId="c", groupId="g", cluster="k", fetchOffset={"t": {"2": 40}}, maxBatchSize=5
        )
        out["fetch"] = client.fetch(fetch)
        out["ack"] = client.ack(STOCK.AckResult(consumerId="c", groupId="g", cluster="k", offsets={"t": {"2": 42}}))
        return out
    finally:
        client.close()


async def test_stock_thriftpy2_client(server: ThriftServer, service: FakeService) -> None:
    service.add(QueueId("t", 2), [40, 41])
    service.stats = [ConsumeStatsRow("g", "t", {"2": 40}, {"2": 42})]
    original_pull = service.pull

    async def pull(group: str, *args: Any, **kwargs: Any) -> PullBatch:
        if group == "nope":
            raise UnknownGroupError("unknown group 'nope'")
        return await original_pull(group, *args, **kwargs)

    async def ack(group: str, offsets: dict[str, dict[str, int]]) -> None:
        if group == "nope":
            raise UnknownGroupError("unknown group 'nope'")
        await original_ack(group, offsets)

    original_ack = service.ack
    service.pull = pull  # type: ignore[method-assign]
    service.ack = ack  # type: ignore[method-assign]
    service.fetch_pages = [
        FetchedQueue(
            "t", 2, 42, [StoredMessage(40, b"v40", "k40", "", {}, 5), StoredMessage(41, b"v41", "k41", "x", {}, 6)]
        )
    ]
    out = await asyncio.to_thread(_stock_calls, server.port)
    assert out["pull"] == STOCK.PullResponse(
        context=STOCK.Context("g", "t", "2"),
        messages=[
            STOCK.Message(
                key="k40", value=b"v40", tag="tag", offset=40, properties={"p": "40"}, produceTime=1_700_000_000_040
            ),
            STOCK.Message(
                key="k41", value=b"v41", tag="tag", offset=41, properties={"p": "41"}, produceTime=1_700_000_000_041
            ),
        ],
    )
    assert out["submit"] is True
    assert out["stats"] == [STOCK.ConsumeStats("g", "t", {"2": 40}, {"2": 42}, {}, {}, {})]
    assert out["error"] == (1001, "unknown group 'nope'")
    assert out["fetch"] == STOCK.FetchResponse(
        code=0,
        results=[
            STOCK.QidResponse(
                topic="t",
                qid="2",
                nextRequestOffset=42,
                messages=[
                    STOCK.Message(key="k40", value=b"v40", tag="", offset=40, properties={}, produceTime=5),
                    STOCK.Message(key="k41", value=b"v41", tag="x", offset=41, properties={}, produceTime=6),
                ],
            )
        ],
    )
    assert service.fetches == [("g", {"t": {"2": 40}}, 5, None)]
    assert out["ack"] is True
    assert service.acks == [("g", {"t": {"2": 42}})]
    # fetch/ack declare no exception: an application error whose type is the code and whose message starts with it.
    assert out["ack_error"] == (1001, "1001: unknown group 'nope'")
    assert out["empty"] == STOCK.PullResponse(context=STOCK.Context("g", "", ""), messages=[])
    assert service.pulls[0].results == [QueueResult("g", "t", "2", [5], [6])]
    assert service.submits == [[QueueResult("g", "t", "2", [7], [])]]


# -- the blocking client ----------------------------------------------------------------------------


async def test_sync_client_round_trip_and_reconnect(service: FakeService) -> None:
    service.add(QueueId("t", 1), [5])
    first = ThriftServer(service, "127.0.0.1", 0, max_frame_bytes=4096)
    await first.start()
    port = first.port
    client = ProxyClient("127.0.0.1", port, timeout_s=GUARD_S)
    try:
        response = await asyncio.to_thread(client.pull, PullRequest(groupId="g", maxLingerTime=0))
        assert response.context == Context("g", "t", "1")
        assert [m.offset for m in response.messages] == [5]
        await first.close()  # drops the client's connection
        second = ThriftServer(service, "127.0.0.1", port, max_frame_bytes=4096)
        await second.start()
        try:
            with pytest.raises(ProxyConnectionError):
                await asyncio.to_thread(client.submit, None)
            assert not client.connected
            assert await asyncio.to_thread(client.submit, None) is True  # reconnected on demand
            service.errors.append(UnknownGroupError("unknown group 'x'"))
            with pytest.raises(PullError) as error:
                await asyncio.to_thread(client.get_consume_stats, ConsumeStatsRequest(group="x"))
            assert error.value.code == 1001
            assert client.connected  # an error reply keeps the connection
        finally:
            await second.close()
    finally:
        client.close()


async def test_clients_report_application_exceptions(server: ThriftServer, service: FakeService) -> None:
    client = AsyncProxyClient("127.0.0.1", server.port, timeout_s=GUARD_S)
    try:
        service.errors.append(UnknownTopicError("group 'g' does not consume topic 'x'"))
        with pytest.raises(RemoteApplicationError) as error:
            await client.fetch(wire.FetchRequest(consumerId="c", groupId="g", cluster="k", fetchOffset={"x": {}}))
        assert error.value.kind == error.value.code == 1002
        assert "does not consume topic 'x'" in error.value.message
        with pytest.raises(RemoteApplicationError) as error:
            await client.fetch(wire.FetchRequest(consumerId="c", groupId="", cluster="k"))
        assert error.value.code == 1003
    finally:
        await client.close()


async def test_connection_refused() -> None:
    client = ProxyClient("127.0.0.1", free_port(), timeout_s=GUARD_S)
    with pytest.raises(ProxyConnectionError):
        await asyncio.to_thread(client.submit, None)
    async with AsyncProxyClient("127.0.0.1", free_port(), timeout_s=GUARD_S) as async_client:
        with pytest.raises(ProxyConnectionError):
            await async_client.submit(None)


def _eventually(condition: Callable[[], bool]) -> bool:
    """Poll ``condition`` (from a worker thread) until it holds or GUARD_S passes."""
    deadline = time.monotonic() + GUARD_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True




# -- the pull consumers -----------------------------------------------------------------------------


def test_parse_servers() -> None:
    assert parse_servers("h1:9000, h2 ,[::1]:9001,[::2]") == [("h1", 9000), ("h2", 9713), ("::1", 9001), ("::2", 9713)]
    assert parse_servers(["a:1"]) == [("a", 1)]
    for bad in ["", ",", "h:x", "h:0", "[::1", ":5"]:
        with pytest.raises(ValueError):
            parse_servers(bad)


class Recorder:
    """A processor that fails chosen offsets, raises on others, and calls ``on_last`` at ``last``."""

    def __init__(self, fail: set[int], raise_on: set[int], last: int) -> None:
        self.fail, self.raise_on, self.last = fail, raise_on, last
        self.seen: list[ConsumedMessage] = []
        self.lock = threading.Lock()
        self.on_last: Callable[[], None] = lambda: None
        self.reached_last = threading.Event()

    def __call__(self, message: ConsumedMessage) -> bool:
        with self.lock:
            self.seen.append(message)
        if message.offset == self.last:
            self.on_last()
            self.reached_last.set()
        if message.offset in self.raise_on:
            raise ValueError(f"cannot handle {message.offset}")
        return message.offset not in self.fail


def _expect_piggy_backed_results(service: FakeService, recorder: Recorder) -> None:
    assert [m.offset for m in recorder.seen] == [1, 2, 3, 4, 5]
    assert recorder.seen[0] == ConsumedMessage("t", "0", 1, "k1", b"v1", "tag", {"p": "1"}, 1_700_000_000_001)
    # offset 2 failed by returning False (no reason); offset 3 raised, so its failure carries the text
    reason = FailNote(3, None, "ValueError: cannot handle 3")
    expected = QueueResult("g", "t", "0", [1], [2], fail_details=[reason])
    assert [call.results for call in service.pulls] == [[], [expected]]
    assert all(call.max_batch == 3 and call.linger_ms == 200 and call.topic == "t" for call in service.pulls)
    assert service.submits == [[QueueResult("g", "t", "0", [4, 5], [])]]


async def test_pull_consumer_piggy_backs_results_and_submits_on_close(
    server: ThriftServer, service: FakeService, caplog: pytest.LogCaptureFixture
) -> None:
    service.add(QueueId("t", 0), [1, 2, 3, 4, 5])  # served as [1, 2, 3] then [4, 5] (batch size 3)
    recorder = Recorder(fail={2}, raise_on={3}, last=5)
    consumer = PullConsumer(
        f"127.0.0.1:{server.port}", "g", recorder, topic="t", threads=1, batch_size=3, linger_ms=200
    )
    recorder.on_last = consumer.stop  # so that the results of [4, 5] are left for the final submit
    consumer.start()
    with pytest.raises(RuntimeError):
        consumer.start()
    assert await asyncio.to_thread(recorder.reached_last.wait, GUARD_S)
    await asyncio.to_thread(consumer.close, GUARD_S)
    _expect_piggy_backed_results(service, recorder)
    assert consumer.stats == consumer_module.ConsumerStats(pulled=5, acked=3, failed=2, errors=0)
    assert "cannot handle 3" in caplog.text  # the processor's exception is logged


async def test_async_pull_consumer_piggy_backs_results_and_submits_on_close(
    server: ThriftServer, service: FakeService
) -> None:
    service.add(QueueId("t", 0), [1, 2, 3, 4, 5])
    recorder = Recorder(fail={2}, raise_on={3}, last=5)

    async def process(message: ConsumedMessage) -> bool:
        await asyncio.sleep(0)
        return recorder(message)

    consumer = AsyncPullConsumer(
        f"127.0.0.1:{server.port}", "g", process, topic="t", concurrency=1, batch_size=3, linger_ms=200
    )
    recorder.on_last = consumer.stop
    async with consumer:
        with pytest.raises(RuntimeError):
            await consumer.start()
        assert await asyncio.to_thread(recorder.reached_last.wait, GUARD_S)
    _expect_piggy_backed_results(service, recorder)
    assert consumer.stats == consumer_module.ConsumerStats(pulled=5, acked=3, failed=2, errors=0)


async def test_results_survive_a_failed_pull(server: ThriftServer, service: FakeService) -> None:
    service.add(QueueId("t", 4), [1, 2])
    service.add(QueueId("t", 4), [3])
    recorder = Recorder(fail=set(), raise_on=set(), last=3)
    consumer = PullConsumer(
        f"127.0.0.1:{server.port}", "g", recorder, threads=1, batch_size=2, linger_ms=200, retry_sleep_ms=1
    )
    recorder.on_last = consumer.stop
    service.errors.append(BrokerError("redis down"))  # the first pull fails
    service.errors.append(BrokerError("redis down"))  # so does the second, carrying nothing yet
    consumer.start()
    assert await asyncio.to_thread(recorder.reached_last.wait, GUARD_S)
    await asyncio.to_thread(consumer.close, GUARD_S)
    assert [call.results for call in service.pulls] == [[], [], [], [QueueResult("g", "t", "4", [1, 2], [])]]
    assert service.submits == [[QueueResult("g", "t", "4", [3], [])]]
    assert consumer.stats.errors == 2


async def test_results_survive_a_failed_pull_after_a_batch(server: ThriftServer, service: FakeService) -> None:
    service.add(QueueId("t", 4), [1, 2])
    service.add(QueueId("t", 4), [3])
    recorder = Recorder(fail={2}, raise_on=set(), last=3)
    consumer = AsyncPullConsumer(
        f"127.0.0.1:{server.port}", "g", _async(recorder), concurrency=1, batch_size=2, linger_ms=200, retry_sleep_ms=1
    )
    recorder.on_last = consumer.stop
    original_pull = service.pull

    async def failing_second_pull(*args: Any, **kwargs: Any) -> PullBatch:
        if len(service.pulls) == 1:
            service.pulls.append(PullCall(*args[:5]))
            raise BrokerError("redis down")
        return await original_pull(*args, **kwargs)

    service.pull = failing_second_pull  # type: ignore[method-assign]
    await consumer.start()
    assert await asyncio.to_thread(recorder.reached_last.wait, GUARD_S)
    async with asyncio.timeout(GUARD_S):
        await consumer.close()
    expected = [QueueResult("g", "t", "4", [1], [2])]
    assert [call.results for call in service.pulls] == [[], expected, expected]  # resent after the error
    assert service.submits == [[QueueResult("g", "t", "4", [3], [])]]


def _async(recorder: Recorder) -> Callable[[ConsumedMessage], Any]:
    async def process(message: ConsumedMessage) -> bool:
        return recorder(message)

    return process


async def test_pull_consumer_spreads_threads_over_servers(service: FakeService) -> None:
    other = FakeService()
    service.add(QueueId("t", 0), list(range(1, 21)))
    other.add(QueueId("t", 1), list(range(101, 121)))
    done = threading.Event()
    seen: set[int] = set()
    lock = threading.Lock()

    def process(message: ConsumedMessage) -> bool:
        with lock:
            seen.add(message.offset)
            if len(seen) == 40:
                done.set()
        return message.offset % 2 == 0

    async with (
        ThriftServer(service, "127.0.0.1", 0, 4096) as first,
        ThriftServer(other, "127.0.0.1", 0, 4096) as second,
    ):
        consumer = PullConsumer(
            [f"127.0.0.1:{first.port}", f"127.0.0.1:{second.port}"],
            "g",
            process,
            threads=3,
            batch_size=4,
            linger_ms=100,
        )
        consumer.start()
        try:
            assert await asyncio.to_thread(done.wait, GUARD_S)
        finally:
            await asyncio.to_thread(consumer.close, GUARD_S)
        # threads=3 over two servers is rounded up to two each: threads 0, 2 -> first; 1, 3 -> second
        assert first.connections == 2 and second.connections == 2
    # every offset is reported, to the server that handed it out
    assert service.acked() == (list(range(2, 21, 2)), list(range(1, 21, 2)))
    assert other.acked() == (list(range(102, 121, 2)), list(range(101, 121, 2)))
    assert consumer.stats.pulled == 40


async def test_pull_consumer_counts_connection_errors_and_closes() -> None:
    consumer = PullConsumer(f"127.0.0.1:{free_port()}", "g", lambda m: True, threads=2, retry_sleep_ms=1)
    consumer.start()
    try:
        assert await asyncio.to_thread(_eventually, lambda: consumer.stats.errors >= 2)
    finally:
        await asyncio.to_thread(consumer.close, GUARD_S)
    assert consumer.stats.pulled == 0


# -- ddmq consume -----------------------------------------------------------------------------------


async def test_consume_cli_prints_and_acks(
    server: ThriftServer, service: FakeService, capsys: pytest.CaptureFixture[str]
) -> None:
    service.add(QueueId("t", 2), [1, 2, 3], [b'{"a": 1}', b"\xff\xfe", b"third"])
    parser = argparse.ArgumentParser()
    consume_cli.add_cli(parser.add_subparsers())
    args = parser.parse_args(
        ["consume", "--server", f"127.0.0.1:{server.port}", "--group", "g", "--count", "2", "--linger-ms", "100"]
    )
    assert await asyncio.to_thread(args.func, args) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        {
            "topic": "t",
            "qid": 2,
            "offset": 1,
            "key": "k1",
            "tag": "tag",
            "properties": {"p": "1"},
            "produce_ms": 1_700_000_000_001,
            "value": '{"a": 1}',
        },
        {
            "topic": "t",
            "qid": 2,
            "offset": 2,
            "key": "k2",
            "tag": "tag",
            "properties": {"p": "2"},
            "produce_ms": 1_700_000_000_002,
            "value_b64": "//4=",
        },
    ]
    assert service.acked() == ([1, 2], [])
    assert [m.offset for m in service.ready[0].messages] == [3]  # never pulled (batch size = count)
