"""P2t, tenants: ``python bench/tenants.py [--messages 200000] [--json PATH]``.

One topic of 4 queues, order key ``$.k``, a real proxy process and Redis. Tenant ``A`` produces 90 %
of ``--messages``, nine small tenants the rest, interleaved at random (A over 1,000 keys, each small
tenant over 50); a producer writes them as fast as it can while a ``PullConsumer`` with ``--workers``
threads (64) handles each in ``--work-ms`` (1 ms), so a backlog builds. Printed per case: the small
tenants' produce-to-handled latency (p50, p99), when the last small message and the last of all were
handled, and the proxy's peak RSS. The cases:

- ``small only``: the nine small tenants' messages alone (the same ones, ``fair_key`` on);
- ``with A, fair_key``: everything, ``fair_key: $.tenant``;
- ``with A, no tenants``: everything, without ``fair_key`` (the proxy before tenants).

The target (issue 45): the small tenants' p99 with A and ``fair_key`` at most 2 x their p99 alone.
"""

from __future__ import annotations

import argparse
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

from bench.profiler import Profiler
from bench.scenarios.memory import RssSampler
from ddmq.client import OutgoingMessage, Producer, PullConsumer
from tests.harness.stack import ProxyRun, RedisServer

SMALL = [f"t{i}" for i in range(9)]
QUEUES = 4


def workload(messages: int, with_big: bool, seed: int = 7) -> list[OutgoingMessage]:
    """The messages, in production order: the big tenant's share 90 %, the rest the small tenants'."""
    rng = random.Random(seed)
    seqs: dict[str, int] = {}
    out = []
    for _ in range(messages):
        big = rng.random() < 0.9
        tenant = "A" if big else rng.choice(SMALL)
        key = f"a{rng.randrange(1000)}" if big else f"{tenant}-k{rng.randrange(50)}"
        seq = seqs.get(key, 0)
        seqs[key] = seq + 1
        if big and not with_big:
            continue
        out.append(OutgoingMessage(json.dumps({"k": key, "seq": seq, "tenant": tenant}), key))
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def run_case(redis_url: str, name: str, messages: list[OutgoingMessage], fair: bool, workers: int,
             work_ms: float, profile: Path | None = None) -> dict[str, Any]:
    slug = name.replace(" ", "-").replace(",", "")
    topic, group = f"tenants-{slug}", f"cg-{slug}"
    small_total = sum(1 for m in messages if '"tenant": "A"' not in str(m.value))
    seen: set[tuple[int, int]] = set()
    latencies: list[float] = []
    marks: dict[str, float] = {}
    lock = threading.Lock()
    finished = threading.Event()
    started = 0.0

    def handle(message: Any) -> bool:
        time.sleep(work_ms / 1000)
        done_ms = time.time() * 1000
        small = '"tenant": "A"' not in message.value.decode()
        with lock:
            if (message.qid, message.offset) in seen:
                return True
            seen.add((message.qid, message.offset))
            if small:
                latencies.append((done_ms - message.produce_ms) / 1000)
                if len(latencies) == small_total:
                    marks["small_done"] = time.perf_counter() - started
            if len(seen) == len(messages):
                marks["all_done"] = time.perf_counter() - started
                finished.set()
        return True

    settings: dict[str, Any] = {"order_key": "$.k"}
    if fair:
        settings["fair_key"] = "$.tenant"
    sections = {"topics": {topic: {"queues": QUEUES}}, "groups": {group: {topic: settings}}}
    profiler = Profiler(profile, slug) if profile is not None else None
    with ProxyRun(redis_url, profiler=profiler, **sections) as proxy, Producer(redis_url) as producer:
        producer.ensure_topic(topic, QUEUES)
        sampler = RssSampler(proxy.pid).start()
        consumer = PullConsumer(f"127.0.0.1:{proxy.port}", group, handle, threads=workers)
        with consumer:
            started = time.perf_counter()
            for start in range(0, len(messages), 500):
                producer.send_batch(topic, messages[start:start + 500])
            produced_s = time.perf_counter() - started
            if not finished.wait(900):
                raise SystemExit(f"{name}: not done in 900 s: {len(seen)} of {len(messages)}")
        rss = [mb for _, mb in sampler.stop()]
    if proxy.profile is not None:
        print(f"  {name}: profile {proxy.profile.output}; most self time: {proxy.profile.top_self}", file=sys.stderr)
    return {
        "case": name, "messages": len(messages), "small": small_total, "workers": workers, "work_ms": work_ms,
        "produced_s": round(produced_s, 2), "small_done_s": round(marks["small_done"], 2),
        "all_done_s": round(marks["all_done"], 2),
        "small_p50_s": round(_percentile(latencies, 0.5), 3), "small_p99_s": round(_percentile(latencies, 0.99), 3),
        "proxy_rss_peak_mb": round(max(rss, default=0.0), 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--work-ms", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--profile", type=Path, help="profile each case's proxy (py-spy or pyinstrument) into DIR")
    parser.add_argument("--only", help="run only the cases whose name contains this")
    args = parser.parse_args()
    everything = workload(args.messages, True)
    cases = [("small only", workload(args.messages, False), True), ("with A, fair_key", everything, True),
             ("with A, no tenants", everything, False)]
    rows = []
    with RedisServer() as redis_server:
        for name, messages, fair in cases:
            if args.only and args.only not in name:
                continue
            rows.append(run_case(redis_server.url, name, messages, fair, args.workers, args.work_ms, args.profile))
            print(f"  {name}: {rows[-1]}", file=sys.stderr)
    alone = rows[0]["small_p99_s"] if rows and rows[0]["case"] == "small only" else 0.0
    print(f"{'case':<20} {'msgs':>8} {'produced':>9} {'small p50':>10} {'small p99':>10} {'x alone':>8} "
          f"{'small done':>11} {'all done':>9} {'RSS MB':>7}")
    for row in rows:
        row["p99_vs_alone"] = round(row["small_p99_s"] / alone, 2) if alone else None
        ratio = f"{row['p99_vs_alone']:.2f}" if row["p99_vs_alone"] is not None else "-"
        print(f"{row['case']:<20} {row['messages']:>8} {row['produced_s']:>8.1f}s {row['small_p50_s']:>9.3f}s "
              f"{row['small_p99_s']:>9.3f}s {ratio:>8} {row['small_done_s']:>10.1f}s "
              f"{row['all_done_s']:>8.1f}s {row['proxy_rss_peak_mb']:>7.1f}")
    fair = next((row["p99_vs_alone"] for row in rows if row["case"] == "with A, fair_key"), None)
    if fair is not None:
        print(f"P2t: small tenants' p99 with A (fair_key) / alone = {fair:.2f}; target <= 2: "
              f"{'PASS' if fair <= 2 else 'MISS'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
