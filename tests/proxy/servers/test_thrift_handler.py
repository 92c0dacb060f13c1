"""ThriftHandler (servers/thrift/handler.py) on its own: decoded calls in, reply frames out, over a real
proxy's request surface (no sockets: the server's framing is tests/proxy/servers/test_thrift_server.py's)."""

from __future__ import annotations

import asyncio
from typing import Any

from ddmq.protocol import wire
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.wire import ConsumerService, Envelope, PullRequest, TMessageType
from ddmq.protocol.wire.frames import decode
from ddmq.proxy.api.requests import RequestRules
from ddmq.proxy.servers.thrift.handler import ThriftHandler

from ..conftest import running_proxy


def call(name: str, seqid: int, mtype: int = TMessageType.CALL, **fields: Any) -> Envelope:
    return Envelope(name, mtype, seqid, getattr(ConsumerService, f"{name}_args")(**fields))


def reply(frame: bytes | None) -> Envelope:
    """A reply frame decoded: its result struct, or a TApplicationException."""
    assert frame is not None
    def body_for(name: str, mtype: int) -> Any:
        if mtype == TMessageType.EXCEPTION:
            return wire.TApplicationException()
        return getattr(ConsumerService, f"{name}_result")()
    return decode(frame[4:], body_for)


async def test_a_pull_answers_messages_in_key_order_and_its_acks_apply(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        async with AsyncProducer(redis_url) as producer:
            for seq in range(3):
                await producer.send("t", f"k:{seq}".encode(), key="k")
        handler = ThriftHandler(service.api.bound(RequestRules(2000)))
        request = PullRequest(groupId="g", topic="t", maxBatchSize=10, maxLingerTime=2000)
        first = reply(await handler.dispatch(call("pull", 7, request=request), "peer"))
        assert first.name == "pull" and first.seqid == 7
        messages = first.body.success.messages
        assert [m.value for m in messages] == [b"k:0"]  # one per key: the key's head
        acked = wire.link_results([wire.ConsumeResult(context=first.body.success.context,
                                                     successOffsets=[messages[0].offset])])
        second = reply(await handler.dispatch(call("submit", 8, result=acked), "peer"))
        assert second.body.success is True
        third = reply(await handler.dispatch(call("pull", 9, request=request), "peer"))
        assert [m.value for m in third.body.success.messages] == [b"k:1"]


async def test_an_unknown_group_is_a_pull_exception_not_a_dropped_call(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        handler = ThriftHandler(service.api.bound(RequestRules(0)))
        answer = reply(await handler.dispatch(call("pull", 3, request=PullRequest(groupId="nope")), "peer"))
        assert answer.body.success is None and answer.body.error is not None and answer.body.error.code == 1001


async def test_a_request_without_a_group_is_refused_as_bad(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        handler = ThriftHandler(service.api.bound(RequestRules(0)))
        answer = reply(await handler.dispatch(call("pull", 4, request=PullRequest(groupId="")), "peer"))
        assert answer.body.error is not None and answer.body.error.code == 1003


async def test_an_unknown_method_and_a_non_call_are_application_errors(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        handler = ThriftHandler(service.api.bound(RequestRules(0)))
        unknown = reply(await handler.dispatch(Envelope("nosuch", TMessageType.CALL, 5, None), "peer"))
        assert unknown.type == TMessageType.EXCEPTION
        assert unknown.body.type == wire.TApplicationException.UNKNOWN_METHOD
        not_a_call = reply(await handler.dispatch(call("pull", 6, TMessageType.REPLY, request=PullRequest()), "peer"))
        assert not_a_call.type == TMessageType.EXCEPTION
        assert not_a_call.body.type == wire.TApplicationException.INVALID_MESSAGE_TYPE


async def test_a_oneway_call_gets_no_reply_even_when_it_fails(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        handler = ThriftHandler(service.api.bound(RequestRules(0)))
        frame = await handler.dispatch(call("pull", 1, TMessageType.ONEWAY, request=PullRequest(groupId="nope")), "p")
        assert frame is None


async def test_a_parked_pull_is_written_as_it_is_answered_in_key_order_and_whole(redis_url: str) -> None:
    """Each message arrives while the pull waits: its reply goes out through ``write`` in the step
    that answers the pull, once, and dispatch then has nothing left to send. Keys stay in order and
    every message produced is delivered."""
    async with running_proxy(redis_url) as service, AsyncProducer(redis_url) as producer:
        handler = ThriftHandler(service.api.bound(RequestRules(5000)))
        request = PullRequest(groupId="g", topic="t", maxBatchSize=10, maxLingerTime=5000)
        sent = [(f"k{seq % 3}", f"{seq % 3}:{seq // 3}".encode()) for seq in range(9)]
        got: list[bytes] = []
        acks: wire.ConsumeResult | None = None
        for seqid, (key, value) in enumerate(sent, start=1):
            frames: list[bytes] = []
            request.result = acks
            pulled = asyncio.create_task(handler.dispatch(call("pull", seqid, request=request), "peer", frames.append))
            while service.registry.group("g").buffer.parked == 0:  # noqa: ASYNC110  (parks on its first steps)
                await asyncio.sleep(0.001)
            await producer.send("t", value, key=key)
            assert await asyncio.wait_for(pulled, 5) is None  # written already: nothing more to send
            assert len(frames) == 1
            answer = reply(frames[0])
            assert answer.seqid == seqid
            success = answer.body.success
            got += [m.value for m in success.messages]
            acks = wire.link_results([wire.ConsumeResult(context=success.context,
                                                        successOffsets=[m.offset for m in success.messages])])
        assert sorted(got) == sorted(value for _, value in sent)
        for key in ("0", "1", "2"):
            assert [v for v in got if v.startswith(key.encode())] == [f"{key}:{n}".encode() for n in range(3)]


async def test_a_parked_pull_whose_early_write_fails_is_answered_by_dispatch(redis_url: str) -> None:
    """A connection lost under the early write: dispatch returns the reply as for any other call (the
    server's own write then meets the lost connection), and the message went out as delivered."""
    async with running_proxy(redis_url) as service, AsyncProducer(redis_url) as producer:
        handler = ThriftHandler(service.api.bound(RequestRules(5000)))
        request = PullRequest(groupId="g", topic="t", maxBatchSize=10, maxLingerTime=5000)

        def lost(frame: bytes) -> None:
            raise ConnectionResetError("connection lost")

        pulled = asyncio.create_task(handler.dispatch(call("pull", 4, request=request), "peer", lost))
        while service.registry.group("g").buffer.parked == 0:  # noqa: ASYNC110  (parks on its first steps)
            await asyncio.sleep(0.001)
        await producer.send("t", b"v", key="k")
        answer = reply(await asyncio.wait_for(pulled, 5))
        assert answer.seqid == 4 and [m.value for m in answer.body.success.messages] == [b"v"]
