"""``GET /admin/groups/{g}/topics/{t}/keys/explain`` on a real proxy (in this test's loop) over a real
Redis, pulled over real HTTP: a parked, a failing and an in-flight key explained (state, head, attempts,
the client holding it and its deadline, the reason, what comes next, the command), bad input refused;
then every message is delivered, in order per key."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.service import ProxyService

from ...http_support import ApiClient, OpenApiChecker
from ..conftest import running_proxy

GROUP_CONFIG = {"order_key": "KEY", "max_retry": 1, "retry_intervals_ms": [50], "on_exhausted": "park",
                "timeout_ms": 60_000}
KEYS = ("p", "f", "i")
EXPLAIN = "/admin/groups/g/topics/t/keys/explain"
AGENT = "explain-test/1.0"


@asynccontextmanager
async def http_proxy(redis_url: str) -> AsyncIterator[tuple[ProxyService, ApiClient]]:
    async with running_proxy(redis_url, GROUP_CONFIG, queues=1, http={"enabled": True, "port": 0}) as service:
        async with aiohttp.ClientSession(headers={"User-Agent": AGENT}) as session:
            yield service, ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())


async def pull(api: ApiClient, results: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    status, body = await api.call(
        "POST", "/v1/pull", json={"group": "g", "topic": "t", "linger_ms": 2000, "results": results or []}
    )
    assert status == 200, body
    messages: list[dict[str, Any]] = body["messages"]
    return messages


async def pull_until(api: ApiClient, wanted: set[str], results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pull until a message of each key in ``wanted`` came (retries are due within 50 ms)."""
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 20
    while not wanted <= set(got):
        assert time.monotonic() < deadline, f"deliveries of {wanted - set(got)} within 20 s"
        for message in await pull(api, results):
            got[message["key"]] = message
        results = []
    return got


async def explain(api: ApiClient, key: str) -> dict[str, Any]:
    status, body = await api.call("GET", EXPLAIN, params={"key": key})
    assert status == 200, body
    assert (body["group"], body["topic"], body["key"]) == ("g", "t", key)
    (entry,) = body["queues"]
    assert isinstance(entry, dict)
    return entry


def fail(message: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"topic": "t", "qid": 0, "fail_details": [{"offset": message["offset"], "reason": reason}]}


async def test_a_parked_a_failing_and_an_in_flight_key_explained(redis_url: str) -> None:
    async with http_proxy(redis_url) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": k, "value": f"{k}{n}", "qid": 0} for n in range(3) for k in KEYS])
        first = await pull_until(api, set(KEYS), [])
        assert {k: m["value_text"] for k, m in first.items()} == {"p": "p0", "f": "f0", "i": "i0"}

        # p and f fail once (retried after 50 ms), come again; p fails for good (max_retry 1: parks).
        second = await pull_until(api, {"p", "f"}, [fail(first["p"], "card declined"), fail(first["f"], "no driver")])
        assert {k: m["value_text"] for k, m in second.items()} == {"p": "p0", "f": "f0"}
        await pull(api, [fail(second["p"], "card declined again")])

        parked = await explain(api, "p")
        assert (parked["state"], parked["head_offset"], parked["attempts"]) == ("parked", first["p"]["offset"], 2)
        assert parked["reason"] == "card declined again" and parked["parked_by"] == "proxy"
        assert parked["since_ms"] is not None and parked["client"] is None
        assert "until an operator acts" in parked["next"]
        assert parked["command"] == "ddmq keys retry|skip|resume --group g --topic t --key p"
        assert parked["waiting"] == 2 and parked["read_by"] == "this proxy"

        failing = await explain(api, "f")
        assert (failing["state"], failing["head_offset"], failing["attempts"]) == ("failing", first["f"]["offset"], 2)
        assert failing["reason"] == "no driver" and failing["max_attempts"] == 2
        assert failing["client"] is not None and failing["client"]["client_id"] == AGENT
        assert "the key parks on it" in failing["next"], failing["next"]

        in_flight = await explain(api, "i")
        assert (in_flight["state"], in_flight["head_offset"], in_flight["attempts"]) == ("in_flight",
                                                                                          first["i"]["offset"], 1)
        client = in_flight["client"]
        assert client["protocol"] == "http" and client["peer"].startswith("127.0.0.1:") and client["client_id"] == AGENT
        assert in_flight["deadline_ms"] > int(time.time() * 1000)
        assert f"waiting for the ack of offset {first['i']['offset']} from http client {client['peer']}" in \
            in_flight["next"]
        assert "retried 50 ms after it (attempt 2 of 2)" in in_flight["next"], in_flight["next"]

        idle = await explain(api, "nobody")
        assert idle["state"] == "idle" and idle["head_offset"] is None

        # Bad input: a clear error, nothing changed.
        for params in ({}, {"key": ""}, {"key": "x" * 5000}, {"key": "p", "qid": "-1"}, {"key": "p", "qid": "zero"}):
            status, body = await api.call("GET", EXPLAIN, params=params)
            assert status == 400, (params, body)
        # A qid within any topic's bound but past this topic's queues: no such queue, as for a key action.
        status, body = await api.call("GET", EXPLAIN, params={"key": "p", "qid": "1"})
        assert status == 404 and body["code"] == 1003, body
        assert (await explain(api, "p"))["state"] == "parked"

        # Everything goes on, in order per key, nothing lost: p retried, then all acked.
        status, _ = await api.call("POST", "/admin/groups/g/topics/t/keys/retry", json={"key": "p"})
        assert status == 200
        seen: dict[str, list[str]] = {k: [] for k in KEYS}
        seen["f"].append("f0")  # in flight at its second attempt: acked with the first pull below
        seen["i"].append("i0")
        results = [{"topic": "t", "qid": 0, "success": [second["f"]["offset"], first["i"]["offset"]]}]
        deadline = time.monotonic() + 30
        while sum(map(len, seen.values())) < 9:
            assert time.monotonic() < deadline, seen
            messages = await pull(api, results)
            for message in messages:
                seen[message["key"]].append(message["value_text"])
            results = [{"topic": "t", "qid": 0, "success": [m["offset"] for m in messages]}] if messages else []
        await pull(api, results)
        assert seen == {k: [f"{k}{n}" for n in range(3)] for k in KEYS}
        assert (await explain(api, "i"))["state"] == "idle"
