"""The OpenAPI document is valid, documents exactly the routes the app serves, and real answers of
every operation validate against it."""

from __future__ import annotations

import json

import aiohttp
from openapi_spec_validator import validate

from ddmq.config import parse
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.servers.http import build_app, load_openapi
from ddmq.proxy.servers.http.view import ProxyView
from ddmq.proxy.service import ProxyService

from ...http_support import ApiClient, OpenApiChecker
from ..conftest import running_proxy


def test_the_document_is_valid_openapi() -> None:
    validate(load_openapi())


def test_every_route_is_documented_and_every_documented_operation_is_served() -> None:
    config = parse({"redis": "redis://127.0.0.1:1", "http": {"enabled": True}})
    service = ProxyService(config)
    view = ProxyView(service.registry, service.api, service.metrics, service.clients, lambda: service.running)
    app = build_app(view, config.http)
    served = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    documented = {
        (path, method)
        for path, item in load_openapi()["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert served == documented


async def test_real_answers_of_every_operation_validate(redis_url: str) -> None:
    config = {"order_key": "KEY", "max_retry": 0, "retry_intervals_ms": [10]}
    checker = OpenApiChecker()
    async with running_proxy(redis_url, config, http={"enabled": True, "port": 0}) as service:
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch(
                "t",
                [
                    {"key": "a", "value": "text", "qid": 0, "tag": "x", "properties": {"p": "1"}},
                    {"key": "a", "value": b"\x00\xff", "qid": 0},
                ],
            )
        async with aiohttp.ClientSession() as session:
            api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", checker)
            status, batch = await api.call("POST", "/v1/pull", json={"group": "g", "topic": "t", "linger_ms": 5000})
            assert status == 200 and len(batch["messages"]) == 1  # key a: one at a time
            for path in (
                "/admin/groups",
                "/admin/groups/g",
                "/admin/groups/g/in-flight",
                "/admin/groups/g/blocked-keys",
                "/admin/groups/g/clients",
            ):
                assert (await api.call("GET", path))[0] == 200
            fail = [{"topic": "t", "qid": batch["qid"], "fail": [batch["messages"][0]["offset"]]}]
            status, second = await api.call(
                "POST",
                "/v1/pull",
                json={
                    "group": "g",
                    "topic": "t",
                    "linger_ms": 5000,
                    "results": fail,
                },
            )
            assert status == 200 and second["messages"][0]["value_text"] is None
            status, keys = await api.call("GET", "/admin/groups/g/topics/t/keys")
            assert status == 200 and keys["keys"][0]["key"] == "a" and keys["counts"]["in_flight"] == 1
            status, acted = await api.call("POST", "/admin/groups/g/topics/t/keys/retry", json={"key": "a"})
            assert status == 200 and acted["applied"] == [{"qid": 0, "state": "in_flight"}]
            assert (
                await api.call(
                    "POST",
                    "/v1/ack",
                    json={
                        "group": "g",
                        "results": [{"topic": "t", "qid": second["qid"], "success": [second["messages"][0]["offset"]]}],
                    },
                )
            )[0] == 200
            letters = "/admin/groups/g/topics/t/dead-letters"
            status, page = await api.call("GET", letters)
            assert status == 200 and page["total"] == 1 and page["entries"][0]["tag"] == "x"
            status, entry = await api.call("GET", f"{letters}/{page['entries'][0]['id']}")
            assert status == 200 and entry["id"] == page["entries"][0]["id"] and not entry["value_truncated"]
            assert (await api.call("POST", letters + "/replay", json={"ids": [page["entries"][0]["id"]]}))[0] == 200
            assert (await api.call("POST", letters + "/purge", json={"all": True}))[0] == 200
            paused = await api.call("POST", "/admin/groups/g/pause", json={"for_ms": 60_000, "by": "test"})
            assert paused[0] == 200 and paused[1]["paused"][0]["by"] == "test"
            assert (await api.call("GET", "/admin/groups/g/pause"))[0] == 200
            assert (await api.call("POST", "/admin/groups/g/resume", json={}))[1]["paused"] == []
            for path in ("/healthz", "/readyz", "/metrics", "/", "/console", "/console/console.js",
                         "/console/console.css", "/admin/groups/g/lag-history"):
                assert (await api.call("GET", path))[0] == 200
            status, document = await api.call("GET", "/openapi.json")
            assert status == 200 and document == json.loads(json.dumps(load_openapi()))
            assert (await api.call("POST", "/v1/pull", json={"group": "nope"}))[0] == 404

    documented_success = {
        (path, method, int(status))
        for path, item in checker.document["paths"].items()
        for method, operation in item.items()
        for status in operation["responses"]
        if status.startswith("2")
    }
    assert documented_success <= checker.seen, documented_success - checker.seen
