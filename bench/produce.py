"""``python bench/produce.py [--messages N] [--batch N] [--runs N] [--before PYTHON] [--json PATH]``: produce
throughput of the idempotent producer against a raw pipelined XADD of the same messages.

Every row is measured in a child process (``--python``-style: the interpreter decides which install's
``ddmq`` is measured), against one embedded redis-server, the modes interleaved run by run so drift
on a shared machine touches them alike; the table gives each mode's median msg/s and its ratio to the
raw XADD's median:

- ``raw XADD``: redis-py pipelines of ``XADD <stream> * v .. k .. t .. ts ..`` (the producer's fields),
  one pipeline per batch, the stream chosen by the same key hash: what Redis Streams cost with no
  offsets, no scripts and no idempotence;
- ``Producer``: ``Producer.send_batch`` of this checkout (the idempotent script);
- ``Producer + dedup_id``: the same with a dedup id on every message (one more key per message);
- ``Producer (before)``: with ``--before PYTHON``, another install's ``Producer`` (e.g. main's, in a
  venv of its own), through the same driver.

Beside the rates, the CPU each side spent per message (the client process's, and redis-server's
from ``INFO cpu``), medians too: on a loaded machine these move far less than the rates.

It also prints what a dedup id costs in Redis memory: ``MEMORY USAGE`` of the dedup keys, and the
growth of ``used_memory`` per id over a run with ids against one without.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__" and __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parent.parent))

import redis

from ddmq.proxy.store.embedded import EmbeddedRedis

# The child: produce `messages` keyed messages in batches, print the seconds it took. Only what every
# release's client has is imported, so --before can measure an older install with it.
_DRIVER = r"""
import json, sys, time
mode, url, topic, messages, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
from ddmq.client import Producer
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis import keys
body = "x" * 100
rows = [(f"key-{i % 1000}", f'{{"i":{i},"pad":"{body}"}}') for i in range(messages)]
with Producer(url, default_queues=8) as producer:
    producer.ensure_topic(topic, 8)
    client = producer._redis
    started, cpu = time.perf_counter(), time.process_time()
    for start in range(0, messages, batch):
        chunk = rows[start:start + batch]
        if mode == "xadd":
            pipe = client.pipeline(transaction=False)
            ts = str(time.time_ns() // 1_000_000)
            for key, value in chunk:
                pipe.xadd(keys.stream(topic, queue_for_key(key, 8)), {"v": value, "k": key, "t": "", "ts": ts})
            pipe.execute()
        elif mode == "dedup":
            producer.send_batch(topic, [{"key": k, "value": v, "dedup_id": f"{topic}-{start + n}"}
                                        for n, (k, v) in enumerate(chunk)])
        else:
            producer.send_batch(topic, [{"key": k, "value": v} for k, v in chunk])
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
print(json.dumps({"seconds": elapsed, "cpu_s": cpu}))
"""

MODES = {"xadd": "raw XADD", "producer": "Producer", "dedup": "Producer + dedup_id", "before": "Producer (before)"}


def _server_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _run(python: str, mode: str, client: redis.Redis, url: str, topic: str, messages: int, batch: int
         ) -> tuple[float, float, float]:
    """msg/s, the client's CPU µs per message, redis-server's CPU µs per message."""
    child_mode = "producer" if mode == "before" else mode
    server_before = _server_cpu_s(client)
    out = subprocess.run(
        [python, "-c", _DRIVER, child_mode, url, topic, str(messages), str(batch)],
        check=True, capture_output=True, text=True, cwd=tempfile.gettempdir(),
    ).stdout
    server = _server_cpu_s(client) - server_before
    result = json.loads(out.splitlines()[-1])
    return messages / float(result["seconds"]), float(result["cpu_s"]) * 1e6 / messages, server * 1e6 / messages


def _dedup_memory(client: redis.Redis, topic: str) -> dict[str, float]:
    """Bytes per dedup id: MEMORY USAGE of a sample of the keys (each key's own estimate)."""
    sample = list(itertools.islice(client.scan_iter(match=f"ddmq:{{{topic}:*}}:dd:*", count=1000), 2000))
    usages = [int(client.memory_usage(k, samples=0) or 0) for k in sample]
    return {"memory_usage_bytes": statistics.mean(usages) if usages else 0.0, "sampled": len(usages)}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python bench/produce.py", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the install measured as 'after'")
    parser.add_argument("--before", default=None, help="the interpreter of another install to compare ('before')")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    modes = ["xadd", "producer", "dedup"] + (["before"] if args.before else [])
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    client_cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    server_cpu: dict[str, list[float]] = {mode: [] for mode in modes}
    memory: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as data, EmbeddedRedis(data) as server:
        client = redis.Redis.from_url(server.url)
        for run in range(args.runs):
            for mode in modes:
                client.flushall()
                used_before = int(client.info("memory")["used_memory"])
                python = args.before if mode == "before" else args.python
                topic = f"bench-{mode}-{run}"
                rate, own_cpu, redis_cpu = _run(python, mode, client, server.url, topic, args.messages, args.batch)
                rates[mode].append(rate)
                client_cpu[mode].append(own_cpu)
                server_cpu[mode].append(redis_cpu)
                used_after = int(client.info("memory")["used_memory"])
                if mode in ("producer", "dedup"):
                    memory[f"{mode}_used_memory_per_message"] = (used_after - used_before) / args.messages
                if mode == "dedup" and run == 0:
                    memory.update(_dedup_memory(client, topic))
                print(f"run {run + 1}/{args.runs} {MODES[mode]}: {rates[mode][-1]:,.0f} msg/s", file=sys.stderr)
        client.close()
    raw = statistics.median(rates["xadd"])
    print(f"\n{args.messages:,} messages of ~130 bytes, 1000 keys, 8 queues, batches of {args.batch}, "
          f"median of {args.runs} runs")
    # the ratio within each run (the modes of one run are measured back to back) drifts less than the rates
    print(f"{'mode':<24} {'median msg/s':>13} {'÷ raw XADD':>11} {'run ratio':>10} {'client µs':>10} "
          f"{'redis µs':>9}   runs")
    table = {}
    for mode in modes:
        median = statistics.median(rates[mode])
        ratio = statistics.median(r / x for r, x in zip(rates[mode], rates["xadd"], strict=True))
        own, redis_us = statistics.median(client_cpu[mode]), statistics.median(server_cpu[mode])
        table[MODES[mode]] = {"median_msg_s": median, "ratio_to_raw_xadd": median / raw, "median_run_ratio": ratio,
                              "client_cpu_us_per_message": own, "redis_cpu_us_per_message": redis_us,
                              "runs": rates[mode]}
        runs = ", ".join(f"{r:,.0f}" for r in rates[mode])
        print(f"{MODES[mode]:<24} {median:>13,.0f} {median / raw:>11.2f} {ratio:>10.2f} {own:>10.1f} "
              f"{redis_us:>9.1f}   {runs}")
    per_id = memory.get("dedup_used_memory_per_message", 0.0) - memory.get("producer_used_memory_per_message", 0.0)
    print(f"\ndedup id memory: MEMORY USAGE {memory.get('memory_usage_bytes', 0):.0f} bytes per key "
          f"(mean of {memory.get('sampled', 0):.0f}); used_memory grows {per_id:.0f} bytes more per message "
          "with an id than without")
    if args.json:
        args.json.write_text(json.dumps({"rows": table, "memory": memory, "messages": args.messages,
                                         "batch": args.batch}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
