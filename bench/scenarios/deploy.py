"""P6d: what a rolling restart costs a queue, with the default leases (30 s TTL).

The run of ``tests/system/test_rolling_restart.py`` (``tests/harness/rolling.py``): three proxies
share 8 queues holding a backlog (30,000 messages over 1,000 keys, topped up where a queue runs
short), a bare Thrift client and the project's SDK consumer pull from each, and each proxy in turn is
sent SIGTERM and started again under its instance id: quick, once round (each started again at once,
as a supervisor does); full, twice round (first started again once the others hold its queues, so
both hand-offs happen, then at once). Figure: per queue, the longest time without a delivery while
the restarts ran; the row takes the worst queue (target :data:`MAX_GAP_S`). A queue that waited out a
released lease would show the TTL. The data also has each restart's stop to back in service and the
messages delivered again after their ack (0 expected).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.report import Row, Target
from bench.scenarios.base import Settings, log
from tests.harness.rolling import KEYS, NAMES, QUEUES, Fleet, backlog, longest_gaps, produce, rolling_restarts
from tests.harness.stack import RedisServer
from tests.support import acked_prefixes, check_order_by_term, until

__all__ = ["MAX_GAP_S", "rolling_restart"]

#: The longest a queue with a backlog may go without a delivery through a rolling restart.
MAX_GAP_S = 2.0
MESSAGES = 30_000


async def _run(redis_url: str, folder: Path, kinds: tuple[bool, ...]) -> dict[str, Any]:
    produced: dict[str, int] = {}
    rng = random.Random(46)
    await asyncio.to_thread(produce, redis_url, MESSAGES, produced, rng)
    client = aioredis.from_url(redis_url)
    fleet = Fleet(folder, redis_url, client)
    try:
        await fleet.start()
        started, ended = await rolling_restarts(fleet, produced, rng, redis_url, kinds)
        left = await backlog(client)
        fleet.pullers.slow = False
        await until("every message acked", lambda: acked_prefixes(fleet.pullers.log) == produced, 120)
    finally:
        codes = await fleet.stop()
        await client.aclose()
    deliveries = fleet.pullers.log
    checker = check_order_by_term(fleet.reads(), deliveries)
    gaps = longest_gaps(deliveries, started, ended)
    return {
        "longest_gap_s_per_queue": {qid: round(gap, 2) for qid, gap in gaps.items()},
        "stop_to_back_in_service_s": [(name, how, round(back - stop, 2)) for name, how, stop, back in fleet.restarts],
        "messages": sum(produced.values()),
        "deliveries": len(deliveries),
        "delivered_again_after_ack": checker.duplicates,
        "order_violations": len(checker.violations),
        "lost_keys": len(checker.missing(produced)),
        "backlog_left_per_queue": left,
        "exit_codes": codes,
    }


def rolling_restart(settings: Settings) -> list[Row]:
    kinds = (False,) if settings.quick else (True, False)
    log(f"P6d: {MESSAGES:,} messages over {KEYS} keys, {QUEUES} queues, {len(NAMES)} proxies, "
        f"{len(kinds) * len(NAMES)} restarts")
    began = time.monotonic()
    with RedisServer() as redis_server, tempfile.TemporaryDirectory(prefix="ddmq-p6d-") as folder:
        data = asyncio.run(_run(redis_server.url, Path(folder), kinds))
    worst = max(data["longest_gap_s_per_queue"].values())
    log(f"P6d: {time.monotonic() - began:.0f}s; longest gap per queue {data['longest_gap_s_per_queue']}")
    sound = not (data["order_violations"] or data["lost_keys"] or data["delivered_again_after_ack"])
    return [
        Row(
            "P6d", "rolling restart, default leases: the longest a queue went without a delivery",
            f"{worst:.2f} s", "lease TTL 30 s", worst, Target("<=", MAX_GAP_S, " s"),
            {"messages": MESSAGES, "keys": KEYS, "queues": QUEUES, "proxies": len(NAMES),
             "restarts": len(kinds) * len(NAMES)},
            data, verdict=None if sound else "MISS",  # lost, reordered or redelivered: whatever the gap
        )
    ]
