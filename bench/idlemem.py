"""Where an idle proxy's memory goes: ``python bench/idlemem.py [--rows 8000] [--frames 1] [--top 40]``.

Runs the proxy service in this process (``ddmq.proxy.service``, the event loop ``ddmq-proxy`` would
choose) with the config of ``bench/idle.py``'s row (G groups x T topics x Q queues, no message), on a
fresh Redis; once every lease names the proxy and ``--settle`` seconds more have passed, it prints the
process's RSS, the live objects by type (``gc.get_objects()``) and, with ``--frames`` > 0, tracemalloc's
allocation sites by file and by line (``--frames`` deep; tracing slows start-up several times and
adds its own memory to the RSS, so read the RSS of a run without it). With an editable install the
sites are the Python sources; a compiled install (``protocol/native.py``) hides the compiled modules'
lines. Output goes to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import linecache
import os
import sys
import time
import tracemalloc
from pathlib import Path


def _print_sites(snapshot: tracemalloc.Snapshot, group: str, top: int) -> None:
    stats = snapshot.statistics(group)
    print(f"by {group} (size, blocks, where):")
    for stat in stats[:top]:
        frame = stat.traceback[0]
        where = frame.filename if group == "filename" else f"{frame.filename}:{frame.lineno}"
        line = "" if group == "filename" else "  " + linecache.getline(frame.filename, frame.lineno).strip()[:90]
        print(f"  {stat.size / 1e6:7.2f} MB {stat.count:8d} {where}{line}")


async def _measure(url: str, rows: int, settle_s: float, frames: int, top: int) -> None:
    import redis.asyncio as aioredis

    from bench.idlecost import INSTANCE, SHAPES
    from ddmq.config.loader import parse
    from ddmq.protocol.native import settle_heap
    from ddmq.proxy.service import ProxyService
    from tests.harness.stack import free_port, rss_mb

    shape = SHAPES[rows]
    config = parse({
        "instance_id": INSTANCE, "redis": url, "thrift": {"host": "127.0.0.1", "port": free_port()},
        "shutdown_grace_ms": 500, "http": {"enabled": True, "host": "127.0.0.1", "port": free_port()},
        **shape.sections(),
    })
    print(f"{rows} queues ({shape}); RSS before the service {rss_mb(os.getpid()):.1f} MB")
    service = ProxyService(config)
    await service.start()
    settle_heap()  # as ddmq-proxy does once started (proxy/cli.py)
    client = aioredis.Redis.from_url(url)
    lease_keys = shape.lease_keys()
    began = time.monotonic()
    prefix = f"{INSTANCE} ".encode()
    try:
        while True:
            held = 0
            for start in range(0, len(lease_keys), 1000):
                values = await client.mget(lease_keys[start:start + 1000])
                held += sum(1 for value in values if value is not None and value.startswith(prefix))
            if held == len(lease_keys):
                break
            await asyncio.sleep(0.5)
        print(f"held after {time.monotonic() - began:.1f} s; RSS {rss_mb(os.getpid()):.1f} MB")
        await asyncio.sleep(settle_s)
        print(f"RSS after {settle_s:g} s more: {rss_mb(os.getpid()):.1f} MB")
        gc.unfreeze()
        counts = collections.Counter(type(obj).__name__ for obj in gc.get_objects())
        gc.freeze()
        print("live objects the collector tracks, by type:")
        for name, count in counts.most_common(top):
            print(f"  {count:8d} {name}")
        if frames:
            snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            print(f"traced: {sum(stat.size for stat in snapshot.statistics('filename')) / 1e6:.1f} MB")
            _print_sites(snapshot, "filename", top)
            _print_sites(snapshot, "lineno", top)
    finally:
        await client.aclose()
        await service.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8000, help="the row of bench/idle.py: 8, 800 or 8000 queues")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to wait once every queue is held")
    parser.add_argument("--frames", type=int, default=0, help="tracemalloc frames per allocation (0: no tracing)")
    parser.add_argument("--top", type=int, default=40, help="lines per listing")
    args = parser.parse_args()
    from bench.idlecost import SHAPES
    from ddmq.protocol.native import loop_factory
    from tests.harness.stack import RedisServer

    if args.rows not in SHAPES:
        parser.error(f"--rows must be one of {sorted(SHAPES)}")
    if args.frames:
        # What _measure imports, imported untraced: the listing shows what the service allocates.
        import redis.asyncio  # noqa: F401

        import ddmq.config.loader
        import ddmq.proxy.service  # noqa: F401
        tracemalloc.start(args.frames)
    with RedisServer() as server, asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
        runner.run(_measure(server.url, args.rows, args.settle, args.frames, args.top))
    return 0


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))
    sys.exit(main())
