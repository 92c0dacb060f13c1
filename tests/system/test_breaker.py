"""The breaker on a real proxy process: 2,000 messages produced over 20 s while every handler fails,
then the handlers recover. Two groups read the same topic at once, one dead-lettering exhausted
messages and one parking their keys; with the breaker on, fewer than 1 % of the messages use up a
retry, none is dead-lettered or parked, and every message is delivered (and acked) in its key's order."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import redis

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.actions import recent_actions_sync

from ..support import OrderChecker, ProxyProcess, body, until

MESSAGES = 2000
PRODUCE_S = 20.0
BREAKER = {"enabled": True, "window": 200, "failure_share": 0.5, "min_attempts": 10, "probe": 5, "open_ms": 500,
           "max_open_ms": 2000}
TOPIC = {"actions": ["Order", "PullServer"], "order_key": "KEY", "timeout_ms": 10_000, "max_retry": 2,
         "retry_intervals_ms": [50], "breaker": BREAKER}
GROUPS = {"g_dl": {"t": {**TOPIC, "on_exhausted": "dead_letter"}}, "g_park": {"t": {**TOPIC, "on_exhausted": "park"}}}
_SAMPLE = re.compile(r'^(\w+)\{([^}]*)\} (\S+)$')


def produce_over(redis_url: str, produced: dict[str, int], seconds: float) -> None:
    """MESSAGES keyed messages in 20 even batches over ``seconds``."""
    rng = random.Random(47)
    batches = 20
    with Producer(redis_url) as producer:
        start = time.monotonic()
        for i in range(batches):
            batch = []
            for _ in range(MESSAGES // batches):
                key = f"key-{rng.randrange(40)}"
                seq = produced.get(key, 0)
                produced[key] = seq + 1
                batch.append({"key": key, "value": body(key, seq)})
            producer.send_batch("t", batch)
            time.sleep(max(0.0, start + (i + 1) * seconds / batches - time.monotonic()))


async def listening(port: int) -> None:
    """The proxy is up once its Thrift port listens; its HTTP server may open a moment later."""
    deadline = time.monotonic() + 20
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            await asyncio.sleep(0.05)
            continue
        writer.close()
        return


async def metrics(port: int) -> dict[tuple[str, str], float]:
    """(name, group) -> value, summed over the other labels (a ``state`` label goes with the name:
    ``ddmq_keys:parked``)."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        sample = _SAMPLE.match(line)
        if sample is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', sample[2]))
        key = (sample[1] + (f":{labels['state']}" if "state" in labels else ""), labels.get("group", ""))
        found[key] = found.get(key, 0.0) + float(sample[3])
    return found


async def consume(port: int, group: str, checker: OrderChecker, failing: asyncio.Event, stop: asyncio.Event) -> int:
    """Pull and answer until ``stop``: fail every message while ``failing`` is set, then ack. Returns the
    number of deliveries."""
    results: list[wire.ConsumeResult] = []
    deliveries = 0
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=10) as client:
        while not stop.is_set():
            request = wire.PullRequest(groupId=group, topic="t", maxBatchSize=32, maxLingerTime=100,
                                       result=wire.link_results(results))
            response = await client.pull(request)
            results = []
            ok, failed = [], []
            for message in response.messages:
                event = json.loads(message.value)
                checker.delivered(event["k"], event["seq"])
                deliveries += 1
                if failing.is_set():
                    failed.append(message.offset)
                else:
                    checker.acked(event["k"], event["seq"])
                    ok.append(message.offset)
            if ok or failed:
                results = [wire.ConsumeResult(context=response.context, successOffsets=ok, failOffsets=failed)]
        if results:
            await client.pull(wire.PullRequest(groupId=group, topic="t", maxBatchSize=1, maxLingerTime=0,
                                               result=wire.link_results(results)))
    return deliveries


async def test_a_failure_storm_opens_the_breaker_and_costs_no_retries_nor_order(tmp_path: Path,
                                                                                redis_url: str) -> None:
    http_port = free_port()
    proxy = ProxyProcess(tmp_path, redis_url, GROUPS, {"t": {"queues": 4}},
                         http={"enabled": True, "port": http_port, "host": "127.0.0.1"})
    proxy.start()
    try:
        await listening(http_port)
        produced: dict[str, int] = {}
        checkers = {group: OrderChecker() for group in GROUPS}
        failing, stop = asyncio.Event(), asyncio.Event()
        failing.set()
        consumers = [asyncio.create_task(consume(proxy.port, group, checkers[group], failing, stop))
                     for group in GROUPS]
        producing = asyncio.create_task(asyncio.to_thread(produce_over, redis_url, produced, PRODUCE_S))
        seen_open: set[str] = set()
        while not producing.done():
            figures = await metrics(http_port)
            seen_open |= {group for group in GROUPS if figures.get(("ddmq_breaker_open", group), 0) > 0}
            await asyncio.sleep(0.5)
        await producing
        assert seen_open == set(GROUPS), "the breakers never showed open"
        status = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "ddmq.client.cli", "status", "--group", "g_dl"],
            capture_output=True, text=True, timeout=60, env={**os.environ, "DDMQ_REDIS": redis_url})
        assert status.returncode == 0 and "BREAKER " in status.stdout, status
        assert "topic t on e2e-proxy" in status.stdout, status
        failing.clear()  # the downstream is back

        def delivered() -> bool:
            return all(not checker.missing(produced) for checker in checkers.values())

        await until("every message acked after the recovery", delivered, 30)
        stop.set()
        deliveries = await asyncio.gather(*consumers)
        figures = await metrics(http_port)
        for group, checker in checkers.items():
            retried = figures.get(("ddmq_messages_retried_total", group), 0)
            print(f"{group}: {deliveries[list(GROUPS).index(group)]} deliveries of {MESSAGES} messages, "
                  f"{retried:.0f} retried, {figures.get(('ddmq_breaker_transitions_total', group), 0):.0f} "
                  f"breaker transitions, {checker.duplicates} redeliveries of acked messages")
            assert checker.violations == [], (group, checker.violations[:5])
            assert retried < MESSAGES / 100, (group, retried)
            assert figures.get(("ddmq_messages_dead_lettered_total", group), 0) == 0, group
            assert figures.get(("ddmq_breaker_open", group), 1) == 0, group  # closed again
            assert figures.get(("ddmq_breaker_transitions_total", group), 0) >= 3, group  # open, half-open, closed
        assert all(d > MESSAGES for d in deliveries)
        assert figures.get(("ddmq_keys:parked", "g_park"), 0) == 0  # no key parked
        log = proxy.log()
        assert "g_dl/t: breaker open" in log and "g_park/t: breaker closed" in log
        with redis.Redis.from_url(redis_url) as client:
            for group in GROUPS:
                done = {action.action for action in recent_actions_sync(client, 1000, group)}
                assert {"breaker open", "breaker close"} <= done, (group, done)
            assert client.hlen(keys.breakers("g_dl")) == 0  # closed: no longer shown
    finally:
        proxy.stop()
