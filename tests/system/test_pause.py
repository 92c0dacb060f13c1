"""``ddmq groups pause|resume`` across two real proxy processes and a restart of one: nothing is handed
out while the group is paused (an ack of what was out before is taken), ``ddmq status`` says so, and
``--for`` resumes by itself, after which every message arrives in its key's order."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import redis
from prometheus_client.parser import text_string_to_metric_families

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys

from ..support import OrderChecker, ProxyProcess, check_and_ack, produce_keyed, until

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP = {"t": {"actions": ["Order", "PullServer"], "order_key": "KEY", "timeout_ms": 60_000, "max_retry": 3}}
LEASES = {"ttl_ms": 2000, "renew_ms": 500, "claim_interval_ms": 200, "handoff_drain_ms": 500}


def ddmq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDMQ_REDIS": redis_url}
    return subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60, env=env)


async def pull(proxy: ProxyProcess, results: list[wire.ConsumeResult] | None = None,
               linger_ms: int = 200) -> wire.PullResponse:
    async with AsyncProxyClient("127.0.0.1", proxy.port, timeout_s=10) as client:
        request = wire.PullRequest(groupId="g", topic="t", maxBatchSize=16, maxLingerTime=linger_ms,
                                   result=wire.link_results(results or []))
        return await client.pull(request)


async def test_pause_holds_every_proxy_through_a_restart_and_for_resumes_in_order(tmp_path: Path,
                                                                                   redis_url: str) -> None:
    proxies = [ProxyProcess(tmp_path / name, redis_url, {"g": GROUP}, {"t": {"queues": 4}}, instance_id=name,
                            leases=LEASES) for name in ("pa", "pb")]
    for proxy in proxies:
        proxy.start()
    a, b = proxies
    try:
        produced: dict[str, int] = {}
        produce_keyed(redis_url, 200, produced, random.Random(47), keys=20)
        checker = OrderChecker()

        out: list[tuple[ProxyProcess, wire.PullResponse]] = []

        async def some_out() -> None:
            for proxy in proxies:
                response = await pull(proxy)
                if response.messages:
                    out.append((proxy, response))
                    return

        deadline = time.monotonic() + 20
        while not out:  # a batch handed out before the pause, answered while paused
            assert time.monotonic() < deadline, "nothing delivered before the pause"
            await some_out()
        holder, held = out[0]
        for message in held.messages:
            checker.delivered(message.key, json.loads(message.value)["seq"], 0)

        paused = ddmq(redis_url, "groups", "pause", "g")
        assert paused.returncode == 0 and "g: PAUSED: every topic, by " in paused.stdout, paused
        await until("both proxies paused within a heartbeat",
                    lambda: all("g paused by" in proxy.log() for proxy in proxies), 5)

        acked = await pull(holder, check_and_ack(held, checker, 0), linger_ms=0)
        assert not acked.messages  # the ack is taken, nothing new handed out

        async def nothing_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for proxy in proxies:
                    response = await pull(proxy, linger_ms=300)
                    assert not response.messages, f"{proxy.INSTANCE_ID} delivered while paused"

        await nothing_for(1.5)
        b.stop()
        b.start()
        await nothing_for(2.0)  # b restarted under the pause, a took and gave back b's queues
        status = ddmq(redis_url, "status", "--group", "g")
        assert status.returncode == 0 and status.stdout.startswith("PAUSED: every topic, by "), status

        started = time.monotonic()
        timed = ddmq(redis_url, "groups", "pause", "g", "--for", "1s")
        assert timed.returncode == 0 and "(in " in timed.stdout, timed
        first: float | None = None
        results: dict[int, list[wire.ConsumeResult]] = {id(a): [], id(b): []}
        deadline = time.monotonic() + 30
        while checker.missing(produced):
            assert time.monotonic() < deadline, f"not delivered after the pause ended: {checker.missing(produced)}"
            for proxy in proxies:
                response = await pull(proxy, results[id(proxy)])
                results[id(proxy)] = check_and_ack(response, checker, 1)
                if response.messages and first is None:
                    first = time.monotonic()
        for proxy in proxies:
            await pull(proxy, results[id(proxy)], linger_ms=0)
        assert first is not None and first - started >= 0.9, "delivered before --for ran out"
        assert checker.violations == [] and checker.missing(produced) == {}
        with redis.Redis.from_url(redis_url) as client:
            assert client.hlen(keys.paused("g")) == 0  # the ended pause is gone
        resumed = ddmq(redis_url, "groups", "resume", "g")
        assert resumed.returncode == 0 and "g: was not paused" in resumed.stdout, resumed
    finally:
        for proxy in proxies:
            proxy.stop()


async def test_a_deadline_that_runs_out_while_paused_counts_no_attempt_and_the_key_goes_on_in_order(
        tmp_path: Path, redis_url: str) -> None:
    """``max_retry: 0``: a timeout that counted its attempt would dead-letter the message. Held by a
    client past its ``timeout_ms`` while the group is paused, it waits instead, and after the resume
    it and its key's later messages arrive in order; nothing is dead-lettered."""
    http_port = free_port()
    group = {"t": {**GROUP["t"], "timeout_ms": 1000, "max_retry": 0}}
    proxy = ProxyProcess(tmp_path, redis_url, {"g": group}, {"t": {"queues": 2}}, leases=LEASES,
                         http={"enabled": True, "port": http_port, "host": "127.0.0.1"})
    proxy.start()
    try:
        produced: dict[str, int] = {}
        produce_keyed(redis_url, 40, produced, random.Random(7), keys=4)
        checker = OrderChecker()
        held = wire.PullResponse(messages=[])
        deadline = time.monotonic() + 20
        while not held.messages:
            assert time.monotonic() < deadline, "nothing delivered before the pause"
            held = await pull(proxy)
        for message in held.messages:
            checker.delivered(message.key, json.loads(message.value)["seq"], 0)
        qid = int(held.context.qid)
        pausing = asyncio.create_task(asyncio.to_thread(ddmq, redis_url, "groups", "pause", "g"))
        # Still being worked on until the proxy has read the pause, so the deadlines run out only after it.
        extend = {"group": "g", "results": [{"topic": "t", "qid": qid, "extend": [m.offset for m in held.messages]}]}
        async with aiohttp.ClientSession() as session:
            while "g paused by" not in proxy.log():
                async with session.post(f"http://127.0.0.1:{http_port}/v1/ack", json=extend) as answer:
                    assert answer.status == 200, await answer.text()
                await asyncio.sleep(0.2)
        assert (await pausing).returncode == 0
        timed_out = 0.0
        deadline = time.monotonic() + 10
        while timed_out < len(held.messages):  # the held batch's deadlines run out while paused
            assert time.monotonic() < deadline, f"{timed_out} of {len(held.messages)} timed out"
            assert not (await pull(proxy, linger_ms=100)).messages, "delivered while paused"
            timed_out = (await scrape(http_port)).get("ddmq_messages_timed_out_total", 0.0)
        assert ddmq(redis_url, "groups", "resume", "g").returncode == 0
        results: list[wire.ConsumeResult] = []
        deadline = time.monotonic() + 20
        while checker.missing(produced):
            assert time.monotonic() < deadline, f"not delivered after the resume: {checker.missing(produced)}"
            response = await pull(proxy, results)  # the timed-out heads come again, each first in its key
            results = check_and_ack(response, checker, 0)
        await pull(proxy, results, linger_ms=0)
        assert checker.violations == [] and checker.missing(produced) == {}
        figures = await scrape(http_port)
        assert figures.get("ddmq_messages_dead_lettered_total", 0.0) == 0
        assert figures.get("ddmq_messages_retried_total", 0.0) == 0  # no attempt counted, no retry scheduled
    finally:
        proxy.stop()


async def scrape(port: int) -> dict[str, float]:
    """Each metric of the proxy's /metrics, summed over its labels."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found
