"""Retriable pulls: a real proxy process behind the relay harness, which loses a pull's reply (the proxy
wrote it in full, the client's connection is reset before a byte of it arrives).

With a request id, the same pull retried gets the same messages at once (the group's ``timeout_ms`` is
a minute, longer than the test may run), its acks count once, and over a workload of lost replies
every message is delivered once, in its key's order. Without one, the messages of a lost reply come
back only after ``timeout_ms``, as redeliveries. Over Thrift and HTTP, and through the project's SDK.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ddmq.client.async_consumer import AsyncPullConsumer
from ddmq.client.pull_parts import ConsumedMessage
from ddmq.client.thrift_client import AsyncProxyClient, ProxyConnectionError
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from tests.harness.relay import Relay

from ..support import OrderChecker, ProxyProcess, produce_keyed, until
from .test_http_end_to_end import wait_ready
from .test_stray_acks import metric

GROUP = "g"
TOPIC = "t"
#: A pulled message as the tests keep it: (qid, offset, key, seq).
Got = tuple[str, int, str, int]
#: One pull: (request id or None, results to carry, linger) -> what it answered; raises ConnectionError
#: when its reply was lost.
Pull = Callable[[str | None, list[tuple[str, list[int]]], int], Awaitable[list[Got]]]


def _group(timeout_ms: int) -> dict[str, Any]:
    return {TOPIC: {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": timeout_ms,
                    "max_retry": 50, "retry_intervals_ms": [20]}}


@asynccontextmanager
async def stack(tmp_path: Path, redis_url: str, timeout_ms: int, queues: int, wire_name: str
                ) -> AsyncIterator[tuple[ProxyProcess, str, Relay]]:
    """A proxy (Thrift and HTTP), its HTTP base URL, and a relay in front of the port ``wire_name``."""
    http_port = free_port()
    proxy = ProxyProcess(tmp_path, redis_url, {GROUP: _group(timeout_ms)}, {TOPIC: {"queues": queues}},
                         http={"enabled": True, "host": "127.0.0.1", "port": http_port}).start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        await wait_ready(base)
        with Relay(proxy.port if wire_name == "thrift" else http_port) as relay:
            yield proxy, base, relay
    finally:
        assert proxy.stop() == 0, proxy.log()


@asynccontextmanager
async def puller(wire_name: str, relay: Relay) -> AsyncIterator[Pull]:
    """Pulls through the relay over ``wire_name``."""
    if wire_name == "thrift":
        async with AsyncProxyClient("127.0.0.1", relay.port, timeout_s=10) as client:
            async def thrift_pull(request_id: str | None, acks: list[tuple[str, list[int]]], linger: int) -> list[Got]:
                results = wire.link_results(
                    wire.ConsumeResult(context=wire.Context(groupId=GROUP, topic=TOPIC, qid=qid),
                                       successOffsets=offsets, failOffsets=[]) for qid, offsets in acks)
                response = await client.pull(wire.PullRequest(
                    groupId=GROUP, topic=TOPIC, maxBatchSize=50, maxLingerTime=linger, result=results,
                    requestId=request_id))
                qid = response.context.qid
                return [(qid, m.offset, *_key_seq(m.value)) for m in response.messages]
            yield thrift_pull
        return
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        async def http_pull(request_id: str | None, acks: list[tuple[str, list[int]]], linger: int) -> list[Got]:
            body: dict[str, Any] = {
                "group": GROUP, "topic": TOPIC, "max_batch": 50, "linger_ms": linger,
                "results": [{"topic": TOPIC, "qid": qid, "success": offsets} for qid, offsets in acks],
            }
            if request_id is not None:
                body["request_id"] = request_id
            try:
                async with session.post(f"http://127.0.0.1:{relay.port}/v1/pull", json=body) as response:
                    assert response.status == 200, await response.text()
                    answer = await response.json()
            except aiohttp.ClientError as exc:  # the reset connection
                raise ConnectionError(str(exc)) from exc
            qid = str(answer["qid"])
            return [(qid, m["offset"], *_key_seq(m["value_text"].encode())) for m in answer["messages"]]
        yield http_pull


def _key_seq(value: bytes) -> tuple[str, int]:
    event = json.loads(value)
    return event["k"], event["seq"]


def _acks(got: list[Got]) -> list[tuple[str, list[int]]]:
    return [(got[0][0], [offset for _, offset, _, _ in got])] if got else []


async def _lost(pull: Pull, relay: Relay, request_id: str | None, acks: list[tuple[str, list[int]]],
                linger: int) -> None:
    """Send a pull whose reply the relay loses."""
    lost = relay.stats()["lost_replies"]
    relay.mode("lose-reply")
    with pytest.raises((ConnectionError, ProxyConnectionError)):
        await pull(request_id, acks, linger)
    assert relay.stats()["lost_replies"] == lost + 1


async def _figures(base: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        return {name: await metric(session, base, f"ddmq_{name}_total", GROUP)
                for name in ("messages_delivered", "messages_acked", "acks_unknown", "messages_timed_out")}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wire_name", ["thrift", "http"])
async def test_a_retried_pull_gets_its_lost_reply_again(redis_url: str, tmp_path: Path, wire_name: str) -> None:
    """Every pull's reply is lost once and retried with its id: the retry answers the same messages
    (none waits for the minute's timeout_ms, which the test cannot outlast), in order, each once."""
    rng = random.Random(46)
    produced: dict[str, int] = {}
    async with stack(tmp_path, redis_url, 60_000, 2, wire_name) as (_, base, relay), puller(wire_name, relay) as pull:
        await asyncio.to_thread(functools.partial(produce_keyed, keys=20, topic=TOPIC), redis_url, 300, produced, rng)
        checker = OrderChecker()
        acks: list[tuple[str, list[int]]] = []
        for round_no in range(200):
            if not checker.missing(produced):
                break
            request_id = f"{wire_name}-pull-{round_no}"
            await _lost(pull, relay, request_id, acks, 500)
            got = await pull(request_id, acks, 500)  # the same request: its acks were applied by the first
            for _, _, key, seq in got:
                checker.delivered(key, seq)
                checker.acked(key, seq)
            acks = _acks(got)
        assert not checker.missing(produced), checker.missing(produced)
        await pull(None, acks, 0)
        assert checker.violations == [] and checker.duplicates == 0
        # Each message handed out once and acked once: the retries' acks were not applied again.
        figures = await _figures(base)
        assert figures == {"messages_delivered": 300, "messages_acked": 300, "acks_unknown": 0,
                           "messages_timed_out": 0}, figures


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wire_name", ["thrift", "http"])
async def test_without_a_request_id_a_lost_reply_waits_for_the_timeout(
    redis_url: str, tmp_path: Path, wire_name: str
) -> None:
    """As DDMQ's clients see it: the lost reply's messages stay in flight, and come back only once
    timeout_ms (1.5 s) has passed, as redeliveries."""
    produced: dict[str, int] = {}
    async with stack(tmp_path, redis_url, 1500, 1, wire_name) as (_, base, relay), puller(wire_name, relay) as pull:
        await asyncio.to_thread(functools.partial(produce_keyed, keys=1000, topic=TOPIC), redis_url, 5, produced,
                                random.Random(7))
        async with aiohttp.ClientSession() as session:
            async def ready() -> int:
                async with session.get(f"{base}/admin/groups/{GROUP}") as response:
                    view = await response.json()
                return sum(topic["ready"] for topic in view["topics"])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while (await ready()) < 5:
                assert loop.time() < deadline, "5 messages ready"
                await asyncio.sleep(0.05)
        await _lost(pull, relay, None, [], 500)
        assert await pull(None, [], 0) == []  # all five are in flight: nothing to answer
        back: list[Got] = []
        while len(back) < 5:
            back += await pull(None, [], 3000)
        figures = await _figures(base)
        assert figures["messages_timed_out"] == 5 and figures["messages_delivered"] == 10, figures
        assert sorted(key for _, _, key, _ in back) == sorted(produced)


@pytest.mark.timeout(90)
async def test_the_sdk_retries_a_lost_reply_with_its_request_id(redis_url: str, tmp_path: Path) -> None:
    """The project's consumer over a link that loses replies again and again: every message is acked,
    in its key's order, none waits for timeout_ms (a minute), none is acked twice."""
    rng = random.Random(4646)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    async with stack(tmp_path, redis_url, 60_000, 4, "thrift") as (_, base, relay):
        await asyncio.to_thread(functools.partial(produce_keyed, keys=200, topic=TOPIC), redis_url, 3000, produced,
                                rng)

        async def handle(message: ConsumedMessage) -> bool:
            key, seq = _key_seq(message.value)
            checker.delivered(key, seq)
            checker.acked(key, seq)
            return True

        # One puller: a reply is lost only once its predecessor's retry was answered (deliveries went on),
        # never the retry's own (a second loss in a row, after which the SDK gives the pull up).
        consumer = AsyncPullConsumer(f"127.0.0.1:{relay.port}", GROUP, handle, topic=TOPIC, concurrency=1,
                                     batch_size=16, linger_ms=200)
        async with consumer:
            while relay.stats()["lost_replies"] < 5:
                if not checker.missing(produced):  # drained before five losses (a fast build): more to pull
                    await asyncio.to_thread(functools.partial(produce_keyed, keys=200, topic=TOPIC), redis_url, 500,
                                            produced, rng)
                lost = relay.stats()["lost_replies"]
                relay.mode("lose-reply")
                await until("a reply lost", lambda lost=lost: relay.stats()["lost_replies"] > lost, 10)
                # Counted from the loss on: what the puller handles next came with the retry or after it.
                seen = checker.deliveries
                await until("deliveries going on",
                            lambda seen=seen: checker.deliveries > seen or not checker.missing(produced), 10)
            await until("every message acked", lambda: not checker.missing(produced), 30)
            consumer.stop()
            await consumer.wait()
        assert relay.stats()["lost_replies"] >= 5
        assert checker.violations == [] and checker.duplicates == 0
        figures = await _figures(base)
        assert figures["messages_timed_out"] == 0 and figures["acks_unknown"] == 0, figures
        total = sum(produced.values())
        assert figures["messages_delivered"] == total and figures["messages_acked"] == total, figures
