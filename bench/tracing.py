"""What tracing costs: ``python bench/tracing.py [--messages 100000] [--rounds 3] [--json PATH]``.

Three tracing modes, each in its own child process (tracing is decided once per process):

- ``off``: ``DDMQ_TRACING=off``, as without the ``otel`` extra;
- ``api``: the API installed and no SDK set up (no exporter): sends and handling open no-op spans,
  messages carry nothing more;
- ``sampled``: the SDK with ``ParentBased(TraceIdRatioBased(0.01))`` and a batch processor into an
  exporter that drops what it gets: every message carries a ``traceparent``, 1 % of traces are recorded.

Per mode, P1's backlog (:func:`bench.dataset.produce_backlog`: 8 queues, 1,000 keys) is produced into
a Redis of its own by a child in that mode (row W: the producer's msg/s), then drained through a fresh
proxy process, per round: by P1's raw Thrift clients (row P1: 8 connections, batch 64, the clock stops
when the commit point reaches the end; the proxy's only extra work is the properties it carries), and
by the SDK's :class:`~ddmq.client.PullConsumer` (row S: 8 threads, batch 64, in a child in that mode,
the clock stops when its processor has seen every message). Rounds alternate the modes; each figure
is the median of its rounds, and the ratio is to ``off`` of the same row (targets: ``api`` ≥ 0.97,
``sampled`` ≥ 0.9).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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

MODES = ("off", "api", "sampled")
TARGETS = {"api": 0.97, "sampled": 0.9}
THREADS = 8
BATCH = 64


def _set_up(mode: str) -> Any:
    """The mode's tracer provider (sampled), before anything of the project is imported."""
    if mode != "sampled":
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    class Drop(SpanExporter):
        spans = 0

        def export(self, spans: Any) -> SpanExportResult:
            Drop.spans += len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.01)))
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    return provider


def _produce_child(redis_url: str, messages: int) -> dict[str, Any]:
    from bench.dataset import produce_backlog

    started = time.perf_counter()
    produce_backlog(redis_url, messages)
    return {"seconds": time.perf_counter() - started}


def _consume_child(port: int, group: str, messages: int) -> dict[str, Any]:
    from bench.dataset import TOPIC
    from ddmq.client import PullConsumer

    seen = 0
    lock, done = threading.Lock(), threading.Event()
    first: list[float] = []

    def handle(message: Any) -> bool:
        nonlocal seen
        with lock:
            if not first:
                first.append(time.perf_counter())
            seen += 1
            if seen >= messages:
                done.set()
        return True

    cpu = time.process_time()
    started = time.perf_counter()
    with PullConsumer(f"127.0.0.1:{port}", group, handle, topic=TOPIC, threads=THREADS, batch_size=BATCH,
                      linger_ms=200):
        if not done.wait(600):
            raise SystemExit(f"only {seen} of {messages} messages within 600 s")
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu_s": time.process_time() - cpu}


def _child(argv: list[str]) -> None:
    mode, kind = argv[0], argv[1]
    provider = _set_up(mode)
    if kind == "produce":
        result = _produce_child(argv[2], int(argv[3]))
    else:
        result = _consume_child(int(argv[2]), argv[3], int(argv[4]))
    if provider is not None:
        provider.shutdown()
    from ddmq.client import tracing

    result["active"] = tracing.ACTIVE
    print(json.dumps(result))


def _run_child(mode: str, *args: object) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("DDMQ_TRACING", None)
    if mode == "off":
        env["DDMQ_TRACING"] = "off"
    done = subprocess.run([sys.executable, __file__, "--child", mode, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["active"] != (mode != "off"):
        raise RuntimeError(f"{mode}: tracing active is {result['active']}; is opentelemetry-api installed?")
    return result


def _p1_drain(redis_server: Any, group: str, messages: int) -> float:
    from bench.scenarios.base import ORDER_KEYS
    from bench.scenarios.throughput import drain_via_proxy

    order_key, actions = ORDER_KEYS["KEY"]
    drained = drain_via_proxy(redis_server, group, messages, {"actions": actions, "order_key": order_key})
    return messages / float(drained.result["committed_s"])


def _sdk_drain(redis_server: Any, mode: str, group: str, messages: int) -> float:
    from bench.scenarios.base import ORDER_KEYS, proxy_sections
    from tests.harness.stack import ProxyRun

    order_key, actions = ORDER_KEYS["KEY"]
    with ProxyRun(redis_server.url, **proxy_sections(group, actions=actions, order_key=order_key)) as proxy:
        result = _run_child(mode, "consume", proxy.port, group, messages)
    return messages / float(result["seconds"])


def measure(messages: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    from tests.harness.stack import RedisServer

    rates: dict[str, dict[str, list[float]]] = {row: {mode: [] for mode in MODES} for row in ("W", "P1", "S")}
    servers = {mode: RedisServer() for mode in MODES}
    try:
        for mode, server in servers.items():
            server.start()
            produced = _run_child(mode, "produce", server.url, messages)
            rates["W"][mode].append(messages / produced["seconds"])
            print(f"W {mode}: {rates['W'][mode][-1]:,.0f} msg/s", file=sys.stderr, flush=True)
        for round_ in range(rounds):
            for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                server = servers[mode]
                rates["P1"][mode].append(_p1_drain(server, f"cg-p1-{mode}-{round_}", messages))
                rates["S"][mode].append(_sdk_drain(server, mode, f"cg-sdk-{mode}-{round_}", messages))
                print(f"round {round_} {mode}: P1 {rates['P1'][mode][-1]:,.0f}, SDK {rates['S'][mode][-1]:,.0f} msg/s",
                      file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return rates


def table(rates: dict[str, dict[str, list[float]]]) -> list[dict[str, Any]]:
    rows = []
    for row, by_mode in rates.items():
        base = statistics.median(by_mode["off"])
        for mode in MODES:
            median = statistics.median(by_mode[mode])
            entry: dict[str, Any] = {
                "row": row + {"off": "", "api": "o", "sampled": "o-sampled"}[mode], "mode": mode,
                "msgs_per_s": round(median), "runs": [round(r) for r in by_mode[mode]],
                "ratio": round(median / base, 3),
            }
            if mode in TARGETS:
                entry["target"] = f">= {TARGETS[mode]}"
                entry["verdict"] = "PASS" if median / base >= TARGETS[mode] else "MISS"
            rows.append(entry)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from ddmq.protocol.native import hot_path

    rows = table(measure(args.messages, args.rounds))
    print(f"{'row':<13} {'mode':<8} {'msg/s':>9} {'ratio':>6}  target  runs")
    for entry in rows:
        print(f"{entry['row']:<13} {entry['mode']:<8} {entry['msgs_per_s']:>9,} {entry['ratio']:>6.3f}  "
              f"{entry.get('target', '-'):<7} {entry.get('verdict', ''):<4}  {entry['runs']}")
    if args.json:
        args.json.write_text(json.dumps({"hot_path": hot_path().kind, "messages": args.messages, "rounds": args.rounds,
                                         "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
    else:
        sys.exit(main())
