"""P6 failover: how long a crashed or departing owner's queues stop, and what a move redelivers.

Two proxies (``a`` and ``b``) share one group on 8 queues (1,000 keys, order key KEY) with a backlog
pre-produced (quick 20k, full 60k messages). Pullers in this process (two per proxy, batch 64, acks
on the next pull) consume from both; 1% of the keys are *slow*: their messages are acked only after
``slow_ack_s`` (quick 0.5 s, full 1.5 s), which holds each queue's commit point back the way a slow
consumer does in real life, so a move finds finished work past it.

- **P6k** (``kill -9``): once a third of its queues' messages are acked, ``a`` is killed. Figure: time
  from the kill until every queue ``a`` owned delivered again from ``b``. The lease sets its floor: a
  lease runs out ``ttl_ms`` after its last renewal (so ``ttl_ms - renew_ms`` to ``ttl_ms`` after the
  kill); a dead owner cannot be told apart from a slow one sooner.
- **P6g** (graceful): ``a`` and ``b`` again; ``a`` gets SIGTERM. Figure: time from the signal until
  every queue ``a`` owned delivered from ``b`` (drain, final commit, lease release, claim).
- **P6r** (redelivery): the P6k run, once with ``persist_completions`` on (the default) and once off.
  Figure: messages delivered again after the kill that had already been acked, with ÷ without.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from bench.dataset import QUEUES, TOPIC, key_names, produce_backlog
from bench.report import Row
from bench.scenarios.base import Settings, log, proxy_sections
from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire
from ddmq.protocol.redis import keys
from tests.harness.stack import ProxyRun, RedisServer

__all__ = ["failover"]

KEYS = 1000
LEASES = {"ttl_ms": 2000, "renew_ms": 500, "claim_interval_ms": 100, "handoff_drain_ms": 1000}
COMMIT_INTERVAL_MS = 200
SLOW_KEYS = 10
GROUP = "cg-failover"


@dataclass
class Tally:
    """What the pullers saw: acked (qid, offset)s, redeliveries of acked ones after ``moved_at``, and
    the first delivery per (proxy, qid) after it."""

    acked: set[tuple[int, int]] = field(default_factory=set)
    moved_at: float | None = None
    moving: set[int] = field(default_factory=set)
    redelivered: int = 0
    first_after: dict[tuple[str, int], float] = field(default_factory=dict)
    deliveries: int = 0


async def puller(
    name: str, port: int, tally: Tally, stop: asyncio.Event, slow: frozenset[str], slow_ack_s: float
) -> None:
    pending: list[wire.ConsumeResult] = []
    held: list[tuple[float, wire.Context, int]] = []  # slow keys' messages, acked when due
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
        while not stop.is_set():
            now = time.monotonic()
            due = [h for h in held if h[0] <= now]
            held = [h for h in held if h[0] > now]
            pending += [wire.ConsumeResult(context=ctx, successOffsets=[offset], failOffsets=[]) for _, ctx, offset
                        in due]
            try:
                response = await client.pull(wire.PullRequest(
                    groupId=GROUP, topic=TOPIC, maxBatchSize=64, maxLingerTime=100,
                    result=wire.link_results(pending)))
            except ProxyClientError:
                return  # this proxy is gone; its queues come back through the other one
            for result in pending:
                qid = int(result.context.qid)
                tally.acked.update((qid, offset) for offset in result.successOffsets)
            pending = []
            if not response.messages:
                continue
            qid = int(response.context.qid)
            ok = []
            for message in response.messages:
                tally.deliveries += 1
                if tally.moved_at is not None and qid in tally.moving:
                    tally.first_after.setdefault((name, qid), time.monotonic())
                    if (qid, message.offset) in tally.acked:
                        tally.redelivered += 1
                if json.loads(message.value)["k"] in slow:
                    held.append((time.monotonic() + slow_ack_s, response.context, message.offset))
                else:
                    ok.append(message.offset)
            if ok:
                pending.append(wire.ConsumeResult(context=response.context, successOffsets=ok, failOffsets=[]))


def owners(redis_url: str) -> dict[int, str]:
    with redis.Redis.from_url(redis_url) as client:
        raw = [client.get(keys.lease(GROUP, TOPIC, q)) for q in range(QUEUES)]
    return {q: v.decode().rsplit(" ", 1)[0] for q, v in enumerate(raw) if v}


def start_proxy(redis_url: str, name: str, persist: bool) -> ProxyRun:
    sections = proxy_sections(GROUP, order_key="KEY", actions=["Order", "PullServer"], timeout_ms=10_000)
    return ProxyRun(
        redis_url, **sections, instance_id=name, commit_interval_ms=COMMIT_INTERVAL_MS,
        leases={**LEASES, "persist_completions": persist},
    ).start()


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"P6: {what} did not happen within {timeout_s:g}s")
        await asyncio.sleep(0.01)


async def one_move(
    redis_url: str, backlog: int, slow_ack_s: float, *, kill: bool, persist: bool
) -> dict[str, Any]:
    """Run a and b, then kill -9 (or SIGTERM) a; returns the timing and redelivery figures."""
    produce_backlog(redis_url, 0, keys=KEYS)  # creates the topic, so both proxies split it at once
    slow = frozenset(key_names(KEYS)[:SLOW_KEYS])
    tally = Tally()
    stop = asyncio.Event()
    proxy_a = start_proxy(redis_url, "a", persist)
    proxy_b = start_proxy(redis_url, "b", persist)
    tasks = []
    try:
        await wait_for(lambda: sorted(owners(redis_url).values()) == ["a"] * 4 + ["b"] * 4, 30, "the split")
        moving = [q for q, owner in owners(redis_url).items() if owner == "a"]
        for name, proxy in (("a", proxy_a), ("b", proxy_b)):
            tasks += [asyncio.create_task(puller(name, proxy.port, tally, stop, slow, slow_ack_s)) for _ in range(2)]
        await asyncio.to_thread(produce_backlog, redis_url, backlog, keys=KEYS)

        def moving_acked() -> int:
            return sum(1 for qid, _ in tally.acked if qid in moving)

        # Kill a when a third of its own queues' messages were acked: mid-stream for those queues.
        await wait_for(lambda: moving_acked() >= backlog * len(moving) // QUEUES // 3, 120, "a third acked")
        acked_by_a = moving_acked()
        tally.moving = set(moving)
        tally.moved_at = time.monotonic()
        if kill:
            proxy_a.kill()
        else:
            await asyncio.to_thread(proxy_a.stop)
        await wait_for(lambda: all(("b", q) in tally.first_after for q in moving), 60, "the takeover")
        await wait_for(lambda: len(tally.acked) >= backlog, 180, "the drain")
        return {
            "move_ms": round(1000 * (max(tally.first_after[("b", q)] for q in moving) - tally.moved_at)),
            "first_queue_ms": round(1000 * (min(tally.first_after[("b", q)] for q in moving) - tally.moved_at)),
            "redelivered": tally.redelivered,
            "acked_on_moved_queues_before": acked_by_a,
            "deliveries": tally.deliveries,
            "moved_queues": len(moving),
        }
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        proxy_a.stop()
        proxy_b.stop()


def run_move(backlog: int, slow_ack_s: float, *, kill: bool, persist: bool) -> dict[str, Any]:
    with RedisServer() as redis_server:
        return asyncio.run(one_move(redis_server.url, backlog, slow_ack_s, kill=kill, persist=persist))


def failover(settings: Settings) -> list[Row]:
    backlog = settings.size(20_000, 60_000)
    slow_ack_s = settings.seconds(0.5, 1.5)
    params = {"queues": QUEUES, "keys": KEYS, "backlog": backlog, **LEASES, "commit_interval_ms": COMMIT_INTERVAL_MS,
              "slow_keys": SLOW_KEYS, "slow_ack_s": slow_ack_s}
    log(f"P6: kill -9 of one of two proxies, {backlog} messages backlog, persisted completions on")
    killed = run_move(backlog, slow_ack_s, kill=True, persist=True)
    log("P6: the same without persisted completions")
    bare = run_move(backlog, slow_ack_s, kill=True, persist=False)
    log("P6: graceful stop (SIGTERM) of one of two proxies")
    graceful = run_move(backlog, slow_ack_s, kill=False, persist=True)
    ratio = killed["redelivered"] / bare["redelivered"] if bare["redelivered"] else None
    return [
        Row("P6k", "kill -9: owner's queues delivering again", f"{killed['move_ms']} ms",
            f"ttl {LEASES['ttl_ms']} ms", None, None, params, {"with_completions": killed}, verdict="info"),
        Row("P6g", "graceful stop: queues delivering from the other proxy", f"{graceful['move_ms']} ms",
            f"drain <= {LEASES['handoff_drain_ms']} ms", None, None, params, {"graceful": graceful}, verdict="info"),
        Row("P6r", "redelivered after kill -9: with / without persisted completions",
            f"{killed['redelivered']}", f"{bare['redelivered']}", ratio, None, params,
            {"with_completions": killed, "without_completions": bare}, verdict="info"),
    ]
