"""What tracing costs: ``python bench/tracing.py [--messages 100000] [--rounds 3] [--json PATH]``.

Three tracing modes and a control, each in its own child process (tracing is decided once per process):

- ``off``: ``DDMQ_TRACING=off``, as without the ``otel`` extra;
- ``api``: the API installed and no SDK set up (no exporter): sends and handling open no-op spans,
  messages carry nothing more;
- ``sampled``: the SDK with ``ParentBased(TraceIdRatioBased(0.01))`` and a batch processor into an
  exporter that drops what it gets: every message carries a ``traceparent``, 1 % of traces are recorded;
- ``padded``: tracing off, each body longer by the bytes a trace context adds to a stream entry
  (:data:`CONTEXT_BYTES`): what the bigger messages cost alone, with no properties to handle.

Per mode, P1's backlog (:func:`bench.dataset.produce_backlog`: 8 queues, 1,000 keys) is produced into
a Redis of its own by a child in that mode (row W: the producer's msg/s), then drained through a fresh
proxy process, per round: by P1's raw Thrift clients (row P1: 8 connections, batch 64, the clock stops
when the commit point reaches the end; the proxy's only extra work is the properties it carries), and
by the SDK's :class:`~ddmq.client.PullConsumer` (row S: 8 threads, batch 64, in a child in that mode,
the clock stops when its processor has seen every message). Rounds alternate the modes; each msg/s
is the median of its rounds, and the ratio the median of each round's ratio to ``off`` of the same
row and round (targets: ``api`` ≥ 0.97, ``sampled`` ≥ 0.9). P1's rows also give the CPU the proxy,
its clients and Redis spent per message (medians).
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

MODES = ("off", "api", "sampled", "padded")
#: What a trace context adds to a stream entry: the ``p`` field, ``{"traceparent":"00-<32>-<16>-00"}``.
#: The ``padded`` mode (tracing off) adds as many bytes to each body instead: the cost of the bytes alone.
CONTEXT_BYTES = 1 + 72
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


def _produce_child(redis_url: str, messages: int, pad: int) -> dict[str, Any]:
    from bench.dataset import produce_backlog

    started = time.perf_counter()
    produce_backlog(redis_url, messages, pad=pad)
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
        result = _produce_child(argv[2], int(argv[3]), CONTEXT_BYTES if mode == "padded" else 0)
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
    if mode in ("off", "padded"):
        env["DDMQ_TRACING"] = "off"
    done = subprocess.run([sys.executable, __file__, "--child", mode, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["active"] != (mode in ("api", "sampled")):
        raise RuntimeError(f"{mode}: tracing active is {result['active']}; is opentelemetry-api installed?")
    return result


def _p1_drain(redis_server: Any, group: str, messages: int) -> tuple[float, float, float, float]:
    """P1's drain: msg/s, and the proxy's, the clients' and Redis's CPU in µs a message."""
    from bench.scenarios.base import ORDER_KEYS
    from bench.scenarios.throughput import drain_via_proxy

    order_key, actions = ORDER_KEYS["KEY"]
    drained = drain_via_proxy(redis_server, group, messages, {"actions": actions, "order_key": order_key})
    return (messages / float(drained.result["committed_s"]), drained.proxy_cpu_s / messages * 1e6,
            float(drained.result["client_cpu_s"]) / messages * 1e6, drained.redis_cpu_s / messages * 1e6)


def _sdk_drain(redis_server: Any, mode: str, group: str, messages: int) -> float:
    from bench.scenarios.base import ORDER_KEYS, proxy_sections
    from tests.harness.stack import ProxyRun

    order_key, actions = ORDER_KEYS["KEY"]
    with ProxyRun(redis_server.url, **proxy_sections(group, actions=actions, order_key=order_key)) as proxy:
        result = _run_child(mode, "consume", proxy.port, group, messages)
    return messages / float(result["seconds"])


Figures = dict[str, dict[str, list[float]]]


def measure(messages: int, rounds: int) -> tuple[Figures, Figures]:
    """Per row (W, P1, S) and mode, the msg/s of each round; and per mode P1's CPU in µs a message, the
    proxy's (``proxy_us``) and its clients' (``client_us``)."""
    from tests.harness.stack import RedisServer

    rates: Figures = {row: {mode: [] for mode in MODES} for row in ("W", "P1", "S")}
    cpu: Figures = {side: {mode: [] for mode in MODES} for side in ("proxy_us", "client_us", "redis_us")}
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
                rate, proxy_us, client_us, redis_us = _p1_drain(server, f"cg-p1-{mode}-{round_}", messages)
                rates["P1"][mode].append(rate)
                cpu["proxy_us"][mode].append(proxy_us)
                cpu["client_us"][mode].append(client_us)
                cpu["redis_us"][mode].append(redis_us)
                rates["S"][mode].append(_sdk_drain(server, mode, f"cg-sdk-{mode}-{round_}", messages))
                print(f"round {round_} {mode}: P1 {rate:,.0f} msg/s (proxy {proxy_us:.2f}, clients {client_us:.2f}, "
                      f"Redis {redis_us:.2f} µs/msg), SDK {rates['S'][mode][-1]:,.0f} msg/s",
                      file=sys.stderr, flush=True)
    finally:
        for server in servers.values():
            server.stop()
    return rates, cpu


def table(rates: Figures, cpu: Figures) -> list[dict[str, Any]]:
    """Per row and mode: the median msg/s, and the ratio to ``off``: the median of the rounds' ratios,
    each to the ``off`` run of its own round (a round's modes run back to back, so a pair shares the
    machine's state, where the medians of a busy machine's runs drift apart)."""
    rows = []
    for row, by_mode in rates.items():
        for mode in MODES:
            runs = by_mode[mode]
            ratio = statistics.median(run / base for run, base in zip(runs, by_mode["off"], strict=True))
            entry: dict[str, Any] = {
                "row": row + {"off": "", "api": "o", "sampled": "o-sampled", "padded": "-padded"}[mode], "mode": mode,
                "msgs_per_s": round(statistics.median(runs)), "runs": [round(r) for r in runs],
                "ratio": round(ratio, 3),
            }
            if row == "P1":
                entry.update({side: round(statistics.median(figures[mode]), 2) for side, figures in cpu.items()})
            if mode in TARGETS:
                entry["target"] = f">= {TARGETS[mode]}"
                entry["verdict"] = "PASS" if ratio >= TARGETS[mode] else "MISS"
            rows.append(entry)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from ddmq.protocol.native import hot_path

    rows = table(*measure(args.messages, args.rounds))
    print(f"{'row':<13} {'mode':<8} {'msg/s':>9} {'ratio':>6}  target       CPU µs/msg: proxy/clients/Redis  runs")
    for entry in rows:
        cpu = (f"{entry['proxy_us']:.2f} / {entry['client_us']:.2f} / {entry['redis_us']:.2f}"
               if "proxy_us" in entry else "-")
        print(f"{entry['row']:<13} {entry['mode']:<8} {entry['msgs_per_s']:>9,} {entry['ratio']:>6.3f}  "
              f"{entry.get('target', '-'):<7} {entry.get('verdict', ''):<4} {cpu:>32}  {entry['runs']}")
    if args.json:
        args.json.write_text(json.dumps({"hot_path": hot_path().kind, "messages": args.messages, "rounds": args.rounds,
                                         "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(sys.argv[2:])
    else:
        sys.exit(main())
