"""The cost of a ``/metrics`` scrape at many queues, in both label modes.

``python bench/scrape.py [--groups 100 --topics 10 --queues 8] [--scrapes 5] [--idle] [--quiet-only] [--families N]
[--json PATH]``
starts an ``EmbeddedRedis`` and one real :class:`~ddmq.proxy.service.ProxyService` (HTTP on a free
port) serving ``groups`` groups that each read the same ``topics`` topics of ``queues`` queues, and
waits until it holds every queue. Unless ``--idle``, it then sends two messages of one key to every
queue and pulls and acks the first through the request surface: every queue has its counters, every
action its histogram, and every queue one message of lag (the pre-scrape read fetches a produce
time per queue). Then, for the default mode (per (group, topic)) and for ``metrics.per_queue``
(switched by a config reload, as an operator would), it times ``scrapes`` HTTP ``GET /metrics`` from
a client in the same process and prints one row per mode: series (sample lines; ``--families N``:
also the N families with the most), body size, the
scrape's wall time (median and min), and its two parts: the pre-scrape Redis reads
(:meth:`ProxyMetrics.refresh`, wall time) and the rendering (CPU time; the event loop is blocked
meanwhile). Rows ``live`` measure with the proxy's own work (its readers polling the queues) in the
same event loop, as in production; rows ``quiet`` measure again after every reader stopped (the
queues stay open, so the series are the same): the scrape's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))

import aiohttp
import redis

from ddmq.config import parse
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.core.types import QueueResult
from ddmq.proxy.service import ProxyService
from ddmq.proxy.store.embedded import EmbeddedRedis


def proxy_config(url: str, groups: int, topics: int, queues: int, per_queue: bool = False) -> Any:
    names = [f"t{t:02d}" for t in range(topics)]
    return parse(
        {
            "instance_id": "scrape-bench",
            "redis": url,
            "thrift": {"host": "127.0.0.1", "port": 0},
            "http": {"enabled": True, "host": "127.0.0.1", "port": 0},
            "shutdown_grace_ms": 0,
            "metrics": {"per_queue": per_queue},
            "topics": {name: {"queues": queues} for name in names},
            "groups": {f"g{g:03d}": {name: {"order_key": "KEY"} for name in names} for g in range(groups)},
        }
    )


async def _held_everything(service: ProxyService, queues: int, timeout_s: float) -> None:
    began = time.monotonic()
    said = began
    while True:
        consumers = [c for group in service.registry.groups.values() for c in group.consumers.values()]
        opened = sum(len(c.trackers) for c in consumers)
        if all(len(c.trackers) == queues and len(c.held) == queues for c in consumers):
            return
        if time.monotonic() - began > timeout_s:
            raise RuntimeError(f"the proxy opened {opened} of {len(consumers) * queues} queues in {timeout_s} s")
        if time.monotonic() - said > 10:
            said = time.monotonic()
            print(f"  {opened} of {len(consumers) * queues} queues open after {said - began:.0f} s", file=sys.stderr)
        await asyncio.sleep(0.2)


async def _touch_every_queue(service: ProxyService, url: str, groups: int, topics: list[str], queues: int) -> None:
    """Two messages of one key per queue; every group pulls and acks the first of each queue, so each
    queue has its counters and every action its histogram, and the second stays unfinished: every
    queue is one message behind (the lag gauges read a produce time per queue)."""
    async with AsyncProducer(url) as producer:
        for topic in topics:
            await producer.send_batch(
                topic, [{"value": "x", "key": f"k{q}", "qid": q} for q in range(queues) for _ in range(2)]
            )
    api = service.api
    limit = asyncio.Semaphore(64)

    async def drain(group: str, topic: str) -> None:
        async with limit:
            seen: set[int] = set()
            while len(seen) < queues:
                batch = await api.pull(group, topic, 64, 200, [])
                if batch.queue is None:
                    continue
                seen.add(batch.queue.qid)
                first = [m.offset for m in batch.messages if m.offset == 1]
                if first:
                    await api.submit([QueueResult(group, topic, str(batch.queue.qid), first, [])])

    await asyncio.gather(*(drain(f"g{g:03d}", topic) for g in range(groups) for topic in topics))


async def _measure(service: ProxyService, scrapes: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{service.http_port}/metrics"
    walls: list[float] = []
    body = b""
    async with aiohttp.ClientSession() as session:
        for _ in range(scrapes):
            began = time.perf_counter()
            async with session.get(base) as response:
                body = await response.read()
                assert response.status == 200, response.status
            walls.append(time.perf_counter() - began)
    refreshes, renders = [], []
    for _ in range(scrapes):
        began = time.perf_counter()
        await service.metrics.refresh()
        refreshes.append(time.perf_counter() - began)
        began = time.process_time()
        service.metrics.render()
        renders.append(time.process_time() - began)
    lines = body.decode().splitlines()
    # Series by family: a sample's family is the name its ``# TYPE`` line gave last.
    families: dict[str, int] = {}
    family = ""
    for line in lines:
        if line.startswith("# TYPE "):
            family = line.split(" ")[2]
        elif line and not line.startswith("#"):
            families[family] = families.get(family, 0) + 1
    return {
        "series": sum(1 for line in lines if line and not line.startswith("#")),
        "families": dict(sorted(families.items(), key=lambda item: -item[1])),
        "bytes": len(body),
        "scrape_ms_median": statistics.median(walls) * 1000,
        "scrape_ms_min": min(walls) * 1000,
        "refresh_ms_median": statistics.median(refreshes) * 1000,
        "render_cpu_ms_median": statistics.median(renders) * 1000,
    }


async def run(
    url: str, groups: int, topics: int, queues: int, scrapes: int, idle: bool, start_timeout_s: float,
    phases: tuple[str, ...] = ("live", "quiet"),
) -> list[dict[str, Any]]:
    config = proxy_config(url, groups, topics, queues)
    rows = []
    began = time.monotonic()
    async with ProxyService(config) as service:
        print(f"started in {time.monotonic() - began:.1f} s", file=sys.stderr)
        await _held_everything(service, queues, start_timeout_s)
        print(f"held {groups * topics * queues} queues in {time.monotonic() - began:.1f} s", file=sys.stderr)
        if not idle:
            began = time.monotonic()
            await _touch_every_queue(service, url, groups, sorted(config.topics), queues)
            print(f"touched every queue in {time.monotonic() - began:.1f} s", file=sys.stderr)
        for phase in phases:
            if phase == "quiet":  # the scrape's own cost: no reader polls Redis in the same event loop
                await asyncio.gather(*(group.stop_reading() for group in service.registry.groups.values()))
            for per_queue in (False, True):
                metrics = config.metrics.model_copy(update={"per_queue": per_queue})
                await service.reload(service.registry.config.model_copy(update={"metrics": metrics}))
                figures = await _measure(service, scrapes)
                rows.append({"mode": "per_queue" if per_queue else "per (group, topic)", "proxy": phase,
                             "groups": groups, "topics": topics, "queues": groups * topics * queues, "idle": idle,
                             **figures})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--queues", type=int, default=8, help="queues per topic")
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--idle", action="store_true", help="no message at all (no counters, no histograms)")
    parser.add_argument("--start-timeout-s", type=float, default=900, help="to open every queue")
    parser.add_argument("--maxclients", type=int, default=18000, help="Redis maxclients (capped by ulimit -n)")
    parser.add_argument("--quiet-only", action="store_true", help="only the rows with every reader stopped")
    parser.add_argument("--families", type=int, default=0, metavar="N",
                        help="also print the N families with the most series, per row")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        redis_server = EmbeddedRedis(data_dir).start()
        try:
            # Each queue's reader blocks on a connection of its own: past 8,000 queues the proxy holds
            # more than Redis's default 10,000 clients.
            with redis.Redis.from_url(redis_server.url) as client:
                client.config_set("maxclients", args.maxclients)
            rows = asyncio.run(run(redis_server.url, args.groups, args.topics, args.queues, args.scrapes, args.idle,
                                   args.start_timeout_s, ("quiet",) if args.quiet_only else ("live", "quiet")))
        finally:
            redis_server.stop()
    print(f"{'mode':<20} {'proxy':<6} {'queues':>7} {'series':>8} {'bytes':>11} {'scrape ms':>10} {'(min)':>7} "
          f"{'refresh ms':>10} {'render cpu ms':>13}")
    for row in rows:
        print(f"{row['mode']:<20} {row['proxy']:<6} {row['queues']:>7} {row['series']:>8} {row['bytes']:>11,} "
              f"{row['scrape_ms_median']:>10.1f} {row['scrape_ms_min']:>7.1f} {row['refresh_ms_median']:>10.1f} "
              f"{row['render_cpu_ms_median']:>13.1f}")
    for row in rows if args.families else []:
        print(f"\n{row['mode']}, {row['proxy']}: series by family (of {len(row['families'])} families)")
        for name, count in list(row["families"].items())[:args.families]:
            print(f"  {count:>8} {name}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
