"""P2b, a hot key that cannot keep up: ``python bench/hot_backlog.py [--seconds 120] [--json PATH]``.

One topic of 2 queues, default group settings (``concurrency`` 1,000, ``key_buffer`` 100), a real
proxy process and Redis. A producer thread writes, every 10 ms for ``--seconds``:

- ``--hot-rate`` / 100 messages of key ``hot`` (1,000 msg/s) into queue 0;
- ``--other-rate`` / 100 messages of 1,000 other keys (1,000 msg/s), each key in a fixed queue, half
  of them in the hot key's queue.

An ``AsyncPullConsumer`` (16 pullers, one message per key per pull) handles each message in
``--work-ms`` (1 ms). The hot key costs a round trip per message, so it cannot keep up and its
backlog grows all run long (past 50,000 at the default length). The cases, each on a fresh topic:

- ``others only``: the other keys alone;
- ``hot only``: the hot key alone, its backlog growing the same way (its serial limit);
- ``hot and others``: both.

Printed per case: the other keys' produce-to-handled latency (p50, p99), the hot key's handled
messages per second and its backlog at the end, the proxy's peak RSS and its trend over the second
half of the run. The targets (issue 45): the others' p99 with the hot key <= 2 x without it; the hot
key's throughput >= 0.9 x alone; proxy RSS <= 150 MB and flat while the backlog grows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))

from bench.scenarios.memory import RssSampler, trend
from ddmq.client import AsyncPullConsumer, ConsumedMessage, OutgoingMessage, Producer
from tests.harness.stack import ProxyRun, RedisServer

HOT = "hot"
OTHERS = 1_000
QUEUES = 2
TICK_S = 0.01
WARMUP_S = 5.0  # the first seconds' figures are left out: pullers connecting, the first reads
CASES = ("others only", "hot only", "hot and others")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class Load:
    """The producer thread: per tick its share of hot and other messages, until ``stop``."""

    def __init__(self, redis_url: str, topic: str, hot_rate: int, other_rate: int) -> None:
        self.redis_url, self.topic = redis_url, topic
        self.hot_per_tick, self.other_per_tick = hot_rate * TICK_S, other_rate * TICK_S
        self.hot_produced = 0
        self.behind_s = 0.0  # how far the producer fell behind its schedule, at most
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        rng = random.Random(7)
        hot_due = other_due = 0.0
        with Producer(self.redis_url) as producer:
            start = time.perf_counter()
            tick = 0
            while not self._stop.is_set():
                hot_due += self.hot_per_tick
                other_due += self.other_per_tick
                batch = [OutgoingMessage(b"{}", HOT, qid=0) for _ in range(int(hot_due))]
                for _ in range(int(other_due)):
                    key = rng.randrange(OTHERS)
                    batch.append(OutgoingMessage(b"{}", f"k{key}", qid=key % QUEUES))
                self.hot_produced += int(hot_due)
                hot_due -= int(hot_due)
                other_due -= int(other_due)
                if batch:
                    producer.send_batch(self.topic, batch)
                tick += 1
                late = time.perf_counter() - (start + tick * TICK_S)
                self.behind_s = max(self.behind_s, late)
                if late < 0:
                    self._stop.wait(-late)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def consume(port: int, group: str, load: Load, seconds: float, work_ms: float) -> dict[str, Any]:
    latencies: list[float] = []
    hot_times: list[float] = []
    hot_handled = 0  # warm-up included: what the backlog at the end counts
    started = time.time()

    async def handle(message: ConsumedMessage) -> bool:
        nonlocal hot_handled
        await asyncio.sleep(work_ms / 1000)
        now = time.time()
        if message.key == HOT:
            hot_handled += 1
        if now - started < WARMUP_S:
            return True
        if message.key == HOT:
            hot_times.append(now)
        else:
            latencies.append(now - message.produce_ms / 1000)
        return True

    async with AsyncPullConsumer(f"127.0.0.1:{port}", group, handle, concurrency=16) as consumer:
        waiter = asyncio.ensure_future(consumer.wait())
        await asyncio.sleep(seconds)
        load.stop()
        consumer.stop()
        await waiter
    window = seconds - WARMUP_S
    quarter = window / 4
    by_quarter = [0, 0, 0, 0]
    for at in hot_times:
        by_quarter[min(3, int((at - started - WARMUP_S) / quarter))] += 1
    return {
        "others_handled": len(latencies),
        "others_p50_s": round(_percentile(latencies, 0.5), 4), "others_p99_s": round(_percentile(latencies, 0.99), 4),
        "hot_msg_s": round(len(hot_times) / window, 1),
        "hot_msg_s_by_quarter": [round(n / quarter, 1) for n in by_quarter],
        "hot_backlog_end": load.hot_produced - hot_handled,
    }


def run_case(redis_url: str, name: str, seconds: float, hot_rate: int, other_rate: int,
             work_ms: float) -> dict[str, Any]:
    slug = name.replace(" ", "-")
    topic, group = f"p2b-{slug}", f"cg-p2b-{slug}"
    with Producer(redis_url) as producer:
        producer.ensure_topic(topic, QUEUES)
    sections = {"topics": {topic: {"queues": QUEUES}}, "groups": {group: {topic: {}}}}
    with ProxyRun(redis_url, **sections) as proxy:
        sampler = RssSampler(proxy.pid).start()
        load = Load(redis_url, topic, hot_rate if "hot" in name else 0,
                    other_rate if "others" in name else 0).start()
        row = asyncio.run(consume(proxy.port, group, load, seconds, work_ms))
        samples = sampler.stop()
    half = samples[len(samples) // 2:]
    row.update({
        "case": name, "seconds": seconds, "hot_rate": hot_rate if "hot" in name else 0,
        "other_rate": other_rate if "others" in name else 0, "work_ms": work_ms,
        "producer_behind_s": round(load.behind_s, 3),
        "proxy_rss_peak_mb": round(max((mb for _, mb in samples), default=0.0), 1),
        "proxy_rss_trend_mb_min": round(trend(half), 2),
    })
    if "hot" not in name:
        row["hot_msg_s"] = row["hot_backlog_end"] = row["hot_msg_s_by_quarter"] = None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="how long each case produces")
    parser.add_argument("--hot-rate", type=int, default=1_000, help="the hot key's messages per second")
    parser.add_argument("--other-rate", type=int, default=1_000, help="the other keys' messages per second")
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--only", help="run only the cases whose name contains this")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with RedisServer() as redis_server:
        for name in CASES:
            if args.only and args.only not in name:
                continue
            rows.append(run_case(redis_server.url, name, args.seconds, args.hot_rate, args.other_rate, args.work_ms))
            print(f"  {name}: {rows[-1]}", file=sys.stderr)
    by_case = {row["case"]: row for row in rows}
    print(f"{'case':<16} {'others p50':>11} {'others p99':>11} {'hot msg/s':>10} {'hot backlog':>12} "
          f"{'RSS MB':>7} {'MB/min':>7}")
    for row in rows:
        hot = f"{row['hot_msg_s']:>10.1f} {row['hot_backlog_end']:>12,}" if row["hot_msg_s"] is not None \
            else f"{'-':>10} {'-':>12}"
        print(f"{row['case']:<16} {row['others_p50_s']:>10.4f}s {row['others_p99_s']:>10.4f}s {hot} "
              f"{row['proxy_rss_peak_mb']:>7.1f} {row['proxy_rss_trend_mb_min']:>7.2f}")
    both, alone, others = by_case.get("hot and others"), by_case.get("hot only"), by_case.get("others only")
    summary: dict[str, Any] = {}
    if both and others and others["others_p99_s"]:
        summary["others_p99_ratio"] = round(both["others_p99_s"] / others["others_p99_s"], 2)
        print(f"P2b: the others' p99 with the hot key / without = {summary['others_p99_ratio']:.2f}; target <= 2: "
              f"{'PASS' if summary['others_p99_ratio'] <= 2 else 'MISS'}")
    if both and alone and alone["hot_msg_s"]:
        summary["hot_throughput_ratio"] = round(both["hot_msg_s"] / alone["hot_msg_s"], 3)
        print(f"P2b: the hot key's msg/s with the others / alone = {summary['hot_throughput_ratio']:.3f}; "
              f"target >= 0.9: {'PASS' if summary['hot_throughput_ratio'] >= 0.9 else 'MISS'}")
    if both:
        summary["rss_peak_mb"] = both["proxy_rss_peak_mb"]
        print(f"P2b: proxy RSS peak {both['proxy_rss_peak_mb']:.1f} MB (target <= 150), trend over the second "
              f"half {both['proxy_rss_trend_mb_min']:+.2f} MB/min, hot backlog at the end "
              f"{both['hot_backlog_end']:,} (past 50,000: {'yes' if both['hot_backlog_end'] > 50_000 else 'no'})")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
