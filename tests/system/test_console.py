"""The ops console in a real headless Chromium, against a real proxy (in this event loop), real Redis
and real traffic: what the page shows matches ``/admin``, a key nobody acks shows as blocked, a dead
letter is replayed into its queue from the page, purging asks first, hostile keys and bodies stay
text, the token is asked for and kept in the tab, and 64 queues with 10,000 keys stay paged.

Chromium is Debian's ``chromium`` package, driven by Playwright for Python (never Playwright's own
browser download). The ``chromium`` fixture installs the package when it is missing and the tests run
as root, and fails with the command to run otherwise. Screenshots (1280x800) go to ``tests/artifacts/``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from playwright.async_api import BrowserContext, Dialog, Page, async_playwright, expect

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis.actions import record_action

from ..http_support import ApiClient, OpenApiChecker
from ..proxy.conftest import running_proxy
from ..proxy.servers.test_http_api import eventually, pull
from ..support import debian_tool

ARTIFACTS = Path(__file__).parent.parent / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "console-token-0123456789"
#: Would run if any of it reached the page as HTML.
HOSTILE_KEY = '<img src=x onerror="window.__pwned=1;document.title=\'pwned\'">'
HOSTILE_BODY = "<script>window.__pwned=2</script><img src=x onerror=window.__pwned=3>"


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing and running as root."""
    return debian_tool("chromium")


@pytest.fixture
async def browser(chromium: str, tmp_path: Path) -> AsyncIterator[BrowserContext]:
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh profile per test
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            yield context
        finally:
            await context.close()


class Watched:
    """A page plus what it must never do: raise, hit the Content Security Policy, or open dialogs we
    did not expect."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.answer_dialogs: list[bool] = []
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        page.on("console", lambda msg: self.errors.append(f"{msg.text} {msg.location.get('url', '')}".strip())
                if msg.type == "error" else None)
        page.on("dialog", self._dialog)

    async def _dialog(self, dialog: Dialog) -> None:
        self.dialogs.append(dialog.message)
        if self.answer_dialogs and self.answer_dialogs.pop(0):
            await dialog.accept()
        else:
            await dialog.dismiss()

    async def assert_nothing_ran(self) -> None:
        page = self.page
        assert await page.evaluate("window.__pwned") is None
        assert await page.title() == "ddmq-proxy console"
        assert await page.evaluate("document.querySelectorAll('img, script:not([src])').length") == 0
        assert not [e for e in self.errors if "Content Security Policy" in e or "pwned" in e], self.errors


async def screenshot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def digits(text: str) -> int:
    return int(re.sub(r"[^0-9]", "", text))


async def admin(api: ApiClient, path: str, **params: str) -> Any:
    status, body = await api.call("GET", path, params=params)
    assert status == 200, body
    return body


async def page_matches_admin(page: Page, api: ApiClient) -> bool:
    """Every queue row on the page shows what /admin/groups/g answers now."""
    detail = await admin(api, "/admin/groups/g")
    for queue in detail["queues"]:
        row = page.locator(f'#queues tr[data-qid="{queue["qid"]}"]')
        if await row.count() != 1:
            return False
        cells = [await row.locator(f"td.{name}").inner_text() for name in ("lag", "committed", "produced")]
        if [digits(cell) for cell in cells] != [queue["lag"], queue["committed"], queue["produced"]]:
            return False
        if await row.locator("td").nth(2).inner_text() != queue["owner"]:
            return False
    return True


async def test_console_shows_lag_blocked_keys_and_replays_a_dead_letter(
    redis_url: str, browser: BrowserContext
) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 0}
    http = {"enabled": True, "port": 0}
    async with (
        running_proxy(redis_url, config, instance_id="console-proxy", http=http) as service,
        aiohttp.ClientSession() as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i % 10}", "value": f"v{i}"} for i in range(40)])
            await producer.send_batch("t", [{"key": HOSTILE_KEY, "value": f"stuck {i}"} for i in range(3)])
            await producer.send("t", HOSTILE_BODY, key="poison")
        stuck, dead = await _consume(api, expected=44)

        await eventually(lambda: _settled(api, lag=3))
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await expect(page.locator("#main")).to_be_visible()
        await expect(page.locator("#group")).to_have_value("g")
        await expect(page.locator("#instance")).to_have_text("console-proxy")
        await eventually(lambda: page_matches_admin(page, api))
        stuck_row = page.locator(f'#queues tr[data-qid="{stuck["qid"]}"]')
        await expect(stuck_row.locator("td.age")).to_have_text(re.compile(r"^\d+(\.\d)? (ms|s)$"))
        await expect(page.locator("#topics tr[data-topic=t] td.lag")).to_have_text("3")
        await expect(page.locator("#members tr[data-member=console-proxy]")).to_contain_text("live")

        # Retention and memory: nothing expired, the group holds its unfinished messages in Redis.
        topic_row = page.locator("#topics tr[data-topic=t]")
        await expect(topic_row.locator("td.expired")).to_have_text("0")
        await expect(topic_row.locator("td.retention")).to_have_text(re.compile(r"^g: [\d,]+ msgs, oldest "))
        await expect(stuck_row.locator("td.stored")).not_to_have_text("0")
        await expect(page.locator("#memory")).to_have_text(
            re.compile(r"^Redis memory: \d+\.\d MiB of \d+\.\d MiB \(\d+ %\)$"))

        # The key nobody acks: its head in flight, two messages behind it, shown as plain text.
        blocked = page.locator("#blocked tbody tr").filter(has_text="in flight")
        await expect(blocked).to_have_count(1)
        await expect(blocked.locator("td.key")).to_have_text(HOSTILE_KEY)
        await expect(blocked.locator("td").nth(6)).to_have_text("3")

        # The dead letter, its hostile body as text; replay puts it back into its queue.
        letter = page.locator(f'#dead tr[data-id="{dead["id"]}"]')
        await expect(letter.locator("td.key")).to_have_text("poison")
        await expect(letter.locator("td.body")).to_have_text(HOSTILE_BODY)
        await screenshot(page, "console-overview")
        await watched.assert_nothing_ran()
        produced = (await admin(api, "/admin/groups/g"))["queues"][dead["qid"]]["produced"]
        await letter.locator("button.replay").click()
        await expect(page.locator("#dead-result")).to_have_text("replayed 1")
        await expect(page.locator("#dead tbody")).to_have_text("no dead letters")
        assert (await admin(api, "/admin/groups/g/topics/t/dead-letters"))["total"] == 0
        again = await pull(api, topic="t", max_batch=10)
        assert [(m["key"], m["value_text"]) for m in again["messages"]] == [("poison", HOSTILE_BODY)]
        assert (again["qid"], again["messages"][0]["offset"]) == (dead["qid"], produced)  # its queue, at the end

        # Purge asks first: dismissed, nothing is deleted; accepted, it is gone.
        fail = [{"topic": "t", "qid": again["qid"], "fail": [again["messages"][0]["offset"]]}]
        await api.call("POST", "/v1/ack", json={"group": "g", "results": fail})
        row = page.locator("#dead tbody tr").filter(has_text="poison")
        await expect(row).to_have_count(1)
        await row.locator("button.purge").click()
        assert watched.dialogs and "Purge 1 dead letter(s) of g/t?" in watched.dialogs[-1]
        assert (await admin(api, "/admin/groups/g/topics/t/dead-letters"))["total"] == 1
        watched.answer_dialogs.append(True)
        await row.locator("button.purge").click()
        await expect(page.locator("#dead-result")).to_have_text("purged 1")
        assert (await admin(api, "/admin/groups/g/topics/t/dead-letters"))["total"] == 0
        await screenshot(page, "console-after-purge")
        await watched.assert_nothing_ran()
        assert not watched.errors, watched.errors


async def _consume(api: ApiClient, expected: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pull everything a client can get: ack all, but never the hostile key's head (held in flight)
    and fail the poison message (max_retry 0: dead-lettered at once)."""
    stuck: dict[str, Any] | None = None
    seen = 0
    results: list[dict[str, Any]] = []
    while seen < expected - 2:  # the hostile key's two followers wait behind its head
        batch = await pull(api, results, topic="t", max_batch=16, linger_ms=500)
        results = []
        if not batch["messages"]:
            continue
        seen += len(batch["messages"])
        success, fail = [], []
        for message in batch["messages"]:
            if message["key"] == HOSTILE_KEY:
                stuck = {"qid": batch["qid"], **message}
            elif message["key"] == "poison":
                fail.append(message["offset"])
            else:
                success.append(message["offset"])
        results = [{"topic": "t", "qid": batch["qid"], "success": success, "fail": fail}]
    status, _ = await api.call("POST", "/v1/ack", json={"group": "g", "results": results})
    assert status == 200 and stuck is not None
    letters: dict[str, Any] = {}

    async def dead_lettered() -> bool:
        letters.update(await admin(api, "/admin/groups/g/topics/t/dead-letters"))
        return bool(letters["total"] == 1)

    await eventually(dead_lettered)
    letter: dict[str, Any] = letters["entries"][0]
    return stuck, letter


async def _settled(api: ApiClient, lag: int) -> bool:
    detail = await admin(api, "/admin/groups/g")
    return sum(queue["lag"] for queue in detail["queues"]) == lag


async def test_console_asks_for_the_token_and_keeps_it_in_the_tab(redis_url: str, browser: BrowserContext) -> None:
    http = {"enabled": True, "port": 0, "admin_token": TOKEN}
    async with running_proxy(redis_url, http=http) as service, aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{service.http_port}"
        async with session.get(base + "/admin/groups") as response:
            assert response.status == 401
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(base + "/console")
        await expect(page.locator("#auth")).to_be_visible()
        await expect(page.locator("#main")).to_be_hidden()
        await page.fill("#token", "wrong-token-0123456789")
        await page.click("#auth button[type=submit]")
        await expect(page.locator("#auth-error")).to_have_text("that token was refused")
        await screenshot(page, "console-token")
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        await expect(page.locator("#main")).to_be_visible()
        await expect(page.locator("#group")).to_have_value("g")
        assert await page.evaluate("sessionStorage.getItem('ddmq-admin-token')") == TOKEN
        assert await page.evaluate("localStorage.length") == 0
        # Another tab starts without it; forgetting it locks this one again.
        other = await browser.new_page()
        await other.goto(base + "/console")
        await expect(other.locator("#auth")).to_be_visible()
        await page.click("#forget")
        await expect(page.locator("#auth")).to_be_visible()
        assert await page.evaluate("sessionStorage.length") == 0
        # The browser's refused calls show up as console errors (401); nothing else may.
        assert all("401" in error for error in watched.errors), watched.errors


async def test_console_pages_64_queues_and_10000_blocked_keys(redis_url: str, browser: BrowserContext) -> None:
    config = {"order_key": "KEY", "concurrency": 20_000, "read_batch_size": 1000}
    http = {"enabled": True, "port": 0}
    async with (
        running_proxy(redis_url, config, queues=64, http=http) as service,
        aiohttp.ClientSession() as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            for start in range(0, 10_000, 1000):
                batch = [{"key": f"key-{i:05}", "value": "x"} for i in range(start, start + 1000)]
                await producer.send_batch("t", batch)

        async def all_read() -> bool:
            return (await admin(api, "/admin/groups/g/blocked-keys", limit="1"))["total"] == 10_000

        await eventually(all_read, timeout_s=30)
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await expect(page.locator("#queues tbody tr")).to_have_count(64)
        await expect(page.locator("#blocked-pager .range")).to_have_text("1\N{EN DASH}20 of 10,000")
        await expect(page.locator("#blocked tbody tr")).to_have_count(20)
        await page.click("#blocked-pager [data-step='1']")
        await expect(page.locator("#blocked-pager .range")).to_have_text("21\N{EN DASH}40 of 10,000")
        await expect(page.locator("#blocked tbody tr")).to_have_count(20)
        await expect(page.locator("#topics tr[data-topic=t] td.lag")).to_have_text("10,000")
        await screenshot(page, "console-64-queues")
        assert not watched.errors, watched.errors


ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


async def test_console_shows_rates_dead_letters_clients_one_time_format_and_lag_history_across_a_restart(
    redis_url: str, browser: BrowserContext
) -> None:
    from ddmq.client.thrift_client import AsyncProxyClient
    from ddmq.protocol.wire import ConsumeResult, PullRequest

    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 0}
    http = {"enabled": True, "port": 0}
    async with (
        running_proxy(redis_url, config, instance_id="console-proxy", http=http) as service,
        aiohttp.ClientSession() as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i}", "value": f"v{i}", "qid": 0} for i in range(20)])
        async with AsyncProxyClient("127.0.0.1", service.thrift_port or 0) as thrift:
            response = await thrift.pull(PullRequest(groupId="g", topic="t", maxBatchSize=4, maxLingerTime=5000,
                                                     version="carrera-java/2.3.1"))
            assert len(response.messages) == 4
            # One failed (max_retry 0: a dead letter), three left in flight by this client.
            failed = ConsumeResult(context=response.context, failOffsets=[response.messages[0].offset])
            assert await thrift.submit(failed)

            async def dead_lettered() -> bool:
                return bool((await admin(api, "/admin/groups/g"))["dead_letters"]["t"] == 1)

            await eventually(dead_lettered)
            watched = Watched(await browser.new_page())
            page = watched.page
            await page.goto(f"http://127.0.0.1:{service.http_port}/")
            await expect(page.locator("#main")).to_be_visible()
            topic_row = page.locator("#topics tr[data-topic=t]")
            await expect(topic_row.locator("td.dead")).to_have_text("1")
            client_row = page.locator("#clients tbody tr")
            await expect(client_row).to_have_count(1)
            await expect(client_row.locator("td.version")).to_have_text("carrera-java/2.3.1")
            await expect(client_row.locator("td.in-flight")).to_have_text("3")
            await expect(client_row.locator("td.mono").first).to_have_text(re.compile(r"^127\.0\.0\.1:\d+$"))
            await expect(client_row.locator("td.last-pull")).to_have_text(ISO_UTC)
            # One time format: the status line and a dead letter's time read like the last pull.
            await expect(page.locator("#status")).to_have_text(re.compile(r"^updated \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$"))
            await expect(page.locator("#dead tbody tr").first.locator("td").nth(6)).to_have_text(ISO_UTC)

            # Rates: once a sample holds the first 20, 20 more make the next interval's rate in positive.
            async def sampled() -> bool:
                return bool((await admin(api, "/admin/groups/g/lag-history"))["topics"].get("t"))

            await eventually(sampled, timeout_s=30)
            async with AsyncProducer(redis_url) as producer:
                await producer.send_batch("t", [{"key": f"m{i}", "value": "v", "qid": 1} for i in range(20)])
            await expect(topic_row.locator("td.rate-in")).to_have_text(re.compile(r"^[1-9]\d*(\.\d)?$|^0\.[1-9]$"),
                                                                       timeout=20_000)
            await expect(topic_row.locator("td.rate-out")).to_have_text(re.compile(r"^\d+(\.\d)?$"))
            await screenshot(page, "console-rates-clients")
            await watched.assert_nothing_ran()
            assert not watched.errors, watched.errors
        before = (await admin(api, "/admin/groups/g/lag-history"))["topics"]["t"]
        assert len(before) >= 2

    # A restarted proxy (same Redis) shows the history its predecessor sampled.
    async with (
        running_proxy(redis_url, config, instance_id="console-proxy", http=http) as service,
        aiohttp.ClientSession() as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())

        async def restored() -> bool:
            after = (await admin(api, "/admin/groups/g/lag-history"))["topics"].get("t", [])
            return [s[0] for s in after[: len(before)]] == [s[0] - s[0] % 5000 for s in before]

        await eventually(restored)
        page = await browser.new_page()
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await expect(page.locator('#charts [data-topic=t] [data-chart=lag] polyline.msgs')).to_have_count(1)


async def test_console_keys_panel_retries_and_skips_a_parked_key(redis_url: str, browser: BrowserContext) -> None:
    """A key parked on its failed head shows first with its reason and the counts per state; retry from
    the page delivers the head again, skip (after a confirmation) dead-letters it and the key moves on."""
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 0, "on_exhausted": "park"}
    http = {"enabled": True, "port": 0, "admin_token": TOKEN}
    async with (
        running_proxy(redis_url, config, http=http) as service,
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": "r1", "value": f"r1 {event}", "qid": 0}
                                            for event in ("call", "pickup", "pay")])
            await producer.send_batch("t", [{"key": f"other-{i}", "value": "call", "qid": 1} for i in range(3)])
        call = await _fail_head_of(api, "r1", "card declined")

        async def parked() -> bool:
            keys = await admin(api, "/admin/groups/g/topics/t/keys", state="parked")
            return [k["key"] for k in keys["keys"]] == ["r1"]

        await eventually(parked)
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        await expect(page.locator("#main")).to_be_visible()
        first = page.locator("#keys tbody tr").first  # stuck keys first
        await expect(first).to_have_attribute("data-key", "r1")
        await expect(first.locator("td.state")).to_have_text("parked")
        await expect(first.locator("td.reason")).to_have_text("card declined")
        await expect(page.locator("#keys-counts")).to_contain_text("1 parked")
        # Filters: by state, by key.
        await page.select_option("#keys-state", "waiting")
        await expect(page.locator("#keys tbody tr[data-key=r1]")).to_have_count(0)
        await page.select_option("#keys-state", "")
        await page.fill("#keys-key", "r1")
        await page.press("#keys-key", "Enter")
        await expect(page.locator("#keys tbody tr")).to_have_count(1)
        await screenshot(page, "console-keys-parked")

        # retry: the same head is delivered again.
        await page.locator("#keys tr[data-key=r1] button.retry").click()
        await expect(page.locator("#keys-result")).to_contain_text("retry r1")
        again = await _fail_head_of(api, "r1", "declined again")
        assert again == call
        await expect(page.locator("#keys tr[data-key=r1] td.reason")).to_have_text("declined again", timeout=10_000)

        # skip asks first; accepted, the head goes to the dead letters and pickup comes next.
        await page.locator("#keys tr[data-key=r1] button.skip").click()
        assert watched.dialogs and "Skip the head of key r1" in watched.dialogs[-1]
        assert (await admin(api, "/admin/groups/g/topics/t/dead-letters"))["total"] == 0
        watched.answer_dialogs.append(True)
        await page.locator("#keys tr[data-key=r1] button.skip").click()
        await expect(page.locator("#keys-result")).to_contain_text("skip r1")
        letters = await admin(api, "/admin/groups/g/topics/t/dead-letters")
        assert [(e["key"], e["offset"]) for e in letters["entries"]] == [("r1", call)]
        batch = await pull(api, topic="t", max_batch=10)
        assert [m["value_text"] for m in batch["messages"] if m["key"] == "r1"] == ["r1 pickup"]
        await watched.assert_nothing_ran()
        # The calls refused before the token was given show as console errors (401); nothing else may.
        assert all("401" in error for error in watched.errors), watched.errors


async def _fail_head_of(api: ApiClient, key: str, reason: str) -> int:
    """Pull until ``key``'s head comes, ack everything else, fail the head with ``reason``; its offset."""
    for _ in range(20):
        batch = await pull(api, topic="t", max_batch=10, linger_ms=500)
        mine = [m["offset"] for m in batch["messages"] if m["key"] == key]
        others = [m["offset"] for m in batch["messages"] if m["key"] != key]
        details = [{"offset": offset, "reason": reason} for offset in mine]
        results = [{"topic": "t", "qid": batch["qid"], "success": others, "fail_details": details}]
        if batch["messages"]:
            status, answer = await api.call("POST", "/v1/ack", json={"group": "g", "results": results})
            assert status == 200, answer
        if mine:
            return int(mine[0])
    raise AssertionError(f"{key}'s head never came")


async def test_console_pauses_and_resumes_a_topic_and_shows_the_operator_actions(
    redis_url: str, browser: BrowserContext
) -> None:
    """Pause asks first; accepted, the topic hands out nothing on the pull API; resume from the page
    lets its messages go. Both show in the "Operator actions" panel, with who (the token's holder and
    address) and what, and a hostile name recorded there stays text."""
    http = {"enabled": True, "port": 0, "admin_token": TOKEN}
    async with (
        running_proxy(redis_url, {"order_key": "KEY"}, http=http) as service,
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"r{i}", "value": f"call {i}", "qid": 0} for i in range(3)])
        assert service.redis is not None
        await record_action(service.redis, HOSTILE_KEY, "breaker open", detail={"why": HOSTILE_BODY})
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await page.fill("#token", TOKEN)
        await page.click("#auth button[type=submit]")
        await expect(page.locator("#main")).to_be_visible()
        row = page.locator('#pauses tr[data-topic="t"]')
        await expect(row.locator("td.state")).to_have_text("running")
        await expect(page.locator('#pauses tr[data-topic="*"] td.state')).to_have_text("running")
        hostile = page.locator("#actions tbody tr").first
        await expect(hostile.locator("td.who")).to_have_text(HOSTILE_KEY)

        await row.locator("button.pause").click()  # dismissed: nothing changes
        assert watched.dialogs and "Pause g/t?" in watched.dialogs[-1]
        assert (await admin(api, "/admin/groups/g/pause"))["paused"] == []
        watched.answer_dialogs.append(True)
        await row.locator("button.pause").click()
        await expect(page.locator("#pause-result")).to_have_text("paused g/t")
        await expect(row.locator("td.state")).to_have_text("paused")
        paused = (await admin(api, "/admin/groups/g/pause"))["paused"]
        assert [(p["topic"], p["by"]) for p in paused] == [("t", "console")]
        assert (await pull(api, max_batch=10, linger_ms=300))["messages"] == []
        first = page.locator("#actions tbody tr").first
        await expect(first).to_have_attribute("data-action", "pause")
        await expect(first.locator("td.who")).to_have_text("admin token from 127.0.0.1")
        await expect(first.locator("td.where")).to_have_text("g/t")
        await expect(first.locator("td.detail")).to_contain_text('by="console"')
        await screenshot(page, "console-paused-and-actions")

        await row.locator("button.resume").click()
        await expect(page.locator("#pause-result")).to_contain_text("resumed g/t (1 pause(s) lifted)")
        await expect(row.locator("td.state")).to_have_text("running")
        await expect(page.locator("#actions tbody tr").first).to_have_attribute("data-action", "resume")
        got: list[str] = []

        async def delivered() -> bool:
            batch = await pull(api, max_batch=10, linger_ms=300)
            got.extend(m["value_text"] for m in batch["messages"])
            if batch["messages"]:
                results = [{"topic": "t", "qid": batch["qid"], "success": [m["offset"] for m in batch["messages"]]}]
                assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": results}))[0] == 200
            return len(got) >= 3

        await eventually(delivered)
        assert sorted(got) == [f"call {i}" for i in range(3)]
        actions = (await admin(api, "/admin/actions", limit="3"))["actions"]
        assert [a["action"] for a in actions] == ["resume", "pause", "breaker open"]
        await watched.assert_nothing_ran()
        assert all("401" in error for error in watched.errors), watched.errors


async def test_console_shows_keys_at_their_cap_and_the_messages_they_left_in_redis(
    redis_url: str, browser: BrowserContext
) -> None:
    """Nobody pulls a key with 50 messages and a cap of 5: the topic's and its queue's rows say one key
    at its cap and the 45 messages it left in Redis, as /admin does; the other queues say none."""
    http = {"enabled": True, "port": 0}
    async with (
        running_proxy(redis_url, {"order_key": "KEY", "key_buffer": 5}, http=http) as service,
        aiohttp.ClientSession() as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            results = await producer.send_batch("t", [{"key": "hot", "value": f"v{i}"} for i in range(50)])
        qid = results[0].qid

        async def held() -> bool:
            topics = (await admin(api, "/admin/groups/g"))["topics"]
            return bool((topics[0]["keys_at_cap"], topics[0]["held_in_redis"]) == (1, 45))

        await eventually(held)
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await expect(page.locator("#topics tr[data-topic=t] td.at-cap")).to_have_text("1 / 45")
        await expect(page.locator("#tenants-section")).to_be_hidden()  # no fair_key
        await expect(page.locator(f'#queues tr[data-qid="{qid}"] td.at-cap')).to_have_text("1 / 45")
        for other in {0, 1, 2, 3} - {qid}:
            await expect(page.locator(f'#queues tr[data-qid="{other}"] td.at-cap')).to_have_text("0 / 0")
        await screenshot(page, "console-keys-at-cap")
        assert not watched.errors, watched.errors


async def test_console_shows_each_tenants_share_and_its_keys_held_in_redis(
    redis_url: str, browser: BrowserContext
) -> None:
    """Tenants by message key, a window of 10, nobody pulling: "a" (5 messages) holds its share of 4 with
    its key held in Redis, "b" its one message; the Tenants table says so as /admin does. Without
    ``fair_key`` the table is not shown (the other console tests' pages)."""
    http = {"enabled": True, "port": 0}
    config = {"order_key": "KEY", "fair_key": "KEY", "concurrency": 10}
    async with (
        running_proxy(redis_url, config, queues=1, http=http) as service,
        aiohttp.ClientSession() as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:  # one queue: read in this order
            await producer.send_batch("t", [{"key": key, "value": key} for key in ["b"] + ["a"] * 5])

        async def shared() -> bool:
            topics = (await admin(api, "/admin/groups/g"))["topics"]
            rows = {row["tenant"]: row for row in topics[0]["tenants"] or ()}
            return bool(rows.get("a", {}).get("held_keys") == 1 and "b" in rows)

        await eventually(shared)
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await expect(page.locator("#tenants-section")).to_be_visible()
        row = page.locator("#tenants tr[data-tenant=a] td")
        await expect(row).to_have_text(["t", "a", "4", "4", "1", "1"])
        await expect(page.locator("#tenants tr[data-tenant=b] td")).to_have_text(["t", "b", "1", "4", "0", "1"])
        await screenshot(page, "console-tenants")
        assert not watched.errors, watched.errors


async def test_console_charts_each_topics_last_hour_and_fits_1280_px_without_scrolling_sideways(
    redis_url: str, browser: BrowserContext
) -> None:
    """Traffic over a few samples: in and out, lag, a dead letter, acks (produce to ack) and a key left in
    flight; the page draws the six charts of the topic from /admin/groups/g/lag-history, and at 1280 px
    nothing on it is wider than the window."""
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 0}
    http = {"enabled": True, "port": 0}
    async with (
        running_proxy(redis_url, config, http=http) as service,
        aiohttp.ClientSession() as session,
    ):
        api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i}", "value": f"v{i}", "qid": 0} for i in range(20)])
        batch = await pull(api, topic="t", max_batch=12, linger_ms=5000)
        offsets = [m["offset"] for m in batch["messages"]]
        # ten acked, one failed (a dead letter at once), one left in flight
        results = [{"topic": "t", "qid": batch["qid"], "success": offsets[:10], "fail": offsets[10:11]}]
        assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": results}))[0] == 200

        async def charted() -> bool:
            history = await admin(api, "/admin/groups/g/lag-history")
            samples, local = history["topics"].get("t", []), history["local"].get("t", [])
            return (len(samples) >= 2 and samples[-1][5] == 1 and any(row[5] is not None for row in local)
                    and local[-1][3] == 1)

        await eventually(charted, timeout_s=30)  # a sample every 5 s
        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        charts = page.locator("#charts [data-topic=t]")
        await expect(charts.locator(".chart-card")).to_have_count(6)
        for chart in ("rates", "lag", "age", "keys", "dead"):
            await expect(charts.locator(f"[data-chart={chart}] :is(polyline, circle)").first).to_be_attached()
        await expect(charts.locator("[data-chart=dead] .legend")).to_have_text("now 1")
        await expect(charts.locator("[data-chart=keys] .legend")).to_contain_text("in flight 1")
        await expect(charts.locator("[data-chart=e2e] .legend")).to_contain_text(re.compile(r"p50 \d"))
        await expect(charts.locator("[data-chart=lag] .legend")).to_have_text(re.compile(r"^now \d+$"))
        await screenshot(page, "console-charts")
        page_width, window_width, *parts = await page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth,"
            " ...[...document.querySelectorAll('table, .chart-grid')]"
            "   .map((node) => [node.id || node.className, node.scrollWidth])]")
        assert window_width == 1280 and page_width <= window_width, (page_width, parts)
        assert max(width for _, width in parts) <= window_width, parts
        await watched.assert_nothing_ran()
        assert not watched.errors, watched.errors
