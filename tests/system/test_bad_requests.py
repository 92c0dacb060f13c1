"""Every bad input of the HTTP tests, sent over Thrift too: the same code on both wires, or the same
entries left out and counted, and nothing lost.

Each case is written once, in wire-neutral terms (HTTP's field names; a result node as a dict), and
sent as a Thrift call and as an HTTP body to a real proxy. Every case carries the good acks of a
batch it pulled: a case answered with a code applies none of them (the request is refused whole,
then the acks alone are taken; a pull for an unknown topic applies its results first, as documented),
a case that is answered applies them all and counts its bad entries in ``invalid_results``. Then
every produced message is consumed and committed, each key in order.

Inputs only one wire can carry (HTTP's JSON syntax, unknown fields and wrong JSON types; Thrift's
malformed frames) are in tests/proxy/servers/test_http_api.py and tests/system/test_bad_input.py.
"""

from __future__ import annotations

import base64
from typing import Any, NamedTuple

import aiohttp
import pytest
from thriftpy2.thrift import TType

from ddmq.client.thrift_client import AsyncProxyClient, PullError
from ddmq.protocol import wire
from ddmq.protocol.wire import writer as thrift_writer

from ..http_support import ApiClient, OpenApiChecker
from ..support import OrderChecker
from .test_adapters import ADAPTERS, GUARD_S, Msg, Refused, Reply, consume_all, produce, proxy, record

NODE_KEYS = {"group", "topic", "qid", "success", "fail", "release", "extend", "fail_details"}


class Case(NamedTuple):
    id: str
    via: str  # "pull" or "ack" (Thrift's submit)
    request: dict[str, Any]  # the request's own fields, by their HTTP names
    bad: list[dict[str, Any]]  # result nodes sent beside the good acks; fail_details as (offset, retry)
    code: int | None  # the answer's code; None: answered, the bad entries left out
    left_out: int = 0  # entries counted in invalid_results
    applied: bool = False  # refused after its results were applied (a pull checks its topic after them)


CASES = [
    Case("pull-unknown-group", "pull", {"group": "nope"}, [], 1001),
    Case("pull-unknown-topic", "pull", {"topic": "nope"}, [], 1002, applied=True),
    Case("pull-negative-batch", "pull", {"max_batch": -1}, [], 1003),
    Case("pull-negative-linger", "pull", {"linger_ms": -1}, [], 1003),
    Case("pull-negative-per-key", "pull", {"max_per_key": -1}, [], 1003),
    Case("pull-group-too-long", "pull", {"group": "g" * 201}, [], 1003),
    Case("pull-topic-too-long", "pull", {"topic": "t" * 201}, [], 1003),
    Case("pull-offset-past-i64", "pull", {}, [{"topic": "t", "qid": 0, "fail": [2**63]}], 1003),
    Case("ack-unknown-group", "ack", {"group": "nope"}, [], 1001),
    Case("ack-group-too-long", "ack", {"group": "g" * 201}, [], 1003),
    *(
        Case(f"{via}-{name}", via, {}, nodes, None, left_out)
        for via in ("pull", "ack")
        for name, nodes, left_out in [
            ("offset-0", [{"topic": "t", "qid": 0, "success": [0]}], 1),
            ("offset-negative", [{"topic": "t", "qid": 0, "success": [-3], "fail": [-1]}], 2),
            ("release-and-extend-0", [{"topic": "t", "qid": 0, "release": [0], "extend": [-2]}], 2),
            ("qid-not-a-number", [{"topic": "t", "qid": "x", "success": [1]}], 1),
            ("qid-negative", [{"topic": "t", "qid": -1, "success": [1]}], 1),
            ("qid-past-the-queues", [{"topic": "t", "qid": 65534, "success": [1]}], 1),
            ("no-context", [{"success": [1], "fail": [2]}], 2),
            ("empty-topic", [{"topic": "", "qid": 0, "success": [1]}], 1),
            ("fail-detail-offset-0", [{"topic": "t", "qid": 0, "fail_details": [(0, None)]}], 1),
            ("fail-detail-negative-retry", [{"topic": "t", "qid": 0, "fail_details": [(10**6, -5)]}], 1),
        ]
    ),
]


def json_node(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k != "fail_details"}
    if "fail_details" in node:
        out["fail_details"] = [
            {"offset": o, **({"retry_after_ms": r} if r is not None else {})} for o, r in node["fail_details"]
        ]
    return out


def thrift_node(node: dict[str, Any], group: str) -> wire.ConsumeResult:
    context = None
    if "topic" in node or "qid" in node:
        context = wire.Context(node.get("group", group), node.get("topic", ""), str(node.get("qid", "")))
    return wire.ConsumeResult(
        context=context,
        successOffsets=node.get("success"),
        failOffsets=node.get("fail"),
        releaseOffsets=node.get("release"),
        extendOffsets=node.get("extend"),
        failDetails=[wire.FailDetail(offset=o, retryAfterMs=r) for o, r in node.get("fail_details", [])] or None,
    )


async def send_thrift(port: int, case: Case, nodes: list[dict[str, Any]]) -> Reply:
    """Send ``case`` with ``nodes``; a pull's answer (its messages are the caller's to ack)."""
    request = {"group": "g", "topic": "t", "linger_ms": 0, **case.request}
    group = request["group"]
    results = wire.link_results([thrift_node(n, group) for n in nodes])
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=GUARD_S) as client:
        try:
            if case.via == "pull":
                response = await client.pull(wire.PullRequest(
                    groupId=group, topic=request["topic"], maxBatchSize=request.get("max_batch"),
                    maxLingerTime=request["linger_ms"], maxPerKey=request.get("max_per_key"), result=results))
                qid = int(response.context.qid) if response.context.qid else None
                return Reply(qid, [Msg(m.offset, m.key, m.value) for m in response.messages], None)
            assert await client.submit(results) is True
        except PullError as exc:
            raise Refused(exc.code) from exc
    return Reply(None, [], None)


async def send_http(port: int, case: Case, nodes: list[dict[str, Any]]) -> Reply:
    if case.via == "pull":
        path, body = "/v1/pull", {"group": "g", "topic": "t", "linger_ms": 0, **case.request}
    else:
        path, body = "/v1/ack", {"group": "g", **case.request}
    body["results"] = [json_node(n) for n in nodes]
    async with aiohttp.ClientSession() as session:
        status, answer = await ApiClient(session, f"http://127.0.0.1:{port}", OpenApiChecker()).call(
            "POST", path, json=body)
    if status != 200:
        assert answer["message"] and answer["retriable"] is False
        raise Refused(answer["code"])
    if case.via == "ack":
        return Reply(None, [], None)
    messages = [Msg(m["offset"], m["key"], base64.b64decode(m["value_base64"])) for m in answer["messages"]]
    return Reply(answer["qid"], messages, None)


async def first_batch(client: Any) -> Reply:
    reply = Reply(None, [], None)
    while not reply.messages:
        reply = await client.pull(max_batch=8, linger_ms=200)
    return reply


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_a_bad_input_gets_the_same_answer_on_both_wires_and_costs_no_good_ack(
    adapter: str, case: Case, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hostile Thrift client: our writer refuses an i64 past its type, so this test's is told not to.
    monkeypatch.setitem(thrift_writer._INT_LIMITS, TType.I64, 1 << 70)
    async with proxy(adapter, redis_url, {"order_key": "KEY"}) as (service, client):
        produced = produce(redis_url, 30, keys=3)
        checker = OrderChecker()
        reply = await first_batch(client)
        good = [{"topic": "t", "qid": r.qid, "success": r.success} for r in record(reply, checker)]
        buffer = service.groups["g"].buffer
        acked, left_out = buffer.stats.acked, service.counters["invalid_results"]
        send = send_thrift if adapter == "thrift" else send_http
        port = service.thrift_port if adapter == "thrift" else service.http_port
        assert port is not None
        if case.code is not None:
            with pytest.raises(Refused) as refused:
                await send(port, case, [*good, *case.bad])
            assert refused.value.code == case.code
            if not case.applied:
                assert buffer.stats.acked == acked, "a refused request applies nothing"
                await client.ack(record(reply, OrderChecker()))  # the good acks alone are taken
        else:
            answer = await send(port, case, [*case.bad, *good])
            assert service.counters["invalid_results"] - left_out == case.left_out
            assert buffer.stats.acked == acked + len(reply.messages), "the good acks count"
            await client.ack(record(answer, checker))
        assert buffer.stats.acked >= acked + len(reply.messages), "the good acks count"
        await consume_all(service, client, produced, checker)
        assert buffer.stats.failed == 0


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_submit_naming_no_group_is_refused_and_no_results_is_nothing(adapter: str, redis_url: str) -> None:
    """A Thrift submit whose results name no group could apply nothing: 1003, as HTTP's body without
    ``group``. One without results is answered as an HTTP ack of no results."""
    async with proxy(adapter, redis_url) as (service, _):
        port = service.thrift_port if adapter == "thrift" else service.http_port
        assert port is not None
        if adapter == "thrift":
            async with AsyncProxyClient("127.0.0.1", port, timeout_s=GUARD_S) as raw:
                with pytest.raises(PullError) as refused:
                    await raw.submit(wire.ConsumeResult(context=wire.Context(None, "t", "0"), successOffsets=[1]))
                assert refused.value.code == 1003
                assert await raw.submit(None) is True
        else:
            async with aiohttp.ClientSession() as session:
                api = ApiClient(session, f"http://127.0.0.1:{port}", OpenApiChecker())
                status, body = await api.call("POST", "/v1/ack", json={"results": []})
                assert (status, body["code"]) == (400, 1003)
                assert await api.call("POST", "/v1/ack", json={"group": "g", "results": []}) == (200, {"ok": True})


async def test_whole_number_floats_are_integers_over_http(redis_url: str) -> None:
    """JSON Schema's integer admits 1500.0, and JavaScript clients send such: taken as 1500; a
    fraction is still a 400."""
    async with proxy("http", redis_url, {"order_key": "KEY"}) as (service, client):
        produced = produce(redis_url, 12, keys=2)
        checker = OrderChecker()
        reply = await first_batch(client)
        good = [{"topic": "t", "qid": float(r.qid), "success": [float(o) for o in r.success]}
                for r in record(reply, checker)]
        async with aiohttp.ClientSession() as session:
            api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
            status, body = await api.call("POST", "/v1/pull", json={"group": "g", "linger_ms": 1.5})
            assert (status, body["code"]) == (400, 1003)
            status, body = await api.call(
                "POST", "/v1/pull", json={"group": "g", "max_batch": 8.0, "linger_ms": 0.0, "results": good})
            assert status == 200, body
        assert service.groups["g"].buffer.stats.acked == len(reply.messages)
        messages = [Msg(m["offset"], m["key"], base64.b64decode(m["value_base64"])) for m in body["messages"]]
        await client.ack(record(Reply(body["qid"], messages, None), checker))
        await consume_all(service, client, produced, checker)
