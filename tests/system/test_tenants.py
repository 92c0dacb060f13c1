"""Tenants through a real proxy process (``fair_key``), default ``concurrency`` and ``key_buffer``: one
tenant's backlog six times the read-ahead window, ahead of nine small tenants in its queue and the
topic's other queue. A Thrift client finds every small tenant done within the first 10 % of the big
one's messages; the admin API and ``ddmq status --http`` show the big tenant at its share with its keys
held in Redis; then the proxy is killed with -9 mid-backlog and restarted, an HTTP client drains the
rest, and every message arrives, each key in order (one key's messages name two tenants), with the
committed offsets at the end of every queue."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from ddmq.client import Producer
from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol.net import free_port

from ..support import OrderChecker, ProxyProcess
from .test_hot_key import all_delivered_in_order, pull_until

BIG = "A"
SMALL = [f"t{i}" for i in range(9)]
BACKLOG = 6_000  # six times the default concurrency (1,000), of 12 keys: more than the window at their cap
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100}


def produce(redis_url: str, produced: dict[str, int]) -> list[int]:
    """The big tenant's backlog in queue 0 (one key of it, "shared", alternating with a small tenant),
    then the small tenants (20 keys each), half in queue 0 and half in queue 1; returns the last offset
    of each queue."""
    def message(key: str, tenant: str, qid: int) -> dict[str, object]:
        seq = produced.get(key, 0)
        produced[key] = seq + 1
        return {"key": key, "value": json.dumps({"k": key, "seq": seq, "tenant": tenant}), "qid": qid}

    big = [message(f"a{i % 12}", BIG, 0) for i in range(BACKLOG - 200)]
    big[2_000:2_000] = [message("shared", BIG if i % 2 else SMALL[0], 0) for i in range(200)]
    small = [message(f"{t}-k{i % 20}", t, i % 2) for i in range(40) for t in SMALL]
    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 2)
        for start in range(0, len(big), 500):
            producer.send_batch("t", big[start:start + 500])
        producer.send_batch("t", small)
    return [BACKLOG + len(small) // 2, len(small) // 2]


def shows_the_tenants(redis_url: str, http_url: str) -> None:
    """The admin API and ``ddmq status --http`` show the big tenant with keys held in Redis behind its
    share."""
    with urllib.request.urlopen(http_url + "/admin/groups/g", timeout=30) as answer:
        view = json.load(answer)
    (topic,) = view["topics"]
    rows = {row["tenant"]: row for row in topic["tenants"]}
    big = rows[BIG]
    # Alone, a tenant takes 7/8 of the window (an eighth kept for the next one to show up); past its
    # share once others do, it takes nothing more until it drains under it.
    assert big["held_keys"] > 0 and big["in_memory"] <= 875, rows
    assert big["share"] == int(875 / len(rows)), rows
    assert topic["keys_at_cap"] >= big["held_keys"], topic
    env = {**os.environ, "DDMQ_REDIS": redis_url}
    env.pop("DDMQ_ADMIN_TOKEN", None)
    status = subprocess.run([sys.executable, "-m", "ddmq.client.cli", "status", "--group", "g", "--http", http_url],
                            capture_output=True, text=True, timeout=60, env=env, check=True)
    assert "tenants with the most messages at" in status.stdout, status.stdout
    assert f"  t: {BIG}: " in status.stdout and "key(s) held in Redis" in status.stdout, status.stdout


async def pull_over_http(http_url: str, checker: OrderChecker, epoch: int, produced: dict[str, int],
                         timeout_s: float) -> None:
    """Pull over ``/v1/pull`` and ack (the results of each batch in the next pull) until everything
    produced is acked; the last acks go to ``/v1/ack``."""
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:  # the HTTP server listens a moment after the Thrift one, which start() waits for
            assert time.monotonic() < deadline, "the HTTP server never answered"
            try:
                async with session.get(http_url + "/healthz") as answer:
                    if answer.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
        while checker.missing(produced):
            assert time.monotonic() < deadline, f"not drained: {list(checker.missing(produced).items())[:5]}"
            request = {"group": "g", "topic": "t", "max_batch": 64, "linger_ms": 200, "results": results}
            async with session.post(http_url + "/v1/pull", json=request) as answer:
                assert answer.status == 200, await answer.text()
                batch = await answer.json()
            results = []
            if batch["messages"]:
                for message in batch["messages"]:
                    event = json.loads(message["value_text"])
                    checker.delivered(event["k"], event["seq"], epoch)
                    checker.acked(event["k"], event["seq"], epoch)
                results = [{"topic": "t", "qid": batch["qid"], "success": [m["offset"] for m in batch["messages"]]}]
        if results:
            async with session.post(http_url + "/v1/ack", json={"group": "g", "results": results}) as answer:
                assert answer.status == 200, await answer.text()


@pytest.mark.timeout(240)
async def test_a_big_tenant_through_a_kill_9_holds_back_no_small_one_and_loses_nothing(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    produced: dict[str, int] = {}
    ends = produce(redis_url, produced)
    small = {key: n for key, n in produced.items() if key.startswith("t")}
    checker = OrderChecker()
    config = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "fair_key": "$.tenant"}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port()}
    http_url = f"http://127.0.0.1:{http['port']}"
    proxy = ProxyProcess(tmp_path, redis_url, {"g": {"t": config}}, {"t": {"queues": 2}}, leases=LEASES,
                         http=http).start()

    def big_acked() -> int:
        return sum(n for key, n in checker.acked_upto.items() if key.startswith("a"))

    try:
        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            await pull_until(client, checker, 1, produced, lambda: not checker.missing(small), 120)
        assert big_acked() <= BACKLOG // 10, f"the small tenants were done after {big_acked()} of the big one's"
        # Nobody pulls now, so nothing drains: what the operator sees of the big tenant.
        shows_the_tenants(redis_url, http_url)
        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            await pull_until(client, checker, 1, produced, lambda: big_acked() >= BACKLOG // 4, 120)
        proxy.kill()  # mid-backlog: most of it held in Redis
        proxy.start()
        await pull_over_http(http_url, checker, 2, produced, 180)
        await all_delivered_in_order(checker, produced, redis_client, ends)
        assert proxy.stop() == 0
    finally:
        proxy.stop()
