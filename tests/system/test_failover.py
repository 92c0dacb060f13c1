"""Two proxies on one group: leases keep every queue with one reader, a crashed owner's queues move
to the survivor with nothing lost and every key in order, and a paused owner cannot write after
waking up (its commits are fenced off and it delivers nothing)."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import signal
import time
from pathlib import Path

import redis.asyncio as aioredis

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.redis import keys
from ddmq.proxy.core.types import QueueResult
from ddmq.proxy.service import ProxyService

from ..proxy.conftest import running_proxy
from ..support import OrderChecker, ProxyProcess, check_and_ack, check_single_reader, produce_keyed

QUEUES = 4
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100}
GROUP_CONFIG = {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 2000}


produce = functools.partial(produce_keyed, keys=200)


def start_process(tmp_path: Path, redis_url: str, **extra: object) -> ProxyProcess:
    return ProxyProcess(
        tmp_path, redis_url, {"g": {"t": GROUP_CONFIG}}, {"t": {"queues": QUEUES}},
        instance_id="proxy-a", leases=LEASES, **extra,
    ).start()


async def pull_from_process(client: AsyncProxyClient, checker: OrderChecker, epoch: int,
                            pending: list[wire.ConsumeResult]) -> int:
    response = await client.pull(wire.PullRequest(
        groupId="g", topic="t", maxBatchSize=64, maxLingerTime=200, result=wire.link_results(pending)))
    pending[:] = check_and_ack(response, checker, epoch)
    return len(response.messages)


async def consume_and_submit(client: AsyncProxyClient, checker: OrderChecker, epoch: int, count: int) -> None:
    """Pull from a proxy process until ``count`` messages arrived, then ack them all with ``submit``."""
    pending: list[wire.ConsumeResult] = []
    consumed = 0
    while consumed < count:
        consumed += await pull_from_process(client, checker, epoch, pending)
    await client.submit(wire.link_results(pending))


async def pull_in_process(service: ProxyService, checker: OrderChecker, epoch: int,
                          results: list[QueueResult]) -> tuple[int | None, list[QueueResult]]:
    """One pull from ``service`` acking the previous ``results``; returns the batch's qid (None when
    empty) and the results to ack with the next pull."""
    batch = await service.api.pull("g", "t", 64, 200, results)
    if not batch.messages or batch.queue is None:
        return None, []
    for m in batch.messages:
        event = json.loads(m.value)
        checker.delivered(event["k"], event["seq"], epoch)
        checker.acked(event["k"], event["seq"], epoch)
    return batch.queue.qid, [QueueResult("g", "t", str(batch.queue.qid), [m.offset for m in batch.messages], [])]


async def drain_in_process(service: ProxyService, checker: OrderChecker, epoch: int,
                           produced: dict[str, int], timeout_s: float) -> dict[int, float]:
    """Pull and ack from ``service`` until every produced message was acked; returns the time of
    the first delivery from each queue."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    first: dict[int, float] = {}
    results: list[QueueResult] = []
    while checker.missing(produced):
        assert loop.time() < deadline, f"not drained: {list(checker.missing(produced).items())[:5]}"
        qid, results = await pull_in_process(service, checker, epoch, results)
        if qid is not None:
            first.setdefault(qid, time.monotonic())
    await service.api.submit(results)
    return first


async def held(service: ProxyService) -> set[int]:
    return set(service.groups["g"].consumers["t"].held)


async def wait_for(predicate: object, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():  # type: ignore[operator]
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_queues_split_between_proxies_and_move_to_the_survivor_of_a_crash(
    redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(5)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    proxy_a = start_process(tmp_path, redis_url)
    try:
        async with AsyncProxyClient("127.0.0.1", proxy_a.port) as client:
            await wait_for(lambda: _all_leased(redis_url, "proxy-a"), 10)
            async with running_proxy(redis_url, GROUP_CONFIG, queues=QUEUES, instance_id="proxy-b",
                                     leases=LEASES) as proxy_b:
                # B joins: A hands two queues over (averaging: proxy-a 0-1, proxy-b 2-3).
                await wait_for(lambda: _held_is(proxy_b, {2, 3}), 15)
                await wait_for(lambda: _owners_are(redis_url, ["proxy-a", "proxy-a", "proxy-b", "proxy-b"]), 15)
                await asyncio.to_thread(produce, redis_url, 4000, produced, rng)
                # Both serve their share: pull from A over Thrift and from B in process.
                pending: list[wire.ConsumeResult] = []
                consumed = 0
                results: list[QueueResult] = []
                while consumed < 1500:
                    consumed += await pull_from_process(client, checker, 1, pending)
                    qid, results = await pull_in_process(proxy_b, checker, 2, results)
                    assert qid in (None, 2, 3)
                await proxy_b.api.submit(results)
                await client.submit(wire.link_results(pending))
                proxy_a.kill()
                killed_at = time.monotonic()
                first = await drain_in_process(proxy_b, checker, 2, produced, 30)
                assert await held(proxy_b) == set(range(QUEUES))
                assert checker.violations == [], checker.violations[:5]
                taken_over = min(first[0], first[1])  # A's queues
                print(f"takeover: first delivery {1000 * (taken_over - killed_at):.0f} ms after kill -9 "
                      f"(lease ttl {LEASES['ttl_ms']} ms); redelivered {checker.duplicates}")
    finally:
        proxy_a.stop()


async def _held_is(service: ProxyService, qids: set[int]) -> bool:
    return await held(service) == qids


async def _owners_are(redis_url: str, owners: list[str]) -> bool:
    client = aioredis.Redis.from_url(redis_url)
    try:
        values = [await client.get(keys.lease("g", "t", q)) for q in range(QUEUES)]
    finally:
        await client.aclose()
    return [v.decode().rsplit(" ", 1)[0] if v else None for v in values] == owners


async def _all_leased(redis_url: str, owner: str) -> bool:
    client = aioredis.Redis.from_url(redis_url)
    try:
        values = [await client.get(keys.lease("g", "t", q)) for q in range(QUEUES)]
    finally:
        await client.aclose()
    return all(v is not None and v.decode().startswith(owner + " ") for v in values)


async def test_a_paused_owner_is_fenced_off_when_it_wakes_up(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    rng = random.Random(6)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    proxy_a = start_process(tmp_path, redis_url)
    try:
        await wait_for(lambda: _all_leased(redis_url, "proxy-a"), 10)
        await asyncio.to_thread(produce, redis_url, 2000, produced, rng)
        async with AsyncProxyClient("127.0.0.1", proxy_a.port) as client:
            # A holds acks it has not committed yet when it is paused.
            await consume_and_submit(client, checker, 1, 500)
            assert proxy_a.proc is not None
            proxy_a.proc.send_signal(signal.SIGSTOP)
            try:
                async with running_proxy(redis_url, GROUP_CONFIG, queues=QUEUES, instance_id="proxy-b",
                                         leases=LEASES) as proxy_b:
                    await drain_in_process(proxy_b, checker, 2, produced, 30)
                    await asyncio.sleep(0.3)  # B's last commit
                    final = [await redis_client.get(keys.committed("g", "t", q)) for q in range(QUEUES)]
                    produce_next = await proxy_b.api.consume_stats("g", "t")
                    assert {str(q): int(v) for q, v in enumerate(final)} == produce_next[0].produce_offsets
                    proxy_a.proc.send_signal(signal.SIGCONT)
                    # A wakes up with stale state: give it time to try to commit and to notice.
                    await asyncio.sleep(1.5)
                    after = [await redis_client.get(keys.committed("g", "t", q)) for q in range(QUEUES)]
                    assert after == final, "a stale owner overwrote the new owner's offsets"
                    stale = await client.pull(wire.PullRequest(groupId="g", topic="t", maxLingerTime=300))
                    assert stale.messages == [], "a proxy without the lease delivered messages"
                    # (A, awake again, rejoins the group and gets half the queues back by a clean
                    # hand-off under new terms: fine, it has nothing stale left to write.)
            finally:
                proxy_a.proc.send_signal(signal.SIGCONT)
        assert checker.violations == [], checker.violations[:5]
        assert "dropping the queue" in proxy_a.log()
    finally:
        proxy_a.stop()


async def test_a_paused_owner_reads_nothing_under_its_old_terms_after_waking_up(
    redis_url: str, tmp_path: Path
) -> None:
    """SIGSTOP past the lease, a successor drains the queues, SIGCONT: the read audit of both proxies
    shows one reader per term and no read of the woken proxy under a term the successor replaced."""
    rng = random.Random(9)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    audit_a, audit_b = tmp_path / "reads-a.jsonl", tmp_path / "reads-b.jsonl"
    # A small window, so A's readers still have plenty to read when they wake up.
    proxy_a = start_process(tmp_path, redis_url, audit_log=str(audit_a))
    try:
        await wait_for(lambda: _all_leased(redis_url, "proxy-a"), 10)
        await asyncio.to_thread(produce, redis_url, 3000, produced, rng)
        async with AsyncProxyClient("127.0.0.1", proxy_a.port) as client:
            await consume_and_submit(client, checker, 1, 300)
        assert proxy_a.proc is not None
        proxy_a.proc.send_signal(signal.SIGSTOP)
        try:
            async with running_proxy(redis_url, {**GROUP_CONFIG, "concurrency": 200}, queues=QUEUES,
                                     instance_id="proxy-b", leases=LEASES, audit_log=str(audit_b)) as proxy_b:
                await drain_in_process(proxy_b, checker, 2, produced, 30)
                await asyncio.sleep(0.3)
                # More for A to read if it (wrongly) read under its old terms after waking up.
                await asyncio.to_thread(produce, redis_url, 1000, produced, rng)
                woke_at = time.time()
                proxy_a.proc.send_signal(signal.SIGCONT)
                await asyncio.sleep(1.5)
                assert proxy_a.stop() == 0  # it may have rejoined and taken queues back: B gets all again
                await drain_in_process(proxy_b, checker, 2, produced, 30)
        finally:
            proxy_a.proc.send_signal(signal.SIGCONT)
    finally:
        proxy_a.stop()
    records = [json.loads(line) for path in (audit_a, audit_b) for line in path.read_text().splitlines()]
    b_terms: dict[int, int] = {}
    for r in records:
        if r["owner"] == "proxy-b":
            b_terms[r["qid"]] = min(r["term"], b_terms.get(r["qid"], r["term"]))
    stale = [r for r in records
             if r["owner"] == "proxy-a" and r["t"] >= woke_at and r["term"] < b_terms.get(r["qid"], 0)]
    assert stale == [], f"{len(stale)} reads under replaced terms after SIGCONT, e.g. {stale[:3]}"
    check_single_reader(records)
    assert checker.violations == [], checker.violations[:5]
    assert not checker.missing(produced)


async def test_without_persisted_completions_the_next_owner_redelivers_past_the_commit_point(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    """``persist_completions: false``: commits carry no finished ranges, so a successor redelivers every
    message past the commit point; still nothing is lost and every key stays in order."""
    rng = random.Random(8)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    leases = {**LEASES, "persist_completions": False}
    async with running_proxy(redis_url, GROUP_CONFIG, queues=QUEUES, instance_id="proxy-a", leases=leases) as a:
        await asyncio.to_thread(produce, redis_url, 400, produced, rng)
        first = await a.api.pull("g", "t", 8, 2000, [])  # never acked: holds its queue's commit point back
        for m in first.messages:
            event = json.loads(m.value)
            checker.delivered(event["k"], event["seq"], 1)
        results: list[QueueResult] = []
        for _ in range(6):
            _, results = await pull_in_process(a, checker, 1, results)
        await a.api.submit(results)
        await a.groups["g"].flush_offsets()
        finished = [await redis_client.get(keys.finished("g", "t", q)) for q in range(QUEUES)]
        assert not any(finished), "no finished ranges may be stored"
    # The next owner (another instance) redelivers everything past the commit points.
    async with running_proxy(redis_url, GROUP_CONFIG, queues=QUEUES, instance_id="proxy-b", leases=leases) as b:
        await drain_in_process(b, checker, 2, produced, 30)
    assert checker.violations == [], checker.violations[:5]
    assert checker.duplicates > 0
