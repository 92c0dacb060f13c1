"""P3 key-parallel work: does per-key order keep 100 workers busy?

10k messages (quick: 3k) over 1,000 keys; each body carries ``w``, a uniform random 0-5 ms of work,
which the client "does" with ``asyncio.sleep``. Exactly 100 messages are in flight at most: 10
connections, each holding at most 10. A connection pulls as many as it has free slots whenever one is
free and its previous pull has returned (:data:`REFILL_AT`), so a slot is refilled as soon as its
message is done, not when the whole batch is. Each message is acked the moment its work ends (on a
separate connection, coalesced), because the next message of its key is handed out only after that
ack reaches the proxy.

The group's ``concurrency`` (how many unfinished messages the proxy reads ahead and holds) is the
backlog's size, so every message is in view from the start, as in the references below: the figure
is about what per-key order and the proxy cost, not about the read-ahead window. With per-key order
that window is also how far ahead the proxy looks for runnable keys, so the same work drained with
the default window (1,000) is reported too (``data.default_concurrency``); the same work is drained
once more by clients that wait for :data:`COMPARE_REFILL_AT` free slots before they pull
(``data.refill_5``), so what waiting for free slots costs stays visible beside the figure.

The ideal wall time is the total work divided by 100; the figure is the measured wall time (first
pull to the ack of the last message) over that ideal. ``ratio_actual_sleep`` divides by the time
the sleeps really took instead, which takes asyncio's timer slack in a busy client out of it, and
``floor_ratio`` is the same work fed from memory with no proxy at all: what the client's timers alone
cost. The figure's target divides by it. ``ordered_floor_ratio`` is the same client load against
:func:`bench.replay.serve_ordered_work`, a stand-in server holding the same backlog in memory with
per-key order and no proxy work: the client's pulls, acks and per-key order as well as its timers;
``ratio_over_ordered_floor`` divides by that. ``ordered_ideal_ratio`` is no measurement: the best
schedule of the same backlog on 100 slots with per-key order and nothing else, computed (each slot
takes the oldest message whose key's previous one is done), over the ideal: what per-key order alone
costs this data.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from bench.clients import KeyedWork, keyed_work, sleep_floor
from bench.dataset import QUEUES, TOPIC, draw, produce_backlog
from bench.replay import OrderedWorkSpec, serve_ordered_work
from bench.report import Row, Target
from bench.scenarios.base import Settings, log, proxy_sections, run_load
from tests.harness.clientproc import ClientProcess
from tests.harness.stack import ProxyRun, RedisServer, cpu_seconds, free_port

__all__ = ["key_parallel_work"]

KEYS = 1000
CONNECTIONS = 10
WINDOW = 10
#: Pull whenever a slot is free: a slot waiting for others to free costs more than the extra requests
#: on the compiled build (bench/README.md, "Scenarios", has both measured).
REFILL_AT = 1
COMPARE_REFILL_AT = 5
IN_FLIGHT = CONNECTIONS * WINDOW
WORK_MS = (0.0, 5.0)


def key_parallel_work(settings: Settings) -> list[Row]:
    messages = settings.size(3_000, 10_000)
    with RedisServer() as redis_server:
        log(f"P3: producing {messages:,} messages over {KEYS} keys, {WORK_MS[0]:g}-{WORK_MS[1]:g} ms of work each")
        backlog = produce_backlog(redis_server.url, messages, keys=KEYS, work_ms=WORK_MS)
        result, proxy_cpu_s = _drain(redis_server.url, "cg-work", messages, REFILL_AT, messages)
        windowed, windowed_cpu_s = _drain(redis_server.url, "cg-work-default-window", messages, REFILL_AT, None)
        compare, compare_cpu_s = _drain(
            redis_server.url, f"cg-work-refill-{COMPARE_REFILL_AT}", messages, COMPARE_REFILL_AT, messages
        )
    log("P3: the same work fed from memory (the client's own floor)")
    floor = run_load(sleep_floor, backlog.work_ms, 120 + messages / 100)
    log("P3: the same client load against a stand-in server keeping per-key order (no proxy work)")
    ordered = _ordered_floor(messages)
    total_work_s = sum(backlog.work_ms) / 1000
    ideal_s = total_work_s / IN_FLIGHT
    floor_ratio = floor["wall_s"] / ideal_s
    wall_s = result["wall_s"]
    data = {
        "wall_s": round(wall_s, 3),
        "ideal_s": round(ideal_s, 3),
        "total_work_s": round(total_work_s, 3),
        "floor_ratio": round(floor_ratio, 3),
        "ratio_actual_sleep": round(wall_s / (result["slept_s"] / IN_FLIGHT), 3),
        "ordered_ideal_ratio": round(_ordered_ideal_s(messages) / ideal_s, 3),
        "ordered_floor_ratio": round(ordered["wall_s"] / ideal_s, 3),
        "ratio_over_ordered_floor": round(wall_s / ordered["wall_s"], 3),
        "committed_s": round(result["committed_s"], 3),
        "msgs_per_s": round(messages / wall_s),
        "max_in_flight": result["max_in_flight"],
        "pulls": result["pulls"],
        "submits": result["submits"],
        "cpu_s": {"proxy": round(proxy_cpu_s, 2), "clients": round(result["client_cpu_s"], 2)},
        "ordered_floor": {
            "wall_s": round(ordered["wall_s"], 3),
            "pulls": ordered["pulls"],
            "cpu_s": {"server": round(ordered["server_cpu_s"], 2), "clients": round(ordered["client_cpu_s"], 2)},
        },
        "default_concurrency": {
            "ratio": round(windowed["wall_s"] / ideal_s, 3),
            "ratio_over_floor": round(windowed["wall_s"] / ideal_s / floor_ratio, 3),
            "max_in_flight": windowed["max_in_flight"],
            "pulls": windowed["pulls"],
            "cpu_s": {"proxy": round(windowed_cpu_s, 2), "clients": round(windowed["client_cpu_s"], 2)},
        },
        f"refill_{COMPARE_REFILL_AT}": {
            "ratio": round(compare["wall_s"] / ideal_s, 3),
            "ratio_over_floor": round(compare["wall_s"] / ideal_s / floor_ratio, 3),
            "max_in_flight": compare["max_in_flight"],
            "pulls": compare["pulls"],
            "cpu_s": {"proxy": round(compare_cpu_s, 2), "clients": round(compare["client_cpu_s"], 2)},
        },
    }
    params = {
        "messages": messages, "keys": KEYS, "work_ms": f"{WORK_MS[0]:g}-{WORK_MS[1]:g}",
        "in_flight": f"{CONNECTIONS}x{WINDOW}", "refill_at": REFILL_AT, "concurrency": messages,
    }
    return [Row(
        "P3", "key-parallel work: wall / ideal", f"{wall_s:.3f} s wall", f"{ideal_s:.3f} s ideal",
        wall_s / ideal_s, Target("<=", 1.5), params, data,
    )]


def _drain(
    redis_url: str, group: str, messages: int, refill_at: int, concurrency: int | None
) -> tuple[dict[str, Any], float]:
    """One fresh proxy and group working through the backlog, holding at most ``concurrency`` unfinished
    messages (None: the group's default); the client's result and the proxy's CPU."""
    config: dict[str, Any] = {"actions": ["Order", "PullServer"], "order_key": "KEY"}
    if concurrency is not None:
        config["concurrency"] = concurrency
    with ProxyRun(redis_url, **proxy_sections(group, **config)) as proxy:
        window = f"concurrency {concurrency}" if concurrency is not None else "the default concurrency"
        log(f"P3: {CONNECTIONS} connections x {WINDOW} in flight, pulling at {refill_at} free, {window}")
        spec = KeyedWork(proxy.port, group, messages, CONNECTIONS, WINDOW, refill_at)
        marks: dict[str, float] = {}
        result = run_load(
            keyed_work, spec, 120 + messages / 100, on_ready=lambda: marks.update(cpu=proxy.cpu_seconds())
        )
        return result, proxy.cpu_seconds() - marks["cpu"]


def _ordered_floor(messages: int) -> dict[str, Any]:
    """P3's client load against :func:`bench.replay.serve_ordered_work` (the same backlog and order);
    ``server_cpu_s`` is what the stand-in spent meanwhile."""
    spec = OrderedWorkSpec(free_port(), TOPIC, QUEUES, messages, KEYS, WORK_MS)
    with ClientProcess(serve_ordered_work, spec) as server:
        server.wait_ready(60)
        work = KeyedWork(spec.port, "cg-ordered-floor", messages, CONNECTIONS, WINDOW, REFILL_AT, wait_commit=False)
        marks: dict[str, float] = {}
        result = run_load(
            keyed_work, work, 120 + messages / 100, on_ready=lambda: marks.update(cpu=cpu_seconds(server.pid))
        )
        result["server_cpu_s"] = cpu_seconds(server.pid) - marks["cpu"]
        return result


def _ordered_ideal_s(messages: int) -> float:
    """The backlog's wall time on :data:`IN_FLIGHT` slots with per-key order and no other cost,
    scheduled greedily: whenever a slot is free it takes the oldest message whose key has nothing
    unfinished ahead."""
    backlog = [(key, (work or 0.0) / 1000) for key, _, work in draw(messages, keys=KEYS, work_ms=WORK_MS)]
    waiting: dict[str, deque[int]] = {}
    ready: list[int] = []  # heap of indexes into ``backlog``: keys' heads, oldest first
    for index, (key, _) in enumerate(backlog):
        if key in waiting:
            waiting[key].append(index)
        else:
            waiting[key] = deque()
            heapq.heappush(ready, index)
    running: list[tuple[float, int]] = []  # (end time, index)
    now = 0.0
    while ready or running:
        while ready and len(running) < IN_FLIGHT:
            index = heapq.heappop(ready)
            heapq.heappush(running, (now + backlog[index][1], index))
        now, index = heapq.heappop(running)
        successors = waiting[backlog[index][0]]
        if successors:
            heapq.heappush(ready, successors.popleft())
    return now
