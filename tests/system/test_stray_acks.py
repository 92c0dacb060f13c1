"""Acks for messages never delivered finish nothing: a client that never pulled two groups acks every
offset of their queues (Thrift ``submit``, results piggy-backed on a pull of another group, HTTP
``/v1/ack`` and HTTP pull results). The proxy counts them as unknown, and a full consume of both
groups afterwards still gets every message, each key in order, with committed = produced.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port

from ..support import OrderChecker, ProxyProcess, check_and_ack, produce_keyed
from .test_http_end_to_end import wait_ready

QUEUES = 4
MESSAGES = 2_000
GROUP_CONFIG = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 5000,
                "concurrency": 5000}
VICTIMS = ("victim1", "victim2")

produce = functools.partial(produce_keyed, keys=100)


async def metric(session: aiohttp.ClientSession, base: str, name: str, group: str, **labels: str) -> float:
    """The sum of ``name``'s samples for ``group`` (and ``labels``) on the proxy's /metrics."""
    async with session.get(base + "/metrics") as response:
        text = await response.text()
    wanted = {"group": group, **labels}
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items())
    )


def thrift_results(group: str, offsets: list[int]) -> list[wire.ConsumeResult]:
    return [
        wire.ConsumeResult(context=wire.Context(groupId=group, topic="t", qid=str(qid)), successOffsets=offsets,
                           failOffsets=[])
        for qid in range(QUEUES)
    ]


def http_results(offsets: list[int]) -> list[dict[str, Any]]:
    return [{"topic": "t", "qid": qid, "success": offsets, "fail": []} for qid in range(QUEUES)]


async def consume_thrift(port: int, group: str, checker: OrderChecker, produced: dict[str, int]) -> None:
    pending: list[wire.ConsumeResult] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    async with AsyncProxyClient("127.0.0.1", port) as client:
        while checker.missing(produced):
            assert loop.time() < deadline, f"{group} not drained: {list(checker.missing(produced).items())[:5]}"
            response = await client.pull(wire.PullRequest(
                groupId=group, topic="t", maxBatchSize=64, maxLingerTime=200, result=wire.link_results(pending)))
            pending = check_and_ack(response, checker)
        if pending:
            await client.submit(wire.link_results(pending))


async def consume_http(session: aiohttp.ClientSession, base: str, group: str, checker: OrderChecker,
                       produced: dict[str, int]) -> None:
    pending: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while checker.missing(produced):
        assert loop.time() < deadline, f"{group} not drained: {list(checker.missing(produced).items())[:5]}"
        request = {"group": group, "topic": "t", "max_batch": 64, "linger_ms": 200, "results": pending}
        async with session.post(base + "/v1/pull", json=request) as response:
            assert response.status == 200, await response.text()
            answer = await response.json()
        pending = []
        if answer["messages"]:
            for message in answer["messages"]:
                event = json.loads(message["value_text"])
                checker.delivered(event["k"], event["seq"])
                checker.acked(event["k"], event["seq"])
            ok = [m["offset"] for m in answer["messages"]]
            pending = [{"topic": answer["topic"], "qid": answer["qid"], "success": ok, "fail": []}]
    async with session.post(base + "/v1/ack", json={"group": group, "results": pending}) as response:
        assert response.status == 200, await response.text()


async def committed_equals_produced(session: aiohttp.ClientSession, base: str, group: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        async with session.get(f"{base}/admin/groups/{group}") as response:
            queues = (await response.json())["queues"]
        pairs = [(q["committed"], q["produced"]) for q in queues]
        if all(c == p for c, p in pairs) or loop.time() > deadline:
            assert all(c == p for c, p in pairs), (group, pairs)
            return
        await asyncio.sleep(0.1)


async def test_acks_for_undelivered_messages_are_counted_and_finish_nothing(redis_url: str, tmp_path: Path) -> None:
    http_port = free_port()
    groups = {name: {"t": GROUP_CONFIG} for name in (*VICTIMS, "own")}
    proxy = ProxyProcess(tmp_path, redis_url, groups, {"t": {"queues": QUEUES}},
                         http={"enabled": True, "host": "127.0.0.1", "port": http_port}).start()
    base = f"http://127.0.0.1:{http_port}"
    produced: dict[str, int] = {}
    try:
        await wait_ready(base)
        await asyncio.to_thread(produce, redis_url, MESSAGES, produced, random.Random(11))
        offsets = list(range(1, MESSAGES + 1))  # every offset any queue can hold, and more
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            # The victims' readers hold every message: each key's head ready, the rest behind it.
            unfinished = "ddmq_topic_unfinished_messages"
            while any([await metric(session, base, unfinished, g) < MESSAGES for g in VICTIMS]):
                assert loop.time() < deadline, "the victims' messages were not read"
                await asyncio.sleep(0.1)
            ready = {g: await metric(session, base, "ddmq_messages_ready", g) for g in VICTIMS}
            assert all(ready.values()), ready
            sent = {"victim1": 0, "victim2": 0}
            async with AsyncProxyClient("127.0.0.1", proxy.port) as attacker:
                await attacker.submit(wire.link_results(thrift_results("victim1", offsets)))
                sent["victim1"] += QUEUES * len(offsets)
                # Piggy-backed on a pull for the attacker's own group, naming the other victim.
                await attacker.pull(wire.PullRequest(groupId="own", topic="t", maxBatchSize=1, maxLingerTime=0,
                                                     result=wire.link_results(thrift_results("victim2", offsets))))
                sent["victim2"] += QUEUES * len(offsets)
            async with session.post(base + "/v1/ack", json={"group": "victim2", "results": http_results(offsets)}) as r:
                assert r.status == 200, await r.text()
            sent["victim2"] += QUEUES * len(offsets)
            pull_request = {"group": "own", "topic": "t", "max_batch": 1, "linger_ms": 0,
                            "results": [dict(r, group="victim1") for r in http_results(offsets)]}
            async with session.post(base + "/v1/pull", json=pull_request) as r:
                assert r.status == 200, await r.text()
            sent["victim1"] += QUEUES * len(offsets)

            for group in VICTIMS:
                assert await metric(session, base, "ddmq_acks_unknown_total", group) == sent[group]
                assert await metric(session, base, "ddmq_messages_acked_total", group) == 0
                assert await metric(session, base, "ddmq_messages_ready", group) == ready[group]
                assert await metric(session, base, unfinished, group) == MESSAGES

            # A full consume of both victims: nothing was erased, order holds, commits reach the end.
            thrift_checker, http_checker = OrderChecker(), OrderChecker()
            await consume_thrift(proxy.port, "victim1", thrift_checker, produced)
            await consume_http(session, base, "victim2", http_checker, produced)
            for checker in (thrift_checker, http_checker):
                assert not checker.missing(produced)
                assert checker.violations == [], checker.violations[:5]
                assert checker.deliveries == MESSAGES
            for group in VICTIMS:
                await committed_equals_produced(session, base, group)
                assert await metric(session, base, "ddmq_messages_acked_total", group) == MESSAGES
    finally:
        assert proxy.stop() == 0, proxy.log()
