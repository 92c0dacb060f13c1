"""Hostile web pages in a real headless Chromium against a real proxy (in this event loop) and real
Redis: a page served from another loopback origin and a local ``file://`` page each try to pull, ack,
read an admin page and purge the dead letters, with the requests a page may send without asking
(``no-cors``, ``text/plain``) and with CORS ones; a page whose host name was rebound to the proxy
(DNS rebinding, simulated with Chromium's host resolver rules) tries the same from the proxy's own
origin. None of it gets anything, and the real consumer then receives every message, in key order.
The console still works under ``localhost``, with and without a token (``tests/system/test_console.py``
covers the rest of it).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.async_api import BrowserContext, Page, async_playwright, expect

from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.core.types import StoredMessage
from ddmq.proxy.service import ProxyService

from ..http_support import ApiClient
from ..proxy.servers.test_http_api import http_proxy
from .test_console import CHROMIUM_ARGS, TOKEN
from .test_console import chromium as chromium  # the fixture: Debian's chromium, installed when missing

REBOUND = "rebind.attacker.example"
LETTERS = "/admin/groups/g/topics/t/dead-letters"

#: What a hostile page runs against ``proxy``; it records what it could read in ``window.out``.
ATTACK_JS = """
async (proxy) => {
  const out = {};
  const acks = [0, 1, 2, 3].map((qid) => ({topic: "t", qid, success: Array.from({length: 100}, (_, i) => i + 1)}));
  const pullBody = JSON.stringify({group: "g", topic: "t", max_batch: 100, linger_ms: 0, results: acks});
  const ackBody = JSON.stringify({group: "g", results: acks});
  const simple = (path, body) => fetch(proxy + path, {method: "POST", mode: "no-cors",
      headers: {"Content-Type": "text/plain"}, body}).then((r) => r.type, (e) => "error");
  const read = (path, options) => fetch(proxy + path, options).then((r) => r.text().then((t) => r.status + " " + t),
      (e) => "blocked");
  out.pulls = [];
  for (let i = 0; i < 10; i++) out.pulls.push(await simple("/v1/pull", pullBody));
  out.ack = await simple("/v1/ack", ackBody);
  out.purge = await simple("/admin/groups/g/topics/t/dead-letters/purge", '{"all": true}');
  const json = {"Content-Type": "application/json"};
  out.corsPull = await read("/v1/pull", {method: "POST", headers: json, body: pullBody});
  out.corsPurge = await read("/admin/groups/g/topics/t/dead-letters/purge",
      {method: "POST", headers: json, body: '{"all": true}'});
  out.admin = await read("/admin/groups", {});
  out.letters = await read("/admin/groups/g/topics/t/dead-letters", {});
  return out;
}
"""


@pytest.fixture
async def browser(chromium: str, tmp_path: Path) -> AsyncIterator[BrowserContext]:
    """A fresh Chromium profile whose resolver sends the attacker's name to this machine."""
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=chromium,
            headless=True,
            args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"],
        )
        try:
            yield context
        finally:
            await context.close()


@pytest.fixture
async def attacker_origin() -> AsyncIterator[str]:
    """Another web server on loopback (another port: another origin), serving an empty page."""
    app = web.Application()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>cats</title><p>nothing to see", content_type="text/html")

    app.router.add_get("/", page)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def prepare(service: ProxyService, redis_url: str) -> list[tuple[str, str]]:
    """40 messages to consume and 5 dead letters to (not) purge."""
    sent = [(f"k{i % 4}", f"v{i:02d}") for i in range(40)]
    async with AsyncProducer(redis_url) as producer:
        await producer.send_batch("t", [{"key": key, "value": value} for key, value in sent])
    assert service.broker is not None
    for i in range(5):
        await service.broker.dead_letter("g", "t", 0, StoredMessage(i + 1, b"secret", "d", "", {}, 1), 1, "x")
    return sent


async def committed(api: ApiClient) -> list[int]:
    status, detail = await api.call("GET", "/admin/groups/g")
    assert status == 200
    return [queue["committed"] for queue in detail["queues"]]


async def check_nothing_happened(
    service: ProxyService, api: ApiClient, out: dict[str, Any], before: list[int]
) -> None:
    stats = service.groups["g"].buffer.stats
    assert (stats.delivered, stats.acked) == (0, 0), out
    assert "secret" not in json.dumps(out)
    for name in ("corsPull", "corsPurge", "admin", "letters"):
        assert out[name] == "blocked" or not out[name].startswith("200"), (name, out[name])
    status, page = await api.call("GET", LETTERS)
    assert status == 200 and page["total"] == 5  # nothing purged
    assert await committed(api) == before


async def consume_everything(api: ApiClient, sent: list[tuple[str, str]]) -> None:
    seen: list[tuple[str, str]] = []
    while len(seen) < len(sent):
        status, body = await api.call("POST", "/v1/pull", json={"group": "g", "topic": "t", "max_batch": 100,
                                                                "linger_ms": 1000})
        assert status == 200 and body["messages"], seen
        seen += [(m["key"], m["value_text"]) for m in body["messages"]]
        acks = [{"topic": "t", "qid": body["qid"], "success": [m["offset"] for m in body["messages"]]}]
        assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": acks}))[0] == 200
    assert sorted(seen) == sorted(sent)
    for key in {k for k, _ in sent}:
        assert [v for k, v in seen if k == key] == [v for k, v in sent if k == key]


async def attack(page: Page, proxy: str) -> dict[str, Any]:
    out: dict[str, Any] = await page.evaluate(ATTACK_JS, proxy)
    return out


async def test_a_page_of_another_loopback_origin_gets_nothing(
    redis_url: str, browser: BrowserContext, attacker_origin: str
) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        sent = await prepare(service, redis_url)
        page = await browser.new_page()
        await page.goto(attacker_origin + "/")
        before = await committed(api)
        out = await attack(page, api.base)
        assert out["pulls"] == ["opaque"] * 10  # the browser sent them; the proxy refused them
        await check_nothing_happened(service, api, out, before)
        await consume_everything(api, sent)


async def test_a_file_page_gets_nothing(redis_url: str, browser: BrowserContext, tmp_path: Path) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        sent = await prepare(service, redis_url)
        local = tmp_path / "invoice.html"
        local.write_text("<!doctype html><title>invoice</title><p>open me")
        page = await browser.new_page()
        await page.goto(local.as_uri())
        before = await committed(api)
        out = await attack(page, api.base)
        await check_nothing_happened(service, api, out, before)
        await consume_everything(api, sent)


@pytest.mark.parametrize("token", [None, TOKEN])
async def test_a_rebound_host_name_gets_nothing(redis_url: str, browser: BrowserContext, token: str | None) -> None:
    http = {"admin_token": token} if token else {}
    async with http_proxy(redis_url, {"order_key": "KEY"}, http=http) as (service, api):
        api.headers = {"Authorization": f"Bearer {token}"} if token else {}  # the test's own checks
        sent = await prepare(service, redis_url)
        page = await browser.new_page()
        # After rebinding, the attacker's name leads to the proxy: its pages are now "same origin".
        rebound = f"http://{REBOUND}:{service.http_port}"
        response = await page.goto(rebound + "/console")
        assert response is not None and response.status == (200 if token else 403)
        before = await committed(api)
        out = await attack(page, rebound)
        await check_nothing_happened(service, api, out, before)
        await consume_everything(api, sent)


@pytest.mark.parametrize("token", [None, TOKEN])
async def test_the_console_still_works_under_localhost(
    redis_url: str, browser: BrowserContext, token: str | None
) -> None:
    http = {"admin_token": token} if token else {}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http_proxy(redis_url, {"order_key": "KEY"}, http=http) as (service, api):
        api.headers = headers
        await prepare(service, redis_url)
        assert service.broker is not None  # and one whose value the listing cuts
        big = StoredMessage(9, b"long text " * 10_000, "d", "", {}, 1)
        await service.broker.dead_letter("g", "t", 0, big, 1, "x")
        page = await browser.new_page()
        await page.goto(f"http://localhost:{service.http_port}/")
        if token:
            await page.locator("#token").fill(token)
            await page.locator("#token").press("Enter")
        await expect(page.locator("#main")).to_be_visible()
        await expect(page.locator("#dead tbody tr")).to_have_count(6)
        await expect(page.locator("#dead tbody tr td.body").last).to_contain_text("… (100,000 bytes)")
        page.on("dialog", lambda dialog: dialog.accept())
        await page.locator("#purge-all").click()
        await expect(page.locator("#dead-result")).to_have_text("purged 6")
        assert (await api.call("GET", LETTERS))[1]["total"] == 0
