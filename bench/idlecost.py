"""What an idle proxy costs, by the number of queues it holds (``python bench/idle.py``).

Each row is G groups x T topics x Q queues (8 = 1x1x8, 800 = 10x10x8, 8,000 = 100x10x8): topics
``idle0..idle<T-1>`` of Q queues each, and G groups ``cg000..`` each consuming every topic with the
default settings, so the proxy holds G x T x Q queue leases. For each row, on a fresh Redis:

1. one proxy process starts (``tests/harness/stack.py``'s ``ProxyRun``, HTTP on for ``/metrics``); the start-up
   time runs from the spawn until every lease key in Redis names this proxy (polled with ``MGET``);
2. after ``--settle`` seconds, for ``--seconds`` with no message produced at all: the proxy's CPU share
   (``/proc/<pid>/stat``, user + system over wall time), Redis's CPU share the same way, Redis commands
   per second (``INFO stats`` ``total_commands_processed``) and per command (``INFO commandstats``:
   who costs what; commands a script runs are counted there under their own names, the script call
   under ``evalsha``), the proxy's RSS (max of one sample a second) and Redis's connected clients;
3. then three ``/metrics`` scrapes: time (median), bytes and series (lines that are not comments).

The bench's own readings (``INFO``, ``MGET`` while waiting) fall outside the window except two
``INFO`` calls. ``--busy`` runs P1 (order key KEY, ``bench/scenarios/throughput.py``'s drain and
baseline) twice on the same backlog: alone, and with ``--idle-groups`` idle groups (each consuming
one 8-queue topic of its own that never sees a message) beside the busy group, waiting until the idle
groups hold their queues (and twice ``--settle`` more) before the drain starts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ddmq.protocol.redis import keys as redis_keys
from tests.harness.machine import cpu_available, load_average, meta
from tests.harness.stack import HarnessError, ProxyRun, RedisServer, cpu_seconds, free_port

__all__ = ["SHAPES", "Shape", "main", "measure_idle"]

INSTANCE = "bench-proxy"


@dataclass(frozen=True)
class Shape:
    groups: int
    topics: int
    queues: int

    @property
    def leases(self) -> int:
        return self.groups * self.topics * self.queues

    def __str__(self) -> str:
        return f"{self.groups}x{self.topics}x{self.queues}"

    def topic_names(self) -> list[str]:
        return [f"idle{t}" for t in range(self.topics)]

    def group_names(self, prefix: str = "cg") -> list[str]:
        width = len(str(max(self.groups - 1, 0)))
        return [f"{prefix}{g:0{width}d}" for g in range(self.groups)]

    def sections(self, prefix: str = "cg") -> dict[str, Any]:
        """The proxy config's ``topics`` and ``groups`` for this shape."""
        topics = self.topic_names()
        return {
            "topics": {topic: {"queues": self.queues} for topic in topics},
            "groups": {group: {topic: {} for topic in topics} for group in self.group_names(prefix)},
        }

    def lease_keys(self, prefix: str = "cg") -> list[str]:
        return [redis_keys.lease(group, topic, qid) for group in self.group_names(prefix)
                for topic in self.topic_names() for qid in range(self.queues)]


#: The rows, by the number of queue leases they make the proxy hold.
SHAPES: dict[int, Shape] = {8: Shape(1, 1, 8), 800: Shape(10, 10, 8), 8000: Shape(100, 10, 8)}


def log(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def held_count(client: redis.Redis, lease_keys: list[str], owner: str = INSTANCE) -> int:
    """How many of ``lease_keys`` name ``owner`` now."""
    prefix = f"{owner} ".encode()
    held = 0
    for start in range(0, len(lease_keys), 1000):
        values = client.mget(lease_keys[start:start + 1000])
        held += sum(1 for value in values if value is not None and value.startswith(prefix))
    return held


def wait_held(client: redis.Redis, lease_keys: list[str], proxy: ProxyRun, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last_note = time.monotonic()
    while (held := held_count(client, lease_keys)) < len(lease_keys):
        if time.monotonic() > deadline:
            raise HarnessError(f"only {held} of {len(lease_keys)} queues held after {timeout_s:.0f}s:\n"
                               f"{proxy.log_tail()}")
        if time.monotonic() - last_note > 10:
            log(f"{held} of {len(lease_keys)} queues held")
            last_note = time.monotonic()
        time.sleep(0.2)


def _commandstats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, usec) from ``INFO commandstats``."""
    info: dict[str, Any] = client.info("commandstats")
    out = {}
    for name, stats in info.items():
        if name.startswith("cmdstat_") and isinstance(stats, dict):
            out[name[len("cmdstat_"):]] = (int(stats.get("calls", 0)), int(stats.get("usec", 0)))
    return out


def scrape(port: int, times: int = 3) -> dict[str, Any]:
    """``/metrics`` ``times`` times: median seconds, bytes and series of the last scrape."""
    durations = []
    body = b""
    for _ in range(times):
        began = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=120) as reply:
            body = reply.read()
        durations.append(time.perf_counter() - began)
    lines = body.decode(errors="replace").splitlines()
    return {"scrape_ms": round(statistics.median(durations) * 1000, 1), "bytes": len(body),
            "series": sum(1 for line in lines if line and not line.startswith("#"))}


@dataclass
class Window:
    """Readings at the start of the idle window."""

    at: float
    proxy_cpu: float
    redis_cpu: float
    commands: int
    stats: dict[str, tuple[int, int]]

    @classmethod
    def take(cls, client: redis.Redis, proxy: ProxyRun, redis_pid: int) -> Window:
        commands = int(client.info("stats")["total_commands_processed"])
        return cls(time.monotonic(), proxy.cpu_seconds(), cpu_seconds(redis_pid), commands, _commandstats(client))


def measure_window(client: redis.Redis, proxy: ProxyRun, redis_pid: int, seconds: float) -> dict[str, Any]:
    """The idle window: CPU shares, commands/s (in all and per command), RSS, Redis clients."""
    start = Window.take(client, proxy, redis_pid)
    rss = [proxy.rss_mb()]
    while time.monotonic() - start.at < seconds:
        time.sleep(min(1.0, max(0.0, seconds - (time.monotonic() - start.at))))
        rss.append(proxy.rss_mb())
    end = Window.take(client, proxy, redis_pid)
    wall = end.at - start.at
    per_command = []
    for name, (calls, usec) in end.stats.items():
        calls0, usec0 = start.stats.get(name, (0, 0))
        if calls > calls0:
            per_command.append({"command": name, "per_s": round((calls - calls0) / wall, 1),
                                "usec_per_call": round((usec - usec0) / (calls - calls0), 2)})
    per_command.sort(key=lambda entry: -entry["per_s"])
    clients = client.info("clients")
    return {
        "window_s": round(wall, 1),
        "proxy_cpu_pct": round(100 * (end.proxy_cpu - start.proxy_cpu) / wall, 2),
        "redis_cpu_pct": round(100 * (end.redis_cpu - start.redis_cpu) / wall, 2),
        "redis_commands_per_s": round((end.commands - start.commands) / wall, 1),
        "commands": per_command,
        "rss_mb": round(rss[-1], 1),
        "rss_max_mb": round(max(rss), 1),
        "redis_clients": int(clients.get("connected_clients", 0)),
        "redis_blocked_clients": int(clients.get("blocked_clients", 0)),
    }


def measure_idle(shape: Shape, seconds: float, settle_s: float, start_timeout_s: float) -> dict[str, Any]:
    """One row: a fresh Redis and proxy holding ``shape``'s queues, idle for ``seconds``."""
    lease_keys = shape.lease_keys()
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        http_port = free_port()
        began = time.monotonic()
        with ProxyRun(server.url, **shape.sections(), start_timeout_s=start_timeout_s,
                      http={"enabled": True, "host": "127.0.0.1", "port": http_port}) as proxy:
            listening_s = time.monotonic() - began
            wait_held(client, lease_keys, proxy, start_timeout_s)
            held_s = time.monotonic() - began
            log(f"{shape.leases} queues held after {held_s:.1f}s; settling {settle_s:g}s")
            time.sleep(settle_s)
            row = measure_window(client, proxy, server.pid, seconds)
            row.update(metrics=scrape(http_port))
            row.update(queues=shape.leases, shape=str(shape), listening_s=round(listening_s, 2),
                       startup_s=round(held_s, 2))
            stopping = time.monotonic()
            # SIGTERM: the proxy commits and releases every lease before it exits (the harness's
            # default patience is 30 s; a large proxy may need longer, which is worth knowing).
            row.update(exit_code=proxy.stop(timeout_s=600), shutdown_s=round(time.monotonic() - stopping, 2))
            client.close()
    log(f"{shape.leases}: {json.dumps({k: v for k, v in row.items() if k != 'commands'})}")
    return row


# P1 beside idle groups ---------------------------------------------------------------------------


def p1_with_idle_groups(idle_groups: int, quick: bool, settle_s: float = 10.0) -> dict[str, Any]:
    """P1 (order key KEY) alone and with ``idle_groups`` idle groups beside it, on one backlog."""
    from bench.clients import ProxyDrain, drain_proxy
    from bench.dataset import produce_backlog
    from bench.scenarios.base import proxy_sections, run_load
    from bench.scenarios.throughput import BATCH, CONNECTIONS, KEYS, drain_baseline

    messages = 30_000 if quick else 200_000
    idle = Shape(idle_groups, 1, 8)
    out: dict[str, Any] = {"messages": messages, "idle_groups": idle_groups, "idle_queues": idle.leases}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        log(f"P1: producing {messages:,} messages")
        produce_backlog(server.url, messages, keys=KEYS)
        baselines = drain_baseline(server, [f"raw-idle-a{i}" for i in range(3)], messages)
        for label, extra in (("alone", None), ("beside_idle", idle)):
            group = f"cg-p1-{label}"
            sections = proxy_sections(group, actions=["Order", "PullServer"], order_key="KEY")
            if extra is not None:
                more = extra.sections(prefix="idle-")
                sections["topics"].update(more["topics"])
                sections["groups"].update(more["groups"])
            began = time.monotonic()
            with ProxyRun(server.url, **sections, start_timeout_s=300) as proxy:
                if extra is not None:
                    wait_held(client, extra.lease_keys(prefix="idle-"), proxy, 600)
                    log(f"P1 {label}: {extra.leases} idle queues held after {time.monotonic() - began:.1f}s")
                    time.sleep(settle_s)  # the queues' opens (offsets, parked keys) come after their leases
                marks: dict[str, float] = {}

                def on_ready(proxy: ProxyRun = proxy, marks: dict[str, float] = marks) -> None:
                    marks["cpu"] = proxy.cpu_seconds()

                spec = ProxyDrain(proxy.port, group, messages, CONNECTIONS, BATCH)
                result = run_load(drain_proxy, spec, 120 + messages / 200, on_ready=on_ready)
                deliveries = result["unique"] + result["duplicates"]
                out[label] = {"msgs_per_s": round(messages / result["committed_s"]),
                              "delivered_msgs_per_s": round(messages / result["delivered_s"]),
                              "proxy_cpu_s": round(proxy.cpu_seconds() - marks["cpu"], 2),
                              # how full the replies got: fewer per pull costs the proxy more per message
                              "messages_per_pull": round(deliveries / max(1, result["replies_with_messages"]), 1),
                              "rss_mb": round(proxy.rss_mb(), 1)}
                log(f"P1 {label}: {out[label]}")
        baselines += drain_baseline(server, [f"raw-idle-b{i}" for i in range(3)], messages)
        client.close()
    baseline = statistics.median(messages / b.result["elapsed_s"] for b in baselines)
    out["baseline_msgs_per_s"] = round(baseline)
    for label in ("alone", "beside_idle"):
        out[label]["ratio"] = round(out[label]["msgs_per_s"] / baseline, 3)
    return out


# the command line --------------------------------------------------------------------------------


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ("queues", "GxTxQ", "start s", "stop s", "proxy CPU", "redis CPU", "cmds/s", "RSS MB", "clients",
              "/metrics ms/KB/series", "top commands /s")
    lines = [header]
    for row in rows:
        metrics = row["metrics"]
        top = ", ".join(f"{c['command']} {c['per_s']:g}" for c in row["commands"][:5])
        lines.append((
            f"{row['queues']:,}", row["shape"], f"{row['startup_s']:.1f}", f"{row['shutdown_s']:.1f}",
            f"{row['proxy_cpu_pct']:.1f}%",
            f"{row['redis_cpu_pct']:.1f}%", f"{row['redis_commands_per_s']:,.0f}",
            f"{row['rss_mb']:.0f} (max {row['rss_max_mb']:.0f})", str(row["redis_clients"]),
            f"{metrics['scrape_ms']:.0f} / {metrics['bytes'] / 1024:.0f} / {metrics['series']:,}", top,
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in lines]
    out.insert(1, "-" * min(160, len(out[0])))
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python bench/idle.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="rows 8 and 800 only, 10 s windows")
    parser.add_argument("--rows", default="",
                        help=f"comma-separated rows of {sorted(SHAPES)} (default all; quick 8,800)")
    parser.add_argument("--seconds", type=float, default=None, help="idle window per row (default 30, quick 10)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between all held and the window")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="most seconds until every queue is held")
    parser.add_argument("--busy", action="store_true", help="also P1 alone and beside --idle-groups idle groups")
    parser.add_argument("--idle-groups", type=int, default=1000, help="idle groups beside P1's (default 1000)")
    parser.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    wanted = [int(part) for part in args.rows.split(",") if part.strip()]
    wanted = wanted or ([8, 800] if args.quick else sorted(SHAPES))
    unknown = [n for n in wanted if n not in SHAPES]
    if unknown:
        parser.error(f"unknown rows {unknown}; known: {sorted(SHAPES)}")
    seconds = args.seconds if args.seconds is not None else (10.0 if args.quick else 30.0)
    began = time.monotonic()
    machine: dict[str, Any] = {"load_before": load_average(), "cores_available_before": cpu_available()}
    print(f"machine: load {machine['load_before']}, cores available {machine['cores_available_before']}",
          file=sys.stderr, flush=True)
    rows = []
    for count in wanted:
        shape = SHAPES[count]
        print(f"idle {count} ({shape}): starting", file=sys.stderr, flush=True)
        try:
            rows.append(measure_idle(shape, seconds, args.settle, args.start_timeout))
        except HarnessError as exc:
            print(f"idle {count}: the harness broke: {exc}", file=sys.stderr, flush=True)
    busy = p1_with_idle_groups(args.idle_groups, args.quick, 2 * args.settle) if args.busy else None
    machine.update(load_after=load_average(), cores_available_after=cpu_available())
    print(format_table(rows))
    if busy is not None:
        print(f"\nP1 (order key KEY, {busy['messages']:,} messages): alone {busy['alone']['msgs_per_s']:,} msg/s "
              f"(ratio {busy['alone']['ratio']}), beside {busy['idle_groups']} idle groups "
              f"({busy['idle_queues']:,} queues) {busy['beside_idle']['msgs_per_s']:,} msg/s "
              f"(ratio {busy['beside_idle']['ratio']}); baseline {busy['baseline_msgs_per_s']:,} msg/s")
    print(f"\nmachine: load before {machine['load_before']}, after {machine['load_after']}; cores available "
          f"{machine['cores_available_before']} / {machine['cores_available_after']}")
    if args.json is not None:
        document = {"rows": rows, "busy": busy,
                    "meta": meta(args.quick, time.monotonic() - began, list(sys.argv[1:] if argv is None else argv),
                                 machine)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"results: {args.json}")
    return 0
