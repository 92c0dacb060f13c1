"""The HTTP adapter against a real proxy (in this event loop), real Redis and real HTTP.

Every answer goes through :class:`tests.http_support.ApiClient`, which validates it against the
OpenAPI document.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.servers.http.guard import is_loopback as _is_loopback
from ddmq.proxy.service import ProxyService

from ...http_support import ApiClient, OpenApiChecker
from ..conftest import running_proxy

TOKEN = "s3cret-token-0123456789"


@asynccontextmanager
async def http_proxy(
    redis_url: str, topic_config: dict[str, Any] | None = None, http: dict[str, Any] | None = None, **kw: Any
) -> AsyncIterator[tuple[ProxyService, ApiClient]]:
    http_config = {"enabled": True, "port": 0, **(http or {})}
    async with running_proxy(redis_url, topic_config, http=http_config, **kw) as service:
        async with aiohttp.ClientSession() as session:
            yield service, ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 15) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def committed_everything(service: ProxyService) -> bool:
    (row,) = await service.api.consume_stats("g", "t")
    return row.consume_offsets == row.produce_offsets


async def pull(api: ApiClient, results: list[dict[str, Any]] | None = None, **request: Any) -> dict[str, Any]:
    status, body = await api.call(
        "POST", "/v1/pull", json={"group": "g", "topic": "t", "linger_ms": 2000, "results": results or [], **request}
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def test_pull_and_ack_round_trip_text_and_binary(redis_url: str) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i % 5}", "value": f"text-{i} ✓"} for i in range(40)])
            await producer.send("t", b"\xff\xfe\x00", key="bin", tag="raw", properties={"a": "b"})
        got: dict[tuple[int, int], dict[str, Any]] = {}
        results: list[dict[str, Any]] = []
        while len(got) < 41:
            body = await pull(api, results, max_batch=8)
            results = []
            if body["messages"]:
                assert len(body["messages"]) <= 8 and body["topic"] == "t"
                for message in body["messages"]:
                    got[body["qid"], message["offset"]] = message
                # qid as the string a Thrift client would send works the same
                results = [{"topic": "t", "qid": str(body["qid"]), "success": [m["offset"] for m in body["messages"]]}]
        status, answer = await api.call("POST", "/v1/ack", json={"group": "g", "results": results})
        assert (status, answer) == (200, {"ok": True})

        values = sorted(base64.b64decode(m["value_base64"]) for m in got.values())
        assert values == sorted([f"text-{i} ✓".encode() for i in range(40)] + [b"\xff\xfe\x00"])
        binary = next(m for m in got.values() if m["key"] == "bin")
        assert (binary["value_text"], binary["tag"], binary["properties"]) == (None, "raw", {"a": "b"})
        for message in got.values():
            if message["key"] != "bin":
                assert message["value_text"] == base64.b64decode(message["value_base64"]).decode()
                assert message["produce_ms"] > 0
        await eventually(lambda: committed_everything(service))
        empty = await pull(api, linger_ms=50)
        assert empty == {"group": "g", "topic": "t", "qid": None, "messages": []}


async def test_bad_input_gets_a_json_error_and_the_server_keeps_serving(redis_url: str) -> None:
    async with http_proxy(redis_url, http={"max_body_bytes": 4096}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t", "still delivered", key="k")
        cases: list[tuple[str, str, dict[str, Any]]] = [
            ("POST", "/v1/pull", {"data": b"{not json"}),
            ("POST", "/v1/pull", {"data": b""}),
            ("POST", "/v1/pull", {"data": b"[1, 2]"}),
            ("POST", "/v1/pull", {"data": b"x" * 10_000}),
            ("POST", "/v1/pull", {"json": {"group": "nope"}}),
            ("POST", "/v1/pull", {"json": {"group": "g", "topic": "nope"}}),
            ("POST", "/v1/pull", {"json": {"group": "g", "max_batch": -1}}),
            ("POST", "/v1/pull", {"json": {"group": "g", "linger_ms": "soon"}}),
            ("POST", "/v1/pull", {"json": {"group": "g", "surprise": 1}}),
            ("POST", "/v1/pull", {"json": {"group": "g", "results": [{"topic": "t", "qid": 0, "fail": [2**63]}]}}),
            ("POST", "/v1/pull", {"json": {"group": "g", "results": [{"topic": "t", "qid": 0, "success": ["1"]}]}}),
            ("POST", "/v1/ack", {"json": {"group": "nope", "results": []}}),
            ("POST", "/v1/ack", {"json": {"group": "g"}}),
            ("GET", "/admin/groups/nope", {}),
            ("GET", "/admin/groups/g/in-flight", {"params": {"limit": "many"}}),
            ("GET", "/admin/groups/g/blocked-keys", {"params": {"topic": "nope"}}),
            ("GET", "/admin/groups/g/topics/t/dead-letters", {"params": {"after": "not-an-id"}}),
            ("POST", "/admin/groups/g/topics/t/dead-letters/replay", {"json": {}}),
            ("POST", "/admin/groups/g/topics/t/dead-letters/purge", {"json": {"ids": ["1-0"], "all": True}}),
            ("POST", "/admin/groups/g/topics/t/dead-letters/replay", {"json": {"ids": ["bogus"]}}),
        ]
        expected = [
            400,
            400,
            400,
            413,
            404,
            404,
            400,
            400,
            400,
            400,
            400,
            404,
            400,
            404,
            400,
            404,
            400,
            400,
            400,
            400,
        ]
        codes = {400: 1003, 413: 1003, 404: None}
        for (method, path, kwargs), status in zip(cases, expected, strict=True):
            got_status, body = await api.call(method, path, **kwargs)
            assert got_status == status, (method, path, kwargs, body)
            assert body["message"] and body["retriable"] is False
            if codes[status] is not None:
                assert body["code"] == codes[status], body
        assert (await api.call("POST", "/v1/pull", json={"group": "nope"}))[1]["code"] == 1001
        assert (await api.call("POST", "/v1/pull", json={"group": "g", "topic": "nope"}))[1]["code"] == 1002

        # An unknown route and a wrong method are JSON errors too (checked by hand: not in the document).
        async with api.session.get(api.base + "/v2/pull") as response:
            assert response.status == 404 and (await response.json())["code"] == 1003
        async with api.session.get(api.base + "/v1/pull") as response:
            assert response.status == 405 and (await response.json())["code"] == 1003
            assert response.headers["Allow"] == "POST"

        # Nothing of the bad requests was applied, and the server still serves.
        body = await pull(api)
        assert [base64.b64decode(m["value_base64"]) for m in body["messages"]] == [b"still delivered"]
        stats = service.groups["g"].buffer.stats
        assert stats.acked == 0 and stats.failed == 0 and stats.delivered == 1


async def test_dead_letters_list_replay_and_purge(redis_url: str) -> None:
    config = {"order_key": "KEY", "max_retry": 0, "retry_intervals_ms": [10]}
    async with http_proxy(redis_url, config) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            sent = await producer.send_batch("t", [{"key": f"k{i}", "value": f"v{i}", "qid": 1} for i in range(3)])
        body = await pull(api, max_batch=10)
        assert len(body["messages"]) == 3
        offsets = [m["offset"] for m in body["messages"]]
        status, _ = await api.call(
            "POST", "/v1/ack", json={"group": "g", "results": [{"topic": "t", "qid": 1, "fail": offsets}]}
        )
        assert status == 200
        letters = "/admin/groups/g/topics/t/dead-letters"

        async def three_dead() -> bool:
            return (await api.call("GET", letters))[1]["total"] == 3

        await eventually(three_dead)
        status, page = await api.call("GET", letters, params={"limit": "2"})
        assert status == 200 and len(page["entries"]) == 2
        status, rest = await api.call("GET", letters, params={"after": page["next_after"]})
        entries = page["entries"] + rest["entries"]
        assert sorted(e["offset"] for e in entries) == sorted(r.offset for r in sent)
        assert {e["value_text"] for e in entries} == {"v0", "v1", "v2"}
        assert all(e["qid"] == 1 and e["attempts"] == 1 and e["error"] == "client reported failure" for e in entries)

        # Replay one: it is produced again into queue 1 (a new offset) and delivered again.
        first = next(e for e in entries if e["value_text"] == "v0")
        status, answer = await api.call("POST", letters + "/replay", json={"ids": [first["id"], "1-0", first["id"]]})
        assert (status, answer) == (200, {"replayed": 1, "missing": ["1-0"], "keys": 1, "lifted": 0, "refused": [],
                                          "refused_keys": 0})
        again = await pull(api)
        assert [(m["value_text"], m["key"]) for m in again["messages"]] == [("v0", "k0")]
        assert again["qid"] == 1 and again["messages"][0]["offset"] > max(offsets)
        await pull(api, [{"topic": "t", "qid": 1, "success": [again["messages"][0]["offset"]]}], linger_ms=0)

        # Purge the rest.
        status, answer = await api.call("POST", letters + "/purge", json={"all": True})
        assert (status, answer) == (200, {"purged": 2})
        status, page = await api.call("GET", letters)
        assert (page["total"], page["entries"], page["next_after"]) == (0, [], None)
        await eventually(lambda: committed_everything(service))


async def test_replay_all_moves_every_entry_back_once(redis_url: str) -> None:
    config = {"order_key": "NONE", "max_retry": 0, "retry_intervals_ms": [10]}
    async with http_proxy(redis_url, config) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"value": f"v{i}"} for i in range(30)])
        failed = 0
        while failed < 30:
            body = await pull(api, max_batch=64)
            offsets = [m["offset"] for m in body["messages"]]
            await api.call(
                "POST", "/v1/ack", json={"group": "g", "results": [{"topic": "t", "qid": body["qid"], "fail": offsets}]}
            )
            failed += len(offsets)
        letters = "/admin/groups/g/topics/t/dead-letters"

        async def all_dead() -> bool:
            return (await api.call("GET", letters))[1]["total"] == 30

        await eventually(all_dead)
        status, answer = await api.call("POST", letters + "/replay", json={"all": True})
        assert (status, answer) == (200, {"replayed": 30, "missing": [], "keys": 0, "lifted": 0, "refused": [],
                                          "refused_keys": 0})
        assert (await api.call("GET", letters))[1]["total"] == 0
        seen: list[str] = []
        while len(seen) < 30:
            body = await pull(api, max_batch=64)
            seen += [m["value_text"] for m in body["messages"]]
            await api.call(
                "POST",
                "/v1/ack",
                json={
                    "group": "g",
                    "results": [{"topic": "t", "qid": body["qid"], "success": [m["offset"] for m in body["messages"]]}],
                },
            )
        assert sorted(seen) == sorted(f"v{i}" for i in range(30))


async def test_admin_views_show_groups_owners_in_flight_and_blocked_keys(redis_url: str) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY", "timeout_ms": 60_000}) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch(
                "t",
                [
                    {"key": "a", "value": "a0"},
                    {"key": "a", "value": "a1"},
                    {"key": "b", "value": "b0"},
                    {"key": "a", "value": "a2"},
                ],
            )
        got: list[str] = []
        while len(got) < 2:  # only the heads of a and b may be delivered
            got += [m["value_text"] for m in (await pull(api, max_batch=10))["messages"]]
        assert sorted(got) == ["a0", "b0"]

        status, body = await api.call("GET", "/admin/groups")
        assert status == 200
        (group,) = body["groups"]
        (topic,) = group["topics"]
        assert (topic["topic"], topic["queues"], topic["held"]) == ("t", 4, [0, 1, 2, 3])
        assert (topic["in_flight"], topic["unfinished"], topic["order_keys"]) == (2, 4, 2)

        status, detail = await api.call("GET", "/admin/groups/g")
        assert status == 200 and "test-proxy" in detail["members"]
        assert [q["owner"] for q in detail["queues"]] == ["test-proxy"] * 4
        assert sum(q["produced"] - 1 for q in detail["queues"]) == 4

        status, flying = await api.call("GET", "/admin/groups/g/in-flight", params={"topic": "t"})
        assert status == 200 and flying["total"] == 2
        assert sorted((j["key"], j["attempts"], j["state"]) for j in flying["jobs"]) == [
            ("a", 1, "in_flight"),
            ("b", 1, "in_flight"),
        ]

        status, blocked = await api.call("GET", "/admin/groups/g/blocked-keys", params={"limit": "1"})
        assert status == 200 and (blocked["total"], blocked["offset"]) == (2, 0)
        (key,) = blocked["keys"]
        assert (key["order_key"], key["chain_length"], key["head"]["state"]) == ("a", 3, "in_flight")
        assert key["head"]["attempts"] == 1 and key["head_age_ms"] >= 0
        status, second = await api.call("GET", "/admin/groups/g/blocked-keys", params={"limit": "1", "offset": "1"})
        assert status == 200 and [k["order_key"] for k in second["keys"]] == ["b"] and second["total"] == 2
        status, past = await api.call("GET", "/admin/groups/g/blocked-keys", params={"offset": "2"})
        assert status == 200 and (past["keys"], past["total"]) == ([], 2)
        status, error = await api.call("GET", "/admin/groups/g/blocked-keys", params={"offset": "-1"})
        assert (status, error["code"]) == (400, 1003)
        # The state filter: both heads are delivered and unanswered, none has failed yet.
        assert key["state"] == "in_flight"  # its last_error (the body is not JSON) is no failure
        status, flying = await api.call("GET", "/admin/groups/g/blocked-keys", params={"state": "in_flight,waiting"})
        assert status == 200 and flying["total"] == 2 and {k["state"] for k in flying["keys"]} == {"in_flight"}
        status, failing = await api.call("GET", "/admin/groups/g/blocked-keys", params={"state": "failing"})
        assert status == 200 and (failing["total"], failing["keys"]) == (0, [])
        status, error = await api.call("GET", "/admin/groups/g/blocked-keys", params={"state": "stuck"})
        assert (status, error["code"]) == (400, 1003) and "failing, in_flight, waiting" in error["message"]


async def test_group_detail_has_time_lag_job_counts_and_the_member_ttl(redis_url: str) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY", "timeout_ms": 60_000}, queues=2) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i}", "value": f"v{i}", "qid": 0} for i in range(3)])
        produced_at = int(time.time() * 1000)
        held = await pull(api, max_batch=1)
        assert len(held["messages"]) == 1
        await asyncio.sleep(0.2)
        status, detail = await api.call("GET", "/admin/groups/g")
        assert status == 200 and detail["member_ttl_ms"] == service.config.leases.ttl_ms
        first, second = detail["queues"]
        assert (first["qid"], first["lag"], first["in_flight"], first["ready"], first["retry_wait"]) == (0, 3, 1, 2, 0)
        assert first["oldest_unfinished_ms"] == held["messages"][0]["produce_ms"] <= produced_at
        assert 200 <= first["lag_ms"] <= int(time.time() * 1000) - first["oldest_unfinished_ms"]
        assert (second["lag"], second["lag_ms"], second["oldest_unfinished_ms"], second["in_flight"]) == (0, 0, None, 0)


async def test_admin_token_guards_admin_endpoints_only(redis_url: str) -> None:
    async with http_proxy(redis_url, http={"admin_token": TOKEN}) as (_, api):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            status, body = await api.call("GET", "/admin/groups", headers=headers)
            assert (status, body["code"]) == (401, 1007)
        status, body = await api.call("GET", "/admin/groups", headers={"Authorization": f"Bearer {TOKEN}"})
        assert status == 200 and body["groups"][0]["group"] == "g"
        for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/console", "/console/console.css"):
            assert (await api.call("GET", path))[0] == 200
        assert (await pull(api, linger_ms=0))["messages"] == []


async def test_the_console_files_carry_a_policy_that_runs_only_their_own_script(redis_url: str) -> None:
    async with http_proxy(redis_url) as (_, api):
        for path in ("/", "/console", "/console/console.js", "/console/console.css"):
            async with api.session.get(api.base + path) as response:
                assert response.status == 200
                policy = response.headers["Content-Security-Policy"]
                assert "script-src 'self'" in policy and "default-src 'none'" in policy
                assert response.headers["X-Content-Type-Options"] == "nosniff"
        for path in ("/console/index.html", "/console/nope.js", "/console/..%2Fopenapi.yaml"):
            status, body = await api.call("GET", path)
            assert (status, body["code"]) == (404, 1003), path


async def test_changing_admin_calls_from_another_origin_are_refused(redis_url: str) -> None:
    async with http_proxy(redis_url) as (_, api):
        purge = "/admin/groups/g/topics/t/dead-letters/purge"
        status, body = await api.call("POST", purge, json={"all": True}, headers={"Origin": "http://evil.example"})
        assert (status, body["code"]) == (403, 1008)
        same = api.base.removeprefix("http://")
        status, body = await api.call("POST", purge, json={"all": True}, headers={"Origin": f"http://{same}"})
        assert (status, body) == (200, {"purged": 0})
        assert (await api.call("POST", purge, json={"all": True}))[0] == 200  # curl sends no Origin
        # A read too: the browser would keep the answer from the page, but the proxy would still build it.
        status, body = await api.call("GET", "/admin/groups", headers={"Origin": "http://evil.example"})
        assert (status, body["code"]) == (403, 1008)


def _non_loopback_address() -> str | None:
    """An address of this machine that is not loopback (there is one wherever a network is up)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if _is_loopback(address) else address


async def test_without_a_token_admin_answers_loopback_peers_only(redis_url: str) -> None:
    address = _non_loopback_address()
    assert _is_loopback("127.0.0.1") and _is_loopback("::1") and _is_loopback("::ffff:127.0.0.1")
    assert not any(map(_is_loopback, ("192.0.2.2", "::ffff:192.0.2.2", "fd00::2", "", None)))
    if address is None:  # a host without a network: the decision itself is checked above
        return
    async with http_proxy(redis_url, http={"host": "0.0.0.0"}) as (service, api):
        assert (await api.call("GET", "/admin/groups"))[0] == 200  # over 127.0.0.1
        remote = ApiClient(api.session, f"http://{address}:{service.http_port}", api.checker)
        status, body = await remote.call("GET", "/admin/groups")
        assert (status, body["code"]) == (403, 1008)
        for path in ("/", "/console", "/console/console.js"):
            status, body = await remote.call("GET", path)
            assert (status, body["code"]) == (403, 1008), path
            assert (await api.call("GET", path))[0] == 200
        assert (await remote.call("GET", "/healthz"))[0] == 200
        assert (await remote.call("POST", "/v1/pull", json={"group": "g", "linger_ms": 0}))[0] == 200


@pytest.mark.both_loops
async def test_readyz_turns_503_when_shutdown_begins_and_healthz_stays_200(redis_url: str) -> None:
    async with http_proxy(redis_url, {"timeout_ms": 60_000}, shutdown_grace_ms=10_000) as (service, api):
        status, body = await api.call("GET", "/readyz")
        assert (status, body) == (200, {"status": "ready", "checks": {"running": True, "redis": True}})
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t", "held", key="k")
        held = await pull(api)
        assert len(held["messages"]) == 1
        # An unacked message keeps the shutdown in its grace period, with the HTTP server still up.
        closing = asyncio.create_task(service.close())
        await asyncio.sleep(0.1)
        status, body = await api.call("GET", "/readyz")
        assert (status, body["status"], body["checks"]["running"]) == (503, "not ready", False)
        assert (await api.call("GET", "/healthz"))[0] == 200
        assert (await pull(api))["messages"] == []  # pulls answer at once, empty
        assert not closing.done()
        status, _ = await api.call(
            "POST",
            "/v1/ack",
            json={
                "group": "g",
                "results": [{"topic": "t", "qid": held["qid"], "success": [held["messages"][0]["offset"]]}],
            },
        )
        assert status == 200
        await asyncio.wait_for(closing, 15)  # the ack ended the grace period
        assert service.groups["g"].buffer.stats.acked == 1


async def test_a_client_hanging_up_during_a_long_poll_takes_no_messages_with_it(redis_url: str) -> None:
    async with http_proxy(redis_url, {"timeout_ms": 60_000}) as (service, api):
        request = {"group": "g", "topic": "t", "linger_ms": 20_000}
        with pytest.raises(TimeoutError):
            await api.session.post(api.base + "/v1/pull", json=request, timeout=aiohttp.ClientTimeout(total=0.3))

        async def nothing_parked() -> bool:
            return service.groups["g"].buffer.parked == 0

        await eventually(nothing_parked)
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t", "for the next client", key="k")
        body = await pull(api)
        assert [m["value_text"] for m in body["messages"]] == ["for the next client"]
        assert service.groups["g"].buffer.stats.delivered == 1


async def test_pull_with_max_per_key_answers_ordered_runs(redis_url: str) -> None:
    async with http_proxy(redis_url, {"order_key": "QID"}, queues=1) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": "k", "value": f"m{i}"} for i in range(10)])
        await eventually(lambda: _ready(service, 1))
        plain = await pull(api, max_batch=8)
        assert len(plain["messages"]) == 1 and "runs" not in plain
        offsets = [m["offset"] for m in plain["messages"]]
        body = await pull(api, [{"topic": "t", "qid": 0, "success": offsets}], max_batch=8, max_per_key=8)
        assert body["runs"] == [8] and [m["value_text"] for m in body["messages"]] == [f"m{i}" for i in range(1, 9)]
        status, answer = await api.call("POST", "/v1/pull", json={"group": "g", "max_per_key": -1})
        assert status == 400, answer


async def _ready(service: ProxyService, count: int) -> bool:
    return service.groups["g"].buffer.ready >= count
