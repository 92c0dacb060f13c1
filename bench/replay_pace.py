"""Paced dead-letter replays: ``python bench/replay_pace.py [--letters 300] [--json PATH]``.

A real proxy process and Redis; each round dead-letters every message in the queues (a consumer that
fails them all, ``max_retry: 0``), then replays them all through ``POST .../dead-letters/replay`` with
a ``rate`` (the last round without one). It prints, per round, the letters, the rate asked, the
call's wall time, the replayed entries' spread (first to last produce time), the rate achieved
(letters over that spread) and the busiest one-second window of produce times, which the pacing
holds to the rate plus one step (a tenth of it).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))

from ddmq.client.consumer import PullConsumer
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys, stream_entry
from ddmq.protocol.redis.connection import sync_redis
from tests.harness.stack import ProxyRun, RedisServer

GROUP, TOPIC, QUEUES = "g", "t", 4
RATES: list[int | None] = [100, 500, 2000, None]


def _dead_letter_all(port: int, redis_url: str, expected: int) -> None:
    consumer = PullConsumer(f"127.0.0.1:{port}", GROUP, lambda message: False, threads=2)
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    with sync_redis(redis_url) as client:
        deadline = time.monotonic() + 120
        while client.xlen(keys.dead_letters(GROUP, TOPIC)) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError("the letters were not dead-lettered in 120 s")
            time.sleep(0.05)
    consumer.stop()
    runner.join(30)


def _round(http_url: str, redis_url: str, rate: int | None) -> dict[str, Any]:
    with sync_redis(redis_url) as client:
        ends = [int(client.get(keys.sequence(TOPIC, qid)) or 0) for qid in range(QUEUES)]
        letters = int(client.xlen(keys.dead_letters(GROUP, TOPIC)))
    body = {"all": True, **({"rate": rate} if rate else {})}
    request = urllib.request.Request(f"{http_url}/admin/groups/{GROUP}/topics/{TOPIC}/dead-letters/replay",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=960) as answer:
        replayed = json.loads(answer.read())["replayed"]
    wall = time.monotonic() - started
    with sync_redis(redis_url) as client:
        times = sorted(int(fields[stream_entry.PRODUCE_TIME]) for qid in range(QUEUES)
                       for _, fields in client.xrange(keys.stream(TOPIC, qid), min=keys.stream_id_after(ends[qid])))
    spread = (times[-1] - times[0]) / 1000 if times else 0.0
    busiest = max(sum(1 for t in times if start <= t < start + 1000) for start in times) if times else 0
    return {"letters": letters, "replayed": replayed, "rate": rate, "wall_s": round(wall, 2),
            "spread_s": round(spread, 2), "achieved_per_s": round(len(times) / spread, 1) if spread else None,
            "busiest_1s": busiest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--letters", type=int, default=300, help="new messages dead-lettered per round")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    group = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 0, "timeout_ms": 30_000}}
    port = free_port()
    rows = []
    with RedisServer() as redis_server:
        proxy = ProxyRun(redis_server.url, groups={GROUP: group}, topics={TOPIC: {"queues": QUEUES}},
                         http={"enabled": True, "host": "127.0.0.1", "port": port})
        with proxy:
            with Producer(redis_server.url) as producer:
                for n, rate in enumerate(RATES):
                    for i in range(args.letters):
                        producer.send(TOPIC, f"{n}:{i}", key=f"k{i % 50}")
                    _dead_letter_all(proxy.port, redis_server.url, args.letters * (n + 1))
                    rows.append(_round(f"http://127.0.0.1:{port}", redis_server.url, rate))
    print(f"{'letters':>8} {'rate':>6} {'wall s':>7} {'spread s':>9} {'achieved/s':>11} {'busiest 1 s':>12}")
    for row in rows:
        print(f"{row['letters']:>8} {row['rate'] or 'none':>6} {row['wall_s']:>7} {row['spread_s']:>9} "
              f"{row['achieved_per_s'] or '-':>11} {row['busiest_1s']:>12}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
