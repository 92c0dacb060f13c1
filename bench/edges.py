"""Legitimate pulls while hostile clients hog the proxy: ``python bench/edges.py [--quick] [--json PATH]``.

One real proxy process per scenario (a fresh Redis each, the proxy's default limits), 20k messages
pre-produced. A legitimate client pulls at a steady pace (one pull of up to 16 messages every 10 ms,
acks riding on the next pull, linger 100 ms) and records each pull's round trip, while a separate
process runs the hostile clients of the scenario:

- ``none``: no hostile client (the reference row);
- ``big-acks``: N connections each sending 16 MiB ``submit`` frames of ~4.2M acks, one after another;
- ``limit-acks``: N connections each sending ``submit`` frames at the offsets limit (100k acks, ~400 KB);
- ``half-sent``: N connections each declaring a 16 MiB frame, sending 15 MiB of it and then nothing;
- ``idle``: N connections that send nothing;
- ``over-cap``: more idle connections than ``max_connections`` (1000): the proxy closes the oldest
  idle ones to admit newcomers, the legitimate client's among them.

It prints p50 / p99 / max pull latency of the legitimate client, how many of its pulls took over
100 ms, the proxy's largest RSS, and how many hostile requests were answered; ``--json`` writes the
rows. The target is a legitimate pull under ~100 ms while big ack frames are handled.

``python bench/edges.py --check [--json PATH]`` times ``ddmq-proxy --check --config FILE`` instead, a
fresh process per run (wall time, and the CPU time the process used): a one-line config, the 9**9
alias bomb, and files of ordinary content grown to just under the size bound (many groups in YAML and
in JSON, distinct Filter expressions, distinct bracketed JSONPaths; ``tests/config/shapes.py``), each
run ``--repeat`` times (default 3), with its exit status and the first words of its answer. The target
is under a second for every file the loader accepts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run from a checkout: the repository root on the path, as bench/run.py does
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.produce.producer import Producer
from tests.config.shapes import SHAPES
from tests.harness.stack import ProxyRun, RedisServer, rss_mb

FRAME_BYTES = 16 * 1024 * 1024
MESSAGES = 20_000
PULL_EVERY_S = 0.01


def submit_frame(count: int, first: int) -> bytes:
    """A ``submit`` call acking ``count`` offsets from ``first`` (4-byte varints from 2^20 on)."""
    result = wire.ConsumeResult(
        context=wire.Context(groupId="g", topic="t", qid="0"), successOffsets=list(range(first, first + count))
    )
    return wire.encode("submit", wire.TMessageType.CALL, 1, wire.ConsumerService.submit_args(result=result))


def _read_reply(sock: socket.socket) -> bool:
    header = _recv(sock, 4)
    if header is None:
        return False
    return _recv(sock, struct.unpack("!i", header)[0]) is not None


def _recv(sock: socket.socket, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = sock.recv(min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _hostile_connection(kind: str, port: int, frame: bytes, stop_at: float, answered: list[int]) -> None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    except OSError:
        return
    with sock:
        try:
            if kind in ("big-acks", "limit-acks"):
                while time.monotonic() < stop_at:
                    sock.sendall(frame)
                    if not _read_reply(sock):
                        return
                    answered.append(1)
            elif kind == "half-sent":
                sock.sendall(frame)
            while time.monotonic() < stop_at:
                time.sleep(0.05)
        except OSError:
            return


def hostile(kind: str, port: int, count: int, seconds: float, ready: Any, results: Any) -> None:
    """The hostile clients of one scenario, in their own process (frames are built before ``ready``)."""
    _raise_descriptor_limit()
    if kind == "big-acks":
        frame = submit_frame((FRAME_BYTES - 64) // 4, 1 << 20)
    elif kind == "limit-acks":
        frame = submit_frame(100_000, 1 << 20)
    elif kind == "half-sent":
        frame = struct.pack("!i", FRAME_BYTES) + b"\x00" * (15 * 1024 * 1024)
    else:
        frame = b""
    ready.set()
    stop_at = time.monotonic() + seconds
    answered: list[int] = []
    threads = [
        threading.Thread(target=_hostile_connection, args=(kind, port, frame, stop_at, answered), daemon=True)
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    results.put({"answered": len(answered), "frame_bytes": len(frame)})


async def legit_client(port: int, seconds: float) -> list[float]:
    latencies = []
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=60) as client:
        pending: list[wire.ConsumeResult] = []
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while loop.time() < end:
            request = wire.PullRequest(
                groupId="g", topic="t", maxBatchSize=16, maxLingerTime=100, result=wire.link_results(pending)
            )
            started = time.perf_counter()
            response = await client.pull(request)
            latencies.append(time.perf_counter() - started)
            pending = []
            if response.messages:
                pending = [
                    wire.ConsumeResult(context=response.context, successOffsets=[m.offset for m in response.messages])
                ]
            await asyncio.sleep(PULL_EVERY_S)
    return latencies


def _raise_descriptor_limit() -> None:
    """A soft limit of 1024 descriptors is below what ``over-cap`` opens (and the proxy then holds)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 8192 if hard == resource.RLIM_INFINITY else min(hard, 8192)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def run_scenario(kind: str, count: int, seconds: float) -> dict[str, Any]:
    with RedisServer() as redis_server:
        with Producer(redis_server.url) as producer:
            producer.ensure_topic("t", 8)
            for start in range(0, MESSAGES, 1000):
                batch = [{"key": f"k{i % 1000}", "value": f"m{i}"} for i in range(start, start + 1000)]
                producer.send_batch("t", batch)
        proxy = ProxyRun(redis_server.url, groups={"g": {"t": {"order_key": "KEY"}}}, topics={"t": {"queues": 8}})
        with proxy:
            context = multiprocessing.get_context("spawn")
            ready, results = context.Event(), context.Queue()
            process = None
            if kind != "none":
                process = context.Process(target=hostile, args=(kind, proxy.port, count, seconds + 1, ready, results))
                process.start()
                if not ready.wait(120):
                    raise RuntimeError("the hostile process did not get ready")
                time.sleep(1)  # let the hostile load build up
            rss = [proxy.rss_mb()]
            sampling = threading.Event()

            def sample() -> None:
                while not sampling.wait(0.1):
                    rss.append(rss_mb(proxy.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            latencies = asyncio.run(legit_client(proxy.port, seconds))
            sampling.set()
            sampler.join()
            hostile_result: dict[str, Any] = {}
            if process is not None:
                hostile_result = results.get(timeout=120)
                process.join(60)
    latencies.sort()
    return {
        "scenario": kind,
        "hostile_clients": count if kind != "none" else 0,
        "pulls": len(latencies),
        "p50_ms": round(statistics.median(latencies) * 1000, 2),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 2),
        "max_ms": round(latencies[-1] * 1000, 2),
        "over_100ms": sum(1 for latency in latencies if latency > 0.1),
        "proxy_rss_max_mb": round(max(rss), 1),
        **hostile_result,
    }


def time_check(name: str, text: str, repeat: int) -> dict[str, Any]:
    """``ddmq-proxy --check`` on ``text``, ``repeat`` fresh processes: wall and CPU seconds of each."""
    suffix = ".json" if "json" in name else ".yaml"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{name}{suffix}"
        path.write_text(text)
        walls, cpus = [], []
        for _ in range(repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "ddmq.proxy", "--check", "--config", str(path)],
                                  capture_output=True, text=True, timeout=600)
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    answer = (proc.stdout or proc.stderr).strip().replace(str(path), "FILE")
    return {
        "shape": name, "bytes": len(text.encode()), "exit": proc.returncode,
        "wall_s_min": round(min(walls), 3), "wall_s_max": round(max(walls), 3),
        "cpu_s_min": round(min(cpus), 3), "cpu_s_max": round(max(cpus), 3), "answer": answer[:160],
    }


def check_main(args: argparse.Namespace) -> int:
    rows = []
    print(f"{'shape':<24} {'bytes':>9} {'exit':>4} {'wall s':>13} {'cpu s':>13}  answer")
    for name, make in SHAPES.items():
        if args.only and name not in args.only.split(","):
            continue
        row = time_check(name, make(), args.repeat)
        rows.append(row)
        print(f"{row['shape']:<24} {row['bytes']:>9} {row['exit']:>4} {row['wall_s_min']:>6}-{row['wall_s_max']:<6} "
              f"{row['cpu_s_min']:>6}-{row['cpu_s_max']:<6} {row['answer'][:70]}", flush=True)
    if args.json:
        machine = {"load_average": list(os.getloadavg()), "cpus": os.cpu_count()}
        args.json.write_text(json.dumps({"argv": sys.argv, "machine": machine, "rows": rows}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer hostile clients, 4 s per scenario")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--only", help="comma-separated scenarios (none,big-acks,limit-acks,half-sent,idle,over-cap)"
                        " or, with --check, shapes")
    parser.add_argument("--check", action="store_true", help="time ddmq-proxy --check on config files instead")
    parser.add_argument("--repeat", type=int, default=3, help="--check: processes per shape (default 3)")
    args = parser.parse_args(argv)
    if args.check:
        return check_main(args)
    _raise_descriptor_limit()  # the proxy processes inherit it
    seconds = 4.0 if args.quick else 8.0
    plan = [
        ("none", 0),
        ("big-acks", 2 if args.quick else 8),
        ("limit-acks", 4 if args.quick else 8),
        ("half-sent", 8 if args.quick else 48),
        ("idle", 200 if args.quick else 900),
        ("over-cap", 1200 if args.quick else 2000),
    ]
    if args.only:
        wanted = set(args.only.split(","))
        plan = [(kind, count) for kind, count in plan if kind in wanted]
    rows = []
    print(
        f"{'scenario':<11} {'hostile':>7} {'pulls':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'>100ms':>6}"
        f" {'RSS MB':>7} {'answered':>8}"
    )
    for kind, count in plan:
        print(f"running {kind} ({count} hostile clients)...", file=sys.stderr)
        row = run_scenario(kind, count, seconds)
        rows.append(row)
        print(
            f"{row['scenario']:<11} {row['hostile_clients']:>7} {row['pulls']:>6} {row['p50_ms']:>8} "
            f"{row['p99_ms']:>8} {row['max_ms']:>8} {row['over_100ms']:>6} {row['proxy_rss_max_mb']:>7}"
            f" {row.get('answered', '-'):>8}",
            flush=True,
        )
    if args.json:
        machine = {"load_average": list(os.getloadavg()), "cpus": os.cpu_count()}
        report = {"argv": sys.argv, "seconds": seconds, "machine": machine, "rows": rows}
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
