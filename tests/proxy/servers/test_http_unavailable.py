"""Redis gone: every admin operation answers a status its document lists, and exactly the operations
that read or write Redis answer 503 (code 1006, retriable), the ones served from this proxy's memory
still 200 (a key's explanation is served from memory when the proxy reads every queue). The proxy has a
Redis server of its own here, killed under it."""

from __future__ import annotations

from typing import Any

import aiohttp

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.servers.http import load_openapi
from tests.harness.stack import RedisServer

from ...http_support import ApiClient, OpenApiChecker
from ..conftest import running_proxy

LETTERS = "/admin/groups/g/topics/t/dead-letters"
KEYS = "/admin/groups/g/topics/t/keys"
#: One valid call of each admin operation: (method, path, body); a query after "?".
CALLS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/admin/groups", None),
    ("GET", "/admin/groups/g", None),
    ("GET", "/admin/groups/g/lag-history", None),
    ("GET", "/admin/groups/g/in-flight", None),
    ("GET", "/admin/groups/g/blocked-keys", None),
    ("GET", "/admin/groups/g/clients", None),
    ("GET", KEYS, None),
    ("GET", KEYS + "/explain?key=a", None),
    ("POST", KEYS + "/retry", {"key": "a"}),
    ("GET", "/admin/groups/g/pause", None),
    ("POST", "/admin/groups/g/pause", {"for_ms": 1000}),
    ("POST", "/admin/groups/g/resume", {}),
    ("GET", "/admin/actions", None),
    ("GET", LETTERS, None),
    ("POST", LETTERS + "/replay", {"all": True}),
    ("POST", LETTERS + "/purge", {"all": True}),
    ("GET", LETTERS + "/1-0", None),
]


def _template(path: str) -> str:
    for documented in load_openapi()["paths"]:
        parts, want = documented.split("/"), path.split("/")
        if len(parts) == len(want) and all(p == w or p.startswith("{") for p, w in zip(parts, want, strict=True)):
            if documented.endswith("/{id}") and want[-1] in ("replay", "purge"):
                continue
            return documented
    raise AssertionError(f"{path} is not documented")


async def test_without_redis_each_admin_operation_answers_a_documented_status_503_where_it_needs_redis() -> None:
    document = load_openapi()["paths"]
    covered = {(_template(path.split("?")[0]), method.lower()) for method, path, _ in CALLS}
    admin = {(path, method) for path, item in document.items() if path.startswith("/admin/") for method in item}
    assert covered == admin, admin ^ covered
    with RedisServer() as redis_server:
        async with running_proxy(redis_server.url, {"order_key": "KEY"}, http={"enabled": True, "port": 0}) as service:
            async with AsyncProducer(redis_server.url) as producer:
                await producer.send("t", "m", key="a")
            redis_server.kill()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
                for method, target, body in CALLS:
                    path, _, query = target.partition("?")
                    params = dict(part.split("=") for part in query.split("&")) if query else None
                    status, answer = await api.call(method, path, json=body, params=params)  # held to the document
                    needs_redis = "503" in document[_template(path)][method.lower()]["responses"]
                    if path.endswith("/explain"):
                        # Answered from memory when this proxy reads every queue (it may have claimed
                        # them all before the kill); Redis is asked only about the queues it does not read.
                        consumer = service.groups["g"].consumers["t"]
                        needs_redis = len(set(consumer.held)) < consumer.queues
                    if needs_redis:
                        assert status == 503 and answer["retriable"], (method, path, status, answer)
                    else:
                        assert status == 200, (method, path, status, answer)
