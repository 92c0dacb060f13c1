"""End-to-end latency on a real proxy process: ``ddmq_end_to_end_seconds`` (produce to first delivery,
produce to ack) and ``ddmq_message_attempts`` checked against the times this test measured itself.

For each message the test knows when it produced it (before and after the producer's call, whose
clock stamps ``ts``), when the pull that first delivered it was sent and answered, and when the
``submit`` that acked it was sent and answered: so each observation lies in a known interval. The
histogram's cumulative count at every bound must then lie between the messages surely at or below
the bound before it and those possibly at or below the bound after it (one bucket's width either
way), and its count must be the number of messages exactly. Acks come after a controlled delay (so
the acked stage lands apart from the delivered one), and one message is failed once: it counts once
as delivered and with 2 attempts when acked. Both label modes; every key's messages in order, none lost.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.proxy.engine.end_to_end import LATENCY_BOUNDS_S

from ..support import OrderChecker, ProxyProcess, body
from .test_http_end_to_end import wait_ready

QUEUES = 2
KEYS = 4
PER_KEY = 5
MESSAGES = KEYS * PER_KEY
#: How long the consumer holds each batch before acking it: the acked stage lands a few buckets up.
HOLD_S = 0.3
GROUP = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 30_000,
         "retry_intervals_ms": [50], "max_retry": 3}
#: The message failed once (key k0's first): acked at its second delivery.
FAILED = ("k0", 0)

Interval = tuple[float, float]


def produce(redis_url: str, wave: int) -> dict[tuple[str, int], tuple[float, float]]:
    """One message per key (seq ``wave``); (key, seq) -> the time before and after the producer's call."""
    with Producer(redis_url) as producer:
        before = time.time()
        producer.send_batch("t", [{"key": f"k{k}", "value": body(f"k{k}", wave)} for k in range(KEYS)])
        after = time.time()
    return {(f"k{k}", wave): (before, after) for k in range(KEYS)}


async def consume(port: int, produced: dict[tuple[str, int], tuple[float, float]], redis_url: str,
                  checker: OrderChecker) -> tuple[dict[tuple[str, int], Interval], dict[tuple[str, int], Interval]]:
    """Pull until every message is acked, holding each batch :data:`HOLD_S` before its ack (a
    ``submit``) and failing :data:`FAILED` on its first delivery; a wave of messages is produced after
    each batch until all are. Returns each message's interval of possible first-delivery and ack
    latencies (seconds)."""
    delivered: dict[tuple[str, int], Interval] = {}
    acked: dict[tuple[str, int], Interval] = {}
    waves = 1
    failed_once = False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    async with AsyncProxyClient("127.0.0.1", port) as client:
        while len(acked) < MESSAGES:
            assert loop.time() < deadline, f"not drained: {sorted(set(produced) - set(acked))}"
            sent = time.time()
            response = await client.pull(wire.PullRequest(groupId="g", topic="t", maxBatchSize=8, maxLingerTime=200))
            answered = time.time()
            ok, failed = [], []
            for message in response.messages:
                event = json.loads(message.value)
                name = (event["k"], event["seq"])
                checker.delivered(*name)
                before, after = produced[name]
                delivered.setdefault(name, (sent - after, answered - before))  # the first delivery only
                if name == FAILED and not failed_once:
                    failed_once = True
                    failed.append(message.offset)
                else:
                    ok.append((name, message.offset))
            if not response.messages:
                continue
            await asyncio.sleep(HOLD_S)  # the controlled delay: the consumer "processes" the batch
            result = wire.ConsumeResult(context=response.context, successOffsets=[o for _, o in ok],
                                        failOffsets=failed)
            sent = time.time()
            await client.submit(wire.link_results([result]))
            answered = time.time()
            for name, _ in ok:
                checker.acked(*name)
                before, after = produced[name]
                acked[name] = (sent - after, answered - before)
            if waves < PER_KEY:
                produced.update(await asyncio.to_thread(produce, redis_url, waves))
                waves += 1
    return delivered, acked


def histogram(text: str, name: str, **labels: str) -> tuple[list[tuple[float, float]], float]:
    """The cumulative (le, count) pairs of the samples of histogram ``name`` with ``labels`` (summed
    over any other label), and its count."""
    buckets: dict[float, float] = {}
    count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if not all(sample.labels.get(key) == value for key, value in labels.items()):
                continue
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{name}_count":
                count += sample.value
    return sorted(buckets.items()), count


def check_buckets(buckets: list[tuple[float, float]], intervals: list[Interval]) -> None:
    """Each cumulative count between the intervals surely at or below the previous bound and those
    possibly at or below the next one (a bucket's width of slack for clocks read a moment apart)."""
    bounds = [le for le, _ in buckets]
    assert bounds == [*LATENCY_BOUNDS_S, float("inf")]
    for at, (le, cumulative) in enumerate(buckets):
        below = bounds[at - 1] if at else 0.0
        above = bounds[at + 1] if at + 1 < len(bounds) else float("inf")
        surely = sum(1 for low, high in intervals if high <= below)
        possibly = sum(1 for low, high in intervals if low <= above)
        assert surely <= cumulative <= possibly, (le, cumulative, surely, possibly, sorted(intervals))


@pytest.mark.parametrize("per_queue", [False, True], ids=["per_group", "per_queue"])
async def test_end_to_end_histograms_match_the_times_the_test_measured(
        redis_url: str, tmp_path: Path, per_queue: bool) -> None:
    http_port = free_port()
    proxy = ProxyProcess(tmp_path, redis_url, {"g": {"t": GROUP}}, {"t": {"queues": QUEUES}},
                         http={"enabled": True, "host": "127.0.0.1", "port": http_port},
                         metrics={"per_queue": per_queue}).start()
    base = f"http://127.0.0.1:{http_port}"
    try:
        await wait_ready(base)
        produced = await asyncio.to_thread(produce, redis_url, 0)
        checker = OrderChecker()
        delivered, acked = await consume(proxy.port, produced, redis_url, checker)
        assert checker.violations == [], checker.violations
        assert not checker.missing({f"k{k}": PER_KEY for k in range(KEYS)})
        assert len(delivered) == len(acked) == MESSAGES
        assert checker.deliveries == MESSAGES + 1  # the failed message went out twice
        async with aiohttp.ClientSession() as session:
            async with session.get(base + "/metrics") as response:
                text = await response.text()
            async with session.get(base + "/admin/groups/g") as response:
                view: dict[str, Any] = await response.json()
        labels = {"group": "g", **({"topic": "t"} if per_queue else {})}
        for stage, intervals in (("delivered", delivered), ("acked", acked)):
            buckets, count = histogram(text, "ddmq_end_to_end_seconds", stage=stage, **labels)
            assert count == MESSAGES, (stage, count)  # a redelivery is not a first delivery
            check_buckets(buckets, list(intervals.values()))
        # Held HOLD_S before the ack: the acked stage is that much later than the delivered one.
        assert min(low for low, _ in acked.values()) >= HOLD_S
        attempts, count = histogram(text, "ddmq_message_attempts", outcome="acked", **labels)
        assert count == MESSAGES
        assert dict(attempts)[1.0] == MESSAGES - 1 and dict(attempts)[2.0] == MESSAGES
        # The admin view (the console's and ``ddmq status --http``'s) reads its quantiles off the same buckets.
        (topic,) = view["topics"]
        assert topic["attempts"]["acked"]["count"] == MESSAGES
        for stage, intervals in (("delivered", delivered), ("acked", acked)):
            figures = topic["end_to_end"][stage]
            assert figures["count"] == MESSAGES
            low = _bucket_floor(min(low for low, _ in intervals.values()))
            high = _bucket_ceiling(max(high for _, high in intervals.values()))
            assert low <= figures["p50"] <= figures["p99"] <= high, (stage, figures, low, high)
        # ``ddmq status --http``: the same view, a line per topic.
        status = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "ddmq.client.cli", "status", "--redis", redis_url, "--group", "g",
                             "--http", base], capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        line = next(line for line in status.stdout.splitlines() if line.startswith("  t: to first delivery p50 "))
        assert f"({MESSAGES})" in line and "to ack p50 " in line and "attempts at ack p50 1.0 p99 2.0 " in line, line
    finally:
        assert proxy.stop() == 0, proxy.log()


def _bucket_floor(seconds: float) -> float:
    """The bound below the bucket ``seconds`` falls in (a bucket's width of slack)."""
    bounds = [0.0, *LATENCY_BOUNDS_S]
    inside = next((at for at, bound in enumerate(bounds) if seconds <= bound), len(bounds) - 1)
    return bounds[max(0, inside - 2)]


def _bucket_ceiling(seconds: float) -> float:
    """The bound above the bucket after the one ``seconds`` falls in."""
    bounds = [*LATENCY_BOUNDS_S]
    inside = next((at for at, bound in enumerate(bounds) if seconds <= bound), len(bounds) - 1)
    return bounds[min(len(bounds) - 1, inside + 1)]
