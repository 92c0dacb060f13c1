"""The console's key explanation in a real headless Chromium, against a real proxy (in this event loop)
and real HTTP pulls: the "why?" of a parked, a failing and an in-flight key shows its state, head,
client, reason, what comes next and the command; the Blocked keys panel names each key's state as the
Keys panel does. Then every message is delivered, in order per key."""

from __future__ import annotations

import time

from playwright.async_api import BrowserContext, expect

from ddmq.protocol.produce.producer import AsyncProducer

from ..proxy.api.test_explain import AGENT, KEYS, fail, http_proxy, pull, pull_until
from .test_console import Watched, browser, chromium, screenshot

__all__ = ["browser", "chromium"]  # the fixtures, used by name


async def test_console_explains_a_parked_a_failing_and_an_in_flight_key(
    redis_url: str, browser: BrowserContext
) -> None:
    async with http_proxy(redis_url) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": k, "value": f"{k}{n}", "qid": 0} for n in range(3) for k in KEYS])
        first = await pull_until(api, set(KEYS), [])
        second = await pull_until(api, {"p", "f"}, [fail(first["p"], "card declined"), fail(first["f"], "no driver")])
        await pull(api, [fail(second["p"], "card declined again")])

        watched = Watched(await browser.new_page())
        page = watched.page
        await page.goto(f"http://127.0.0.1:{service.http_port}/")
        await expect(page.locator("#main")).to_be_visible()
        states = {"p": "parked", "f": "failing", "i": "in flight"}
        for key, state in states.items():
            # One name per state: both panels say the same of the same key.
            await expect(page.locator(f"#keys tr[data-key={key}] td.state")).to_have_text(state)
            await expect(page.locator(f"#blocked tr[data-key={key}] td.state")).to_have_text(state)

        explained = page.locator("#keys-explain pre")
        await page.locator("#keys tr[data-key=p] button.explain").click()
        await expect(explained).to_have_count(1)
        await expect(explained).to_contain_text("p · qid 0 · read by this proxy: parked since ")
        await expect(explained).to_contain_text(f"head offset {first['p']['offset']}, attempt 2 of 2; 2 waiting")
        await expect(explained).to_contain_text("reason: card declined again")
        await expect(explained).to_contain_text("until an operator acts")
        await expect(explained).to_contain_text("act: ddmq keys retry|skip|resume --group g --topic t --key p")
        await screenshot(page, "console-keys-explain-parked")

        await page.locator("#keys tr[data-key=f] button.explain").click()
        await expect(explained).to_contain_text("f · qid 0 · read by this proxy: failing")
        await expect(explained).to_contain_text(f"({AGENT}) until ")
        await expect(explained).to_contain_text("reason: no driver")
        await expect(explained).to_contain_text("if it fails or times out: the key parks on it")

        await page.locator("#keys tr[data-key=i] button.explain").click()
        await expect(explained).to_contain_text("i · qid 0 · read by this proxy: in flight")
        offset = first['i']['offset']
        await expect(explained).to_contain_text(f"waiting for the ack of offset {offset} from http client")
        await expect(explained).to_contain_text("act: ddmq keys park --group g --topic t --key i")
        await screenshot(page, "console-keys-explain-in-flight")
        await watched.assert_nothing_ran()
        assert not watched.errors, watched.errors

        # Nothing lost, in order per key: p retried from the page, then everything acked.
        await page.locator("#keys tr[data-key=p] button.retry").click()
        await expect(page.locator("#keys-result")).to_contain_text("retry p")
        seen: dict[str, list[str]] = {"p": [], "f": ["f0"], "i": ["i0"]}
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
