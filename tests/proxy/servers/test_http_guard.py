"""Who may call what over HTTP (``ddmq.proxy.servers.http.guard``), against a real proxy and real HTTP:
other sites' pages (``Origin``), bodies a page can send without asking (``text/plain``), rebound host
names (``Host``), the data token, CORS for allowed origins, and the start-up warning for exposed binds.
The same attacks from a real browser are in ``tests/system/test_browser_attacks.py``."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ddmq.protocol.produce.producer import AsyncProducer

from .test_http_api import TOKEN, http_proxy, pull

LETTERS = "/admin/groups/g/topics/t/dead-letters"
DATA_TOKEN = "data-token-0123456789"


async def test_pages_of_other_origins_can_neither_pull_nor_ack(redis_url: str) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i}", "value": f"v{i}"} for i in range(8)])
        body = await pull(api, max_batch=8)
        offsets = [m["offset"] for m in body["messages"]]
        acks = [{"topic": "t", "qid": body["qid"], "success": offsets}]
        for origin in ("http://127.0.0.1:1", "null", api.base, "http://evil.example"):
            for path, request in (
                ("/v1/pull", {"group": "g", "linger_ms": 0, "results": acks}),
                ("/v1/ack", {"group": "g", "results": acks}),
            ):
                status, error = await api.call("POST", path, json=request, headers={"Origin": origin})
                assert (status, error["code"]) == (403, 1008), (origin, path)
        # The bodies a page may send without a preflight: text/plain, forms.
        raw = b'{"group": "g", "results": []}'
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            status, error = await api.call("POST", "/v1/ack", data=raw, headers={"Content-Type": content_type})
            assert (status, error["code"]) == (415, 1003), content_type
        assert service.groups["g"].buffer.stats.acked == 0
        # application/json with a charset is JSON.
        json_utf8 = {"Content-Type": "application/json; charset=utf-8"}
        status, _ = await api.call("POST", "/v1/ack", data=b'{"group": "g", "results": []}', headers=json_utf8)
        assert status == 200


async def test_allowed_origins_get_cors_headers_and_a_preflight(redis_url: str) -> None:
    allowed = "https://ops.example.com"
    async with http_proxy(redis_url, http={"allowed_origins": [allowed]}) as (_, api):
        async with api.session.options(
            api.base + "/v1/pull",
            headers={"Origin": allowed, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "content-type, authorization"},
        ) as response:
            assert response.status == 204
            assert response.headers["Access-Control-Allow-Origin"] == allowed
            assert "POST" in response.headers["Access-Control-Allow-Methods"]
            assert "Content-Type" in response.headers["Access-Control-Allow-Headers"]
        async with api.session.options(
            api.base + "/v1/pull", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
        ) as response:
            assert response.status == 403 and "Access-Control-Allow-Origin" not in response.headers
        async with api.session.post(
            api.base + "/v1/pull", json={"group": "g", "linger_ms": 0}, headers={"Origin": allowed}
        ) as response:
            assert response.status == 200 and response.headers["Access-Control-Allow-Origin"] == allowed
        async with api.session.post(api.base + "/v1/pull", json={"group": "g", "linger_ms": 0}) as response:
            assert response.status == 200 and "Access-Control-Allow-Origin" not in response.headers
        # An error answer to an allowed origin carries the headers too, so its page can read why.
        async with api.session.post(
            api.base + "/v1/pull", json={"group": "nope"}, headers={"Origin": allowed}
        ) as response:
            assert response.status == 404 and response.headers["Access-Control-Allow-Origin"] == allowed
            assert (await response.json())["code"] == 1001
        # The console's own page (same origin, loopback Host) needs no entry.
        status, _ = await api.call("GET", "/admin/groups", headers={"Origin": api.base})
        assert status == 200


async def test_a_rebound_host_name_gets_nothing_without_a_token(redis_url: str) -> None:
    async with http_proxy(redis_url, {"max_retry": 0}, http={"allowed_hosts": ["proxy.internal"]}) as (service, api):
        port = service.http_port
        rebound = f"rebind.attacker.example:{port}"
        for path in ("/admin/groups", "/admin/groups/g", LETTERS, "/", "/console", "/console/console.js"):
            for headers in ({"Host": rebound}, {"Host": rebound, "Origin": f"http://{rebound}"}):
                status, error = await api.call("GET", path, headers=headers)
                assert (status, error["code"]) == (403, 1008), (path, headers)
        status, error = await api.call(
            "POST", LETTERS + "/purge", json={"all": True}, headers={"Host": rebound, "Origin": f"http://{rebound}"}
        )
        assert (status, error["code"]) == (403, 1008)
        # Loopback literals, localhost and the listed names pass; an Origin must name the Host asked for.
        for host in (f"127.0.0.1:{port}", f"127.0.0.2:{port}", f"localhost:{port}", f"[::1]:{port}",
                     f"proxy.internal:{port}", "PROXY.internal"):
            assert (await api.call("GET", "/admin/groups", headers={"Host": host}))[0] == 200, host
        status, _ = await api.call(
            "POST", LETTERS + "/purge", json={"all": True},
            headers={"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"},
        )
        assert status == 200
        status, error = await api.call(
            "POST", LETTERS + "/purge", json={"all": True},
            headers={"Host": f"localhost:{port}", "Origin": f"http://127.0.0.1:{port + 1}"},
        )
        assert (status, error["code"]) == (403, 1008)
        # Changing admin calls take JSON only.
        status, error = await api.call(
            "POST", LETTERS + "/purge", data=b'{"all": true}', headers={"Content-Type": "text/plain"}
        )
        assert (status, error["code"]) == (415, 1003)


async def test_with_a_token_every_admin_call_needs_it_under_any_host(redis_url: str) -> None:
    async with http_proxy(redis_url, http={"admin_token": TOKEN}) as (service, api):
        rebound = f"rebind.attacker.example:{service.http_port}"
        for headers in ({}, {"Host": rebound}, {"Host": rebound, "Origin": f"http://{rebound}"}):
            status, error = await api.call("GET", "/admin/groups", headers=headers)
            assert (status, error["code"]) == (401, 1007)
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        # With the token, the console opened under any name works (its calls are same-origin)...
        elsewhere = {**bearer, "Host": "proxy.lan:9", "Origin": "http://proxy.lan:9"}
        status, _ = await api.call("POST", LETTERS + "/purge", json={"all": True}, headers=elsewhere)
        assert status == 200
        # ...but not a page of another origin, even one that somehow holds the token.
        status, error = await api.call(
            "POST", LETTERS + "/purge", json={"all": True}, headers={**bearer, "Origin": "http://127.0.0.1:1"}
        )
        assert (status, error["code"]) == (403, 1008)


async def test_the_data_token_guards_the_pull_api_only(redis_url: str) -> None:
    async with http_proxy(redis_url, http={"data_token": DATA_TOKEN}) as (_, api):
        calls = (("/v1/pull", {"group": "g", "linger_ms": 0}), ("/v1/ack", {"group": "g", "results": []}))
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {TOKEN}"}):
            for path, request in calls:
                status, error = await api.call("POST", path, json=request, headers=headers)
                assert (status, error["code"]) == (401, 1007), (path, headers)
        bearer = {"Authorization": f"Bearer {DATA_TOKEN}"}
        status, body = await api.call("POST", "/v1/pull", json={"group": "g", "linger_ms": 0}, headers=bearer)
        assert status == 200 and body["messages"] == []
        assert (await api.call("GET", "/admin/groups"))[0] == 200  # loopback admin, no admin token: unchanged
        assert (await api.call("GET", "/healthz"))[0] == 200


@pytest.mark.parametrize(
    ("http", "expected"),
    [
        ({}, ["thrift binds 0.0.0.0", "http binds 0.0.0.0", "without http.data_token"]),
        ({"data_token": DATA_TOKEN}, ["thrift binds 0.0.0.0"]),
    ],
)
async def test_a_bind_beyond_loopback_without_defences_is_warned_about(
    redis_url: str, caplog: pytest.LogCaptureFixture, http: dict[str, Any], expected: list[str]
) -> None:
    with caplog.at_level(logging.WARNING, logger="ddmq.proxy.service"):
        async with http_proxy(redis_url, http={"host": "0.0.0.0", **http}, thrift={"host": "0.0.0.0", "port": 0}):
            pass
    warnings = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    for part in expected:
        assert part in warnings
    assert ("http binds" in warnings) == (not http)


async def test_loopback_binds_log_no_exposure_warning(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="ddmq.proxy.service"):
        async with http_proxy(redis_url):
            pass
    assert not [r for r in caplog.records if "binds" in r.getMessage()]


async def test_allowed_clients_count_as_a_defence_for_a_wide_bind(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ddmq.proxy.service"):
        async with http_proxy(redis_url, http={"host": "0.0.0.0", "allowed_clients": ["127.0.0.0/8"]},
                              thrift={"host": "0.0.0.0", "port": 0, "allowed_clients": ["127.0.0.0/8"]}):
            pass
    assert not [r for r in caplog.records if "binds" in r.getMessage()]
