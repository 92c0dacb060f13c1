"""A burst of one key ahead of the rest: ``python bench/burst.py [--burst 5000] [--json PATH]``.

One topic of 2 queues, default group settings (``concurrency`` 1,000, ``key_buffer`` 100), a real
proxy process and Redis. Produced first: ``--burst`` messages of key ``hot`` in queue 0, then 1,000
messages of 1,000 other keys, in queue 0 (``same queue``) or queue 1 (``other queue``). A
``PullConsumer`` with 8 threads handles them; the hot key's messages take ``--work-ms`` each (2 ms),
the others none. Printed per layout: when the other keys were all done, when the burst was, and the
ratio (the share of the burst's drain the other keys waited; the target: at most 0.10). With
``--key-buffer 100000`` the cap never binds: the proxy as it was before keys were held.
"""

from __future__ import annotations

import argparse
import json
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

from ddmq.client import OutgoingMessage, Producer, PullConsumer
from tests.harness.stack import ProxyRun, RedisServer

OTHERS = 1_000


def run_layout(redis_url: str, layout: str, burst: int, work_ms: float, key_buffer: int | None) -> dict[str, Any]:
    topic, group = f"burst-{layout.replace(' ', '-')}", f"cg-{layout.replace(' ', '-')}"
    with Producer(redis_url) as producer:
        producer.ensure_topic(topic, 2)
        hot = [OutgoingMessage(b"{}", "hot", None, None, 0) for _ in range(burst)]
        for start in range(0, burst, 500):
            producer.send_batch(topic, hot[start:start + 500])
        qid = 0 if layout == "same queue" else 1
        producer.send_batch(topic, [OutgoingMessage(b"{}", f"k{i}", None, None, qid) for i in range(OTHERS)])
    done: dict[str, float] = {}
    counts = {"hot": 0, "others": 0}
    lock = threading.Lock()
    finished = threading.Event()
    started = time.perf_counter()

    def handle(message: Any) -> bool:
        if message.key == "hot":
            time.sleep(work_ms / 1000)
        with lock:
            which = "hot" if message.key == "hot" else "others"
            counts[which] += 1
            if which == "others" and counts["others"] == OTHERS:
                done["others"] = time.perf_counter() - started
            if which == "hot" and counts["hot"] == burst:
                done["hot"] = time.perf_counter() - started
            if len(done) == 2:
                finished.set()
        return True

    settings = {} if key_buffer is None else {"key_buffer": key_buffer}
    sections = {"topics": {topic: {"queues": 2}}, "groups": {group: {topic: settings}}}
    with ProxyRun(redis_url, **sections) as proxy:
        consumer = PullConsumer(f"127.0.0.1:{proxy.port}", group, handle, threads=8)
        with consumer:
            started = time.perf_counter()
            if not finished.wait(600):
                raise SystemExit(f"{layout}: not done in 600 s: {counts}")
    return {
        "layout": layout, "burst": burst, "others": OTHERS, "work_ms": work_ms, "key_buffer": key_buffer or 100,
        "others_done_s": round(done["others"], 3), "burst_done_s": round(done["hot"], 3),
        "share": round(done["others"] / done["hot"], 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burst", type=int, default=5_000)
    parser.add_argument("--work-ms", type=float, default=2.0)
    parser.add_argument("--key-buffer", type=int, help="the group's key_buffer (default: the default, 100); "
                        "100000 is the proxy without a cap that matters here")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with RedisServer() as redis_server:
        for layout in ("same queue", "other queue"):
            rows.append(run_layout(redis_server.url, layout, args.burst, args.work_ms, args.key_buffer))
    print(f"{'layout':<12} {'burst':>6} {'others done':>12} {'burst done':>11} {'share':>7}  target")
    for row in rows:
        print(f"{row['layout']:<12} {row['burst']:>6} {row['others_done_s']:>11.3f}s {row['burst_done_s']:>10.3f}s "
              f"{row['share']:>7.4f}  <= 0.10 {'PASS' if row['share'] <= 0.10 else 'MISS'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
