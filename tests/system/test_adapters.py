"""The same request cases over Thrift and over HTTP: both adapters must answer them the same way.

Each case runs once per adapter against a real proxy (in this event loop), real Redis and real
sockets; :class:`Wire` is the only thing that differs: it speaks one protocol and maps its answers
and errors onto the same small values. The request rules themselves live behind the service
(``ddmq.proxy.api.requests``); a case that fails for one adapter only means that adapter decides
something itself. Cases that deliver messages check per-key order and that every produced message
is delivered and committed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NamedTuple, Protocol

import aiohttp
import pytest
from thriftpy2.thrift import TType

from ddmq.client.thrift_client import AsyncProxyClient, PullError
from ddmq.protocol import wire
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.wire import writer as thrift_writer
from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS
from ddmq.proxy.core.pull_codec import encode_pull_reply
from ddmq.proxy.core.types import StoredMessage
from ddmq.proxy.service import ProxyService

from ..http_support import ApiClient, OpenApiChecker
from ..proxy.conftest import proxy_config, running_proxy
from ..support import OrderChecker, produce_keyed

GUARD_S = 15  # failure guard for waits: a hang fails the test instead of blocking the run
MAX_LINGER_MS = 1500  # both servers' bound; above the 1000 ms default so the two differ
ADAPTERS = ["thrift", "http"]


class Msg(NamedTuple):
    offset: int
    key: str
    value: bytes


class Reply(NamedTuple):
    qid: int | None
    messages: list[Msg]
    runs: list[int] | None


class Result(NamedTuple):
    topic: str
    qid: str
    success: list[int]
    fail: list[int]
    group: str | None = None  # None: the request's group


class Refused(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Wire(Protocol):
    async def pull(
        self,
        group: str = "g",
        topic: str | None = "t",
        max_batch: int | None = None,
        linger_ms: int | None = 0,
        results: list[Result] | None = None,
        max_per_key: int | None = None,
    ) -> Reply: ...

    async def ack(self, results: list[Result], group: str = "g") -> None:
        """Thrift ``submit`` or HTTP ``POST /v1/ack``."""
        ...


class ThriftWire:
    def __init__(self, client: AsyncProxyClient) -> None:
        self._client = client

    async def pull(
        self,
        group: str = "g",
        topic: str | None = "t",
        max_batch: int | None = None,
        linger_ms: int | None = 0,
        results: list[Result] | None = None,
        max_per_key: int | None = None,
    ) -> Reply:
        request = wire.PullRequest(
            groupId=group,
            topic=topic,
            maxBatchSize=max_batch,
            maxLingerTime=linger_ms,
            result=_link(results or []),
            maxPerKey=max_per_key,
        )
        try:
            async with asyncio.timeout(GUARD_S):
                response = await self._client.pull(request)
        except PullError as exc:
            raise Refused(exc.code) from exc
        qid = int(response.context.qid) if response.context.qid else None
        messages = [Msg(m.offset, m.key, m.value) for m in response.messages]
        return Reply(qid, messages, list(response.runs) if response.runs is not None else None)

    async def ack(self, results: list[Result], group: str = "g") -> None:
        # Thrift's submit names no group of its own: each result carries it.
        named = [r if r.group is not None else r._replace(group=group) for r in results]
        try:
            async with asyncio.timeout(GUARD_S):
                assert await self._client.submit(_link(named)) is True
        except PullError as exc:
            raise Refused(exc.code) from exc


def _link(results: list[Result]) -> wire.ConsumeResult | None:
    return wire.link_results(
        [wire.ConsumeResult(wire.Context(r.group, r.topic, r.qid), r.success, r.fail) for r in results]
    )


class HttpWire:
    def __init__(self, api: ApiClient) -> None:
        self._api = api

    async def pull(
        self,
        group: str = "g",
        topic: str | None = "t",
        max_batch: int | None = None,
        linger_ms: int | None = 0,
        results: list[Result] | None = None,
        max_per_key: int | None = None,
    ) -> Reply:
        request: dict[str, Any] = {"group": group, "results": _json(results or [])}
        for name, value in (("topic", topic), ("max_batch", max_batch), ("linger_ms", linger_ms),
                            ("max_per_key", max_per_key)):
            if value is not None:
                request[name] = value
        async with asyncio.timeout(GUARD_S):
            status, body = await self._api.call("POST", "/v1/pull", json=request)
        if status != 200:
            raise Refused(body["code"])
        messages = [Msg(m["offset"], m["key"], base64.b64decode(m["value_base64"])) for m in body["messages"]]
        return Reply(body["qid"], messages, body.get("runs"))

    async def ack(self, results: list[Result], group: str = "g") -> None:
        async with asyncio.timeout(GUARD_S):
            status, body = await self._api.call("POST", "/v1/ack", json={"group": group, "results": _json(results)})
        if status != 200:
            raise Refused(body["code"])
        assert body == {"ok": True}


def _json(results: list[Result]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        node: dict[str, Any] = {"topic": r.topic, "qid": r.qid, "success": r.success, "fail": r.fail}
        if r.group is not None:
            node["group"] = r.group
        out.append(node)
    return out


@asynccontextmanager
async def proxy(
    adapter: str, redis_url: str, topic_config: dict[str, Any] | None = None, **kw: Any
) -> AsyncIterator[tuple[ProxyService, Wire]]:
    """A running proxy with both servers (same linger bound, bodies big enough for the offset
    limit) and a client of ``adapter``'s protocol."""
    kw.setdefault("thrift", {"port": 0, "max_linger_ms": MAX_LINGER_MS})
    http = {"enabled": True, "port": 0, "max_linger_ms": MAX_LINGER_MS,
            "max_body_bytes": 8 << 20, "max_buffered_bytes": 8 << 20}
    async with running_proxy(redis_url, topic_config, http=http, **kw) as service:
        if adapter == "thrift":
            assert service.thrift_port is not None
            async with AsyncProxyClient("127.0.0.1", service.thrift_port, timeout_s=GUARD_S) as client:
                yield service, ThriftWire(client)
        else:
            async with aiohttp.ClientSession() as session:
                yield service, HttpWire(ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker()))


def produce(redis_url: str, count: int, keys: int, seed: int = 11) -> dict[str, int]:
    produced: dict[str, int] = {}
    produce_keyed(redis_url, count, produced, random.Random(seed), keys=keys)
    return produced


def record(reply: Reply, checker: OrderChecker) -> list[Result]:
    """Check ``reply``'s messages in order and ack them: the results acking it."""
    for m in reply.messages:
        event = json.loads(m.value)
        assert event["k"] == m.key
        checker.delivered(event["k"], event["seq"])
        checker.acked(event["k"], event["seq"])
    if not reply.messages:
        return []
    return [Result("t", str(reply.qid), [m.offset for m in reply.messages], [])]


async def consume_all(
    service: ProxyService, client: Wire, produced: dict[str, int], checker: OrderChecker | None = None,
    **pull: Any,
) -> OrderChecker:
    """Pull with piggy-backed acks until every produced message was acked, each key in order; then
    the committed offsets reach the produced ones."""
    checker = checker or OrderChecker()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 4 * GUARD_S
    results: list[Result] = []
    while checker.missing(produced):
        assert loop.time() < deadline, f"not consumed: {checker.missing(produced)}"
        results = record(await client.pull(max_batch=16, linger_ms=200, results=results, **pull), checker)
    if results:
        await client.ack(results)
    assert checker.violations == []

    async def committed() -> bool:
        (row,) = await service.api.consume_stats("g", "t")
        return row.consume_offsets == row.produce_offsets

    while not await committed():
        assert loop.time() < deadline, "offsets not committed"
        await asyncio.sleep(0.05)
    return checker


async def eventually_true(check: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GUARD_S
    while not check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


# -- the cases ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_unknown_group_and_topic(adapter: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url) as (service, client):
        produced = produce(redis_url, 20, keys=4)
        with pytest.raises(Refused) as unknown_group:
            await client.pull(group="ghost")
        with pytest.raises(Refused) as unknown_topic:
            await client.pull(topic="ghost")
        assert (unknown_group.value.code, unknown_topic.value.code) == (1001, 1002)
        with pytest.raises(Refused) as bad_batch:
            await client.pull(max_batch=-1)
        with pytest.raises(Refused) as bad_per_key:
            await client.pull(max_per_key=-1)
        assert (bad_batch.value.code, bad_per_key.value.code) == (1003, 1003)
        await consume_all(service, client, produced)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_linger_default_parks_and_every_linger_is_bounded(adapter: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url) as (service, client):
        buffer = service.groups["g"].buffer
        # Unset: the default long poll parks (it is not 0) and ends by itself.
        waiting = asyncio.create_task(client.pull(linger_ms=None))
        await eventually_true(lambda: buffer.parked == 1)
        assert (await waiting).messages == []
        # Far above the server's bound: answered within the bound, not after a billion ms.
        assert (await client.pull(linger_ms=10**9)).messages == []
        # A message produced while a pull is parked: whatever the bounded long poll got is acked,
        # and the rest consumed, in order.
        waiting = asyncio.create_task(client.pull(linger_ms=10**9))
        await eventually_true(lambda: buffer.parked == 1)
        produced = produce(redis_url, 1, keys=1)
        checker = OrderChecker()
        acks = record(await waiting, checker)
        if acks:
            await client.ack(acks)
        await consume_all(service, client, produced, checker)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_results_for_offsets_and_queues_not_held_are_ignored_and_counted(adapter: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url, {"order_key": "KEY"}) as (service, client):
        produced = produce(redis_url, 60, keys=6)
        checker = OrderChecker()
        reply = Reply(None, [], None)
        while not reply.messages:
            reply = await client.pull(max_batch=8, linger_ms=200)
        acks = record(reply, checker)
        bogus = [
            Result("t", str(reply.qid), [10**9], [10**9 + 1]),  # a queue of ours, offsets it does not hold
            Result("nope", "0", [1], [2]),  # a topic the group does not consume
            Result("t", "99", [1], []),  # no such qid
            Result("t", "x", [], [1]),  # not a qid
            Result("t", "0", [1], [], group="ghost"),  # another group, unknown here
        ]
        before = service.groups["g"].buffer.stats
        await client.ack(bogus + acks)
        after = service.groups["g"].buffer.stats
        # "x" can name no queue: left out by the request rules (invalid_results), the rest stray acks.
        assert (service.counters["unknown_results"], service.counters["invalid_results"]) == (4, 1)
        assert (after.unknown_acks - before.unknown_acks, after.unknown_fails - before.unknown_fails) == (1, 1)
        assert after.acked - before.acked == len(reply.messages)
        await consume_all(service, client, produced, checker)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_an_ack_releases_the_keys_successor(adapter: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url, {"order_key": "KEY"}) as (service, client):
        produced = produce(redis_url, 3, keys=1)
        checker = OrderChecker()
        head = Reply(None, [], None)
        while not head.messages:
            head = await client.pull(max_batch=8, linger_ms=200)
        assert len(head.messages) == 1, "only a key's head may be out"
        # Its successors stay behind it: nothing else is ready until it is acked.
        assert (await client.pull(max_batch=8, linger_ms=0)).messages == []
        await client.ack(record(head, checker))
        successor = await client.pull(max_batch=8, linger_ms=MAX_LINGER_MS)
        assert [json.loads(m.value)["seq"] for m in successor.messages] == [1]
        await client.ack(record(successor, checker))
        await consume_all(service, client, produced, checker)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_fail_is_delivered_again_before_the_keys_successor(adapter: str, redis_url: str) -> None:
    config = {"order_key": "KEY", "retry_intervals_ms": [0], "max_retry": 3}
    async with proxy(adapter, redis_url, config) as (service, client):
        produced = produce(redis_url, 2, keys=1)
        head = Reply(None, [], None)
        while not head.messages:
            head = await client.pull(max_batch=8, linger_ms=200)
        assert len(head.messages) == 1
        await client.ack([Result("t", str(head.qid), [], [head.messages[0].offset])])
        again = Reply(None, [], None)
        while not again.messages:
            again = await client.pull(max_batch=8, linger_ms=200)
        assert again.messages == head.messages
        checker = OrderChecker()
        await client.ack(record(again, checker))
        await consume_all(service, client, produced, checker)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_piggy_backed_results_naming_no_group_are_the_pulls(adapter: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url, {"order_key": "KEY"}) as (service, client):
        produced = produce(redis_url, 200, keys=10)
        # consume_all sends every ack piggy-backed on the next pull, without a group of its own.
        await consume_all(service, client, produced)
        assert service.counters["unknown_results"] == 0


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("via", ["pull", "ack"])
async def test_too_many_offsets_are_refused_with_nothing_applied(adapter: str, via: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url, {"order_key": "KEY"}) as (service, client):
        produced = produce(redis_url, 40, keys=4)
        checker = OrderChecker()
        reply = Reply(None, [], None)
        while not reply.messages:
            reply = await client.pull(max_batch=8, linger_ms=200)
        acks = record(reply, checker)
        filler = Result("t", str(reply.qid), list(range(10**6, 10**6 + MAX_RESULT_OFFSETS)), [])
        buffer = service.groups["g"].buffer
        in_flight, acked = buffer.in_flight, buffer.stats.acked
        with pytest.raises(Refused) as refused:
            if via == "pull":
                await client.pull(results=[*acks, filler])
            else:
                await client.ack([*acks, filler])
        assert refused.value.code == 1003
        assert (buffer.in_flight, buffer.stats.acked) == (in_flight, acked)
        await client.ack(acks)  # the same acks alone are taken
        assert buffer.stats.acked == acked + len(reply.messages)
        await consume_all(service, client, produced, checker)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_max_per_key_answers_ordered_runs(adapter: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url, {"order_key": "QID"}, queues=1) as (service, client):
        produced = produce(redis_url, 10, keys=1)
        buffer = service.groups["g"].buffer
        await eventually_true(lambda: buffer.ready >= 1)
        checker = OrderChecker()
        plain = await client.pull(max_batch=8)
        assert len(plain.messages) == 1 and plain.runs is None
        run = await client.pull(max_batch=8, max_per_key=8, results=record(plain, checker), linger_ms=MAX_LINGER_MS)
        assert run.runs == [8]
        assert [json.loads(m.value)["seq"] for m in run.messages] == list(range(1, 9))
        await client.ack(record(run, checker))
        await consume_all(service, client, produced, checker, max_per_key=4)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_removed_group_is_unknown_to_pulls_and_takes_acks_while_it_drains(adapter: str, redis_url: str) -> None:
    groups = {"g": {"t": {"order_key": "KEY"}}, "g2": {"t": {"order_key": "KEY"}}}
    leases = {"handoff_drain_ms": 60_000}
    async with proxy(adapter, redis_url, groups=groups, leases=leases) as (service, client):
        produced = produce(redis_url, 10, keys=1)  # one queue, its first message is the key's head
        held = Reply(None, [], None)
        while not held.messages:
            held = await client.pull(group="g2", max_batch=1, linger_ms=200)
        assert held.qid is not None
        (message,) = held.messages
        smaller = proxy_config(redis_url, None, groups={"g": groups["g"]}, leases=leases)
        reload = asyncio.create_task(service.reload(smaller))
        await eventually_true(lambda: service.groups["g2"].removed)
        with pytest.raises(Refused) as removed:
            await client.pull(group="g2")
        assert removed.value.code == 1001
        # The message it holds is acked during the drain, which then ends without waiting it out.
        await client.ack([Result("t", str(held.qid), [message.offset], [])], group="g2")
        async with asyncio.timeout(GUARD_S):
            await reload
        assert "g2" not in service.groups
        assert service.broker is not None
        committed = await service.broker.committed_offset("g2", "t", held.qid)
        assert committed is not None and committed > message.offset
        with pytest.raises(Refused) as gone:
            await client.pull(group="g2")
        assert gone.value.code == 1001
        await consume_all(service, client, produced)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_integers_outside_their_idl_range_are_refused_with_1003(
    adapter: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """maxPerKey, maxBatchSize and maxLingerTime are i32 in the IDL: a value past 2^31-1 is a bad
    request over both protocols (the compact protocol's varints would carry any size), and the
    results riding on such a pull are not applied."""
    # A hostile Thrift client: our writer refuses such values, so this test's own writer is told not to.
    monkeypatch.setitem(thrift_writer._INT_LIMITS, TType.I32, 1 << 63)
    async with proxy(adapter, redis_url, {"order_key": "KEY"}) as (service, client):
        produced = produce(redis_url, 30, keys=3)
        checker = OrderChecker()
        reply = Reply(None, [], None)
        while not reply.messages:
            reply = await client.pull(max_batch=8, linger_ms=200)
        acks = record(reply, checker)
        buffer = service.groups["g"].buffer
        acked = buffer.stats.acked
        for field in ("max_per_key", "max_batch", "linger_ms"):
            for value in (2**31, 2**40):
                with pytest.raises(Refused) as refused:
                    await client.pull(results=acks, **{field: value})
                assert refused.value.code == 1003, (field, value)
        assert buffer.stats.acked == acked, "nothing of a refused request is applied"
        # The largest i32 is a valid request (and asks for no more than the topic gives).
        acks = record(await client.pull(max_per_key=2**31 - 1, max_batch=2**31 - 1, results=acks), checker)
        if acks:
            await client.ack(acks)
        await consume_all(service, client, produced, checker)


BIG_VALUE_BYTES = 1_500_000
SDK_MAX_FRAME_BYTES = 16_384_000  # DDMQ's SDKs (and Thrift's libraries by default) refuse larger frames


def produce_big(redis_url: str, count: int = 40, keys: int = 8) -> dict[str, int]:
    produced: dict[str, int] = {}
    with Producer(redis_url) as producer:
        for i in range(count):
            key = f"k{i % keys}"
            seq = produced.get(key, 0)
            produced[key] = seq + 1
            producer.send("t", json.dumps({"k": key, "seq": seq, "pad": "x" * BIG_VALUE_BYTES}), key=key)
    return produced


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("per_key", [1, 32])
async def test_big_messages_fill_replies_up_to_max_reply_bytes_and_each_goes_out_once(
    adapter: str, per_key: int, redis_url: str
) -> None:
    """40 messages of 1.5 MB pulled with maxBatchSize 32: every reply stays within the topic's
    max_reply_bytes (8 MiB by default, under what DDMQ's SDKs take) in the bytes sent, and every
    message goes out once: what a reply has no room for is not in flight meanwhile, and nothing times
    out, fails or is retried; each key in order."""
    async with proxy(adapter, redis_url, queues=1) as (service, _):
        limit = service.config.groups["g"]["t"].max_reply_bytes
        assert limit == 8 * 1024 * 1024 < SDK_MAX_FRAME_BYTES
        produced = produce_big(redis_url)
        buffer = service.groups["g"].buffer
        checker = OrderChecker()
        sizes: list[int] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * GUARD_S

        def record_big(messages: list[Msg]) -> list[int]:
            assert buffer.in_flight == len(messages), "what the reply had no room for is not in flight"
            for m in messages:
                event = json.loads(m.value)
                checker.delivered(event["k"], event["seq"])
                checker.acked(event["k"], event["seq"])
            return [m.offset for m in messages]

        if adapter == "thrift":
            # The client refuses any frame above the limit, as DDMQ's SDKs refuse those above theirs.
            async with AsyncProxyClient("127.0.0.1", service.thrift_port or 0, timeout_s=GUARD_S,
                                        max_frame_bytes=limit) as client:
                pending: list[wire.ConsumeResult] = []
                while checker.missing(produced):
                    assert loop.time() < deadline, checker.missing(produced)
                    response = await client.pull(wire.PullRequest(
                        groupId="g", topic="t", maxBatchSize=32, maxLingerTime=500, maxPerKey=per_key,
                        result=wire.link_results(pending)))
                    acked = record_big([Msg(m.offset, m.key, m.value) for m in response.messages])
                    pending = [wire.ConsumeResult(context=response.context, successOffsets=acked)] if acked else []
                    if acked:
                        # the frame as the proxy wrote it (the codec is byte-exact; only the seqid differs)
                        stored = [StoredMessage(m.offset, m.value, m.key, m.tag, m.properties or {}, m.produceTime)
                                  for m in response.messages]
                        sizes.append(len(encode_pull_reply(0, "g", "t", response.context.qid, stored, response.runs)))
                await client.submit(wire.link_results(pending))
        else:
            async with aiohttp.ClientSession() as session:
                results: list[dict[str, Any]] = []
                while checker.missing(produced):
                    assert loop.time() < deadline, checker.missing(produced)
                    request = {"group": "g", "topic": "t", "max_batch": 32, "linger_ms": 500,
                               "max_per_key": per_key, "results": results}
                    async with session.post(f"http://127.0.0.1:{service.http_port}/v1/pull", json=request) as answer:
                        raw = await answer.read()
                    assert answer.status == 200 and len(raw) <= limit, (answer.status, len(raw))
                    body = OpenApiChecker().check("POST", "/v1/pull", 200, answer.content_type, raw)
                    acked = record_big([Msg(m["offset"], m["key"], base64.b64decode(m["value_base64"]))
                                        for m in body["messages"]])
                    results = [{"topic": "t", "qid": body["qid"], "success": acked}] if acked else []
                    if acked:
                        sizes.append(len(raw))
                async with session.post(f"http://127.0.0.1:{service.http_port}/v1/ack",
                                        json={"group": "g", "results": results}) as answer:
                    assert answer.status == 200
        assert checker.violations == [] and checker.deliveries == 40 and checker.duplicates == 0
        assert max(sizes) <= limit and len(sizes) < 40, sizes  # several messages per reply, none over
        stats = buffer.stats
        assert (stats.delivered, stats.acked, stats.failed, stats.timed_out, stats.retried) == (40, 40, 0, 0, 0)


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_a_message_over_max_reply_bytes_is_delivered_alone_with_a_warning(
    adapter: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with proxy(adapter, redis_url, {"max_reply_bytes": 1 << 20}, queues=1) as (service, client):
        produced: dict[str, int] = {}
        with Producer(redis_url) as producer:
            for i in range(21):
                key = f"k{i % 7}"
                seq = produced.get(key, 0)
                produced[key] = seq + 1
                pad = "x" * (1_200_000 if i == 10 else 10)
                producer.send("t", json.dumps({"k": key, "seq": seq, "pad": pad}), key=key)
        checker = OrderChecker()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 4 * GUARD_S
        results: list[Result] = []
        alone = []
        while checker.missing(produced):
            assert loop.time() < deadline, checker.missing(produced)
            reply = await client.pull(max_batch=32, linger_ms=500, results=results)
            if any(len(m.value) > 1_000_000 for m in reply.messages):
                alone.append(len(reply.messages))
            results = record(reply, checker)
        await client.ack(results)
        assert alone == [1] and checker.deliveries == 21 and not checker.violations
        warnings = [r.getMessage() for r in caplog.records
                    if r.levelname == "WARNING" and "delivered alone" in r.getMessage()]
        assert len(warnings) == 1 and "t#0@11 takes " in warnings[0] and "max_reply_bytes (1048576)" in warnings[0]
        assert int(warnings[0].split(" takes ")[1].split()[0]) > 1_200_000
        assert service.groups["g"].buffer.stats.retried == 0
