"""P4 latency: produce time to delivery at the client, proxy vs a raw ``XREAD BLOCK`` reader.

The harness produces 1,000 msg/s steadily (quick: 10 s, full: 30 s) in 10 ms ticks of 10 messages,
on a fixed schedule, each body stamped with ``time.time()`` just before its batch is sent. In the
client process, at the same time and on the same streams, long-polling proxy pullers (8 connections,
batch 64, ``maxLingerTime`` 1000 ms, acks on the next pull) and raw readers (one connection per
stream, ``XREAD BLOCK 1000 COUNT 64``) note ``time.time() - ts`` as each message arrives. The first
second of messages is warm-up and not counted. The figure is the larger of the two ratios
proxy p50 / raw p50 and proxy p99 / raw p99.

P4s measures the same on a fresh Redis and proxy with each side in a client process of its own. In
P4's one process, the proxy's replies, which come later than Redis's by construction, wait while the
event loop handles the raw readers' replies of the same tick; P4s shows the proxy's hop without that.
"""

from __future__ import annotations

import random
import time
from contextlib import ExitStack
from typing import Any

from bench.clients import LatencyPair, latency_pair
from bench.dataset import QUEUES, TOPIC, body, key_names, streams
from bench.report import Row, Target
from bench.scenarios.base import Settings, log, proxy_sections
from ddmq.protocol.produce.producer import Producer
from tests.harness.clientproc import ClientProcess
from tests.harness.stack import ProxyRun, RedisServer

__all__ = ["latency"]

RATE = 1000
TICK_S = 0.01
KEYS = 1000


def produce_steadily(redis_url: str, rate: int, seconds: float, seed: int = 4) -> dict[str, Any]:
    """``rate`` msg/s for ``seconds`` on a fixed schedule; bodies carry ``n`` (0, 1, ...) and ``ts``."""
    rng = random.Random(seed)
    names = key_names(KEYS)
    per_tick = max(1, round(rate * TICK_S))
    ticks = round(seconds / TICK_S)
    per_key: dict[str, int] = {}
    worst_lag_s = 0.0
    n = 0
    with Producer(redis_url) as producer:
        producer.ensure_topic(TOPIC, QUEUES)
        start = time.monotonic()
        for tick in range(ticks):
            due = start + tick * TICK_S
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            else:
                worst_lag_s = max(worst_lag_s, -wait)
            batch = []
            for _ in range(per_tick):
                key = rng.choice(names)
                seq = per_key[key] = per_key.get(key, -1) + 1
                batch.append({"key": key, "value": body(key, seq, n=n)})
                n += 1
            producer.send_batch(TOPIC, batch)
        elapsed = time.monotonic() - start
    return {"messages": n, "rate": n / elapsed, "worst_lag_ms": round(worst_lag_s * 1000, 2)}


def latency(settings: Settings) -> list[Row]:
    seconds = settings.seconds(10, 30)
    params = {"rate": RATE, "seconds": seconds, "keys": KEYS, "warmup_s": 1, "linger_ms": 1000, "connections": 8}
    rows = []
    for row_id, what, processes in (
        ("P4", "latency p50/p99 (ratio: the worse one)", [("proxy", "raw")]),
        ("P4s", "latency p50/p99, each side in its own client process", [("proxy",), ("raw",)]),
    ):
        result, produced = _measure(seconds, processes)
        proxy_stats, raw_stats = result["proxy"], result["raw"]
        p50 = proxy_stats["p50_ms"] / raw_stats["p50_ms"]
        p99 = proxy_stats["p99_ms"] / raw_stats["p99_ms"]
        data = {
            "ratio_p50": round(p50, 3),
            "ratio_p99": round(p99, 3),
            "proxy_ms": proxy_stats,
            "baseline_ms": raw_stats,
            "produced": produced,
            "client_cpu_s": round(result["client_cpu_s"], 2),
        }
        rows.append(Row(
            row_id, what,
            f"{proxy_stats['p50_ms']:.2f}/{proxy_stats['p99_ms']:.2f} ms",
            f"{raw_stats['p50_ms']:.2f}/{raw_stats['p99_ms']:.2f} ms",
            max(p50, p99), Target("<=", 3), {**params, "client_processes": len(processes)}, data,
        ))
    return rows


def _measure(seconds: float, processes: list[tuple[str, ...]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One P4 measurement on a Redis and a proxy of its own: the client processes (each running the
    sides named), the produced schedule, and the latencies of both sides."""
    expected = round(RATE * seconds)
    group = "cg-latency"
    config = {"actions": ["Order", "PullServer"], "order_key": "KEY"}
    with RedisServer() as redis_server:
        with Producer(redis_server.url) as producer:
            producer.ensure_topic(TOPIC, QUEUES)
        with ProxyRun(redis_server.url, **proxy_sections(group, **config)) as proxy, ExitStack() as stack:
            loads = []
            for sides in processes:
                spec = LatencyPair(proxy.port, group, redis_server.url, tuple(streams()), expected, warmup=RATE,
                                   sides=sides)
                loads.append(stack.enter_context(ClientProcess(latency_pair, spec)))
            for load in loads:
                load.wait_ready(60)
            time.sleep(0.5)  # the pullers' first long polls are parked by now
            how = "side by side" if len(loads) == 1 else "in a process each"
            log(f"P4: producing {RATE} msg/s for {seconds:g}s; proxy pullers and XREAD readers {how}")
            produced = produce_steadily(redis_server.url, RATE, seconds)
            results = [load.result(60) for load in loads]
    merged: dict[str, Any] = {"client_cpu_s": sum(r["client_cpu_s"] for r in results)}
    for sides, result in zip(processes, results, strict=True):
        for side in sides:
            merged[side] = result[side]
    return merged, produced
