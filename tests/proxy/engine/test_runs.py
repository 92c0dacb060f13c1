"""Ordered runs (``max_per_key``): a reply carries successive messages of a key; acks, fails, timeouts,
out-of-turn results and clients without runs on the same group, against a real Redis."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.core.types import PullBatch, QueueResult
from ddmq.proxy.service import ProxyService

from ...support import OrderChecker
from ..conftest import running_proxy


async def produce(redis_url: str, keys: list[str], qid: int = 0) -> dict[str, int]:
    """One message per entry of ``keys`` (body ``{"k": key, "seq": n}``), all to queue ``qid``."""
    seqs: dict[str, int] = {}
    producer = AsyncProducer(redis_url)
    try:
        for key in keys:
            seq = seqs.get(key, 0)
            seqs[key] = seq + 1
            await producer.send("t", json.dumps({"k": key, "seq": seq}), key=key, qid=qid)
    finally:
        await producer.close()
    return seqs


async def pull(service: ProxyService, per_key: int | None, results: list[QueueResult] | None = None,
               max_batch: int | None = None, linger_ms: int = 2000) -> PullBatch:
    return await service.api.pull("g", "t", max_batch, linger_ms, results or [], max_per_key=per_key)


async def settle(service: ProxyService, ready: int, messages: int = 0) -> None:
    """Wait until ``ready`` heads wait in the buffer and ``messages`` were read (the readers work in the
    background, one per queue: a key's successors may still be unread when its head is ready)."""
    group = service.groups["g"]
    async with asyncio.timeout(5):
        while group.buffer.ready < ready or sum(c.unfinished for c in group.consumers.values()) < messages:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def events(batch: PullBatch) -> list[tuple[str, int]]:
    return [(json.loads(m.value)["k"], json.loads(m.value)["seq"]) for m in batch.messages]


def result(batch: PullBatch, acked: list[int], failed: list[int] = []) -> list[QueueResult]:  # noqa: B006
    assert batch.queue is not None
    return [QueueResult("g", "t", str(batch.queue.qid), acked, failed)]


def offsets(batch: PullBatch, *picks: int) -> list[int]:
    return [batch.messages[i].offset for i in picks]


async def test_a_reply_carries_a_keys_successive_messages_as_one_run(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "QID"}) as service:
        await produce(redis_url, ["a"] * 100)
        await settle(service, 1, 100)
        first = await pull(service, 64)
        assert events(first) == [("a", i) for i in range(64)] and first.runs == [64]
        second = await pull(service, 64, result(first, offsets(first, *range(64))))
        assert events(second) == [("a", i) for i in range(64, 100)] and second.runs == [36]
        await service.api.submit(result(second, offsets(second, *range(36))))
        assert (await pull(service, 64, linger_ms=0)).messages == []
        assert service.groups["g"].buffer.held == 0


async def test_runs_fill_a_reply_round_robin_and_never_crowd_out_other_keys(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "KEY"}) as service:
        await produce(redis_url, ["a"] * 10 + ["b"] * 10 + ["c"])
        await settle(service, 3, 21)
        batch = await pull(service, 10, max_batch=6)
        assert events(batch) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("c", 0)]
        assert batch.runs == [3, 2, 1]
        # Without runs: one message per key, as for every DDMQ client (the next heads are in flight).
        assert (await pull(service, None, linger_ms=0)).messages == []


async def test_a_client_without_runs_on_the_same_group_gets_one_message_per_key(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "KEY"}) as service:
        await produce(redis_url, ["a"] * 5 + ["b"] * 5)
        await settle(service, 2, 10)
        plain = await pull(service, None)
        assert events(plain) == [("a", 0), ("b", 0)] and plain.runs is None
        runs = await pull(service, 8, result(plain, offsets(plain, 0, 1)))
        assert events(runs) == [("a", i) for i in range(1, 5)] + [("b", i) for i in range(1, 5)]
        # Acking a prefix of each run releases what follows as usual: the plain client goes on.
        await service.api.submit(result(runs, offsets(runs, 0, 1, 4)))
        assert events(await pull(service, 1, linger_ms=0)) == []
        assert service.groups["g"].buffer.in_flight == 5


async def test_a_fail_inside_a_run_returns_the_rest_which_waits_for_the_failed_message(redis_url: str) -> None:
    config = {"order_key": "KEY", "retry_intervals_ms": [200], "max_retry": 3}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, ["a"] * 5)
        await settle(service, 1, 5)
        run = await pull(service, 5)
        assert events(run) == [("a", i) for i in range(5)]
        buffer = service.groups["g"].buffer
        # Processed a0, a1; a2 failed; the client stops there (a3, a4 unreported).
        retry = await pull(service, 5, result(run, offsets(run, 0, 1), offsets(run, 2)))
        assert events(retry) == [("a", 2)], "the failed message goes out alone"
        job3 = buffer.job(run.queue, run.messages[3].offset)  # type: ignore[arg-type]
        assert job3 is None, "returned to the key's chain, not held as delivered"
        assert buffer.stats.failed == 1 and buffer.stats.retried == 1
        rest = await pull(service, 5, result(retry, offsets(retry, 0)))
        assert events(rest) == [("a", 3), ("a", 4)]
        members = [buffer.job(rest.queue, m.offset) for m in rest.messages]  # type: ignore[arg-type]
        assert [j.attempts for j in members if j is not None] == [1, 1], "the return did not count an attempt"
        await service.api.submit(result(rest, offsets(rest, 0, 1)))
        assert buffer.held == 0


async def test_an_ack_after_the_fail_or_before_its_turn_is_ignored_and_the_message_comes_again(
    redis_url: str,
) -> None:
    config = {"order_key": "KEY", "retry_intervals_ms": [0]}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, ["a"] * 4)
        await settle(service, 1, 4)
        run = await pull(service, 4)
        buffer = service.groups["g"].buffer
        # a2 acked before a1 (out of turn): ignored, a2 stays in flight.
        await service.api.submit(result(run, offsets(run, 2)))
        assert buffer.stats.acked == 0 and buffer.stats.unknown_acks == 1
        # a0 fails; the client acks a3 anyway (breaking its promise): ignored, a1..a3 come again in order.
        await service.api.submit(result(run, offsets(run, 3), offsets(run, 0)))
        assert buffer.stats.unknown_acks == 2 and buffer.stats.acked == 0
        again = await pull(service, 4)
        assert events(again) == [("a", 0)]
        rest = await pull(service, 4, result(again, offsets(again, 0)))
        assert events(rest) == [("a", 1), ("a", 2), ("a", 3)]


async def test_a_timeout_inside_a_run_counts_as_a_fail_for_the_rest_of_it(redis_url: str) -> None:
    config = {"order_key": "KEY", "timeout_ms": 300, "retry_intervals_ms": [0]}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, ["a"] * 4 + ["b"])
        await settle(service, 2, 5)
        run = await pull(service, 4)
        assert run.runs == [4, 1]
        await service.api.submit(result(run, offsets(run, 0, 4)))  # a0 and b0 acked, a1..a3 never
        again = await pull(service, 4)
        buffer = service.groups["g"].buffer
        assert events(again) == [("a", 1)], "a1 timed out: retried alone"
        assert buffer.stats.timed_out == 1, "only the head of what was left timed out"
        rest = await pull(service, 4, result(again, offsets(again, 0)))
        assert events(rest) == [("a", 2), ("a", 3)]


async def test_a_dead_lettered_head_releases_the_rest_of_its_key_in_order(redis_url: str) -> None:
    config = {"order_key": "KEY", "max_retry": 0}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, ["a"] * 3)
        run = await pull(service, 3)
        rest = await pull(service, 3, result(run, [], offsets(run, 0)))
        assert events(rest) == [("a", 1), ("a", 2)]
        assert service.groups["g"].buffer.stats.dead_lettered == 1


async def test_random_results_with_runs_keep_per_key_order_and_lose_nothing(redis_url: str) -> None:
    rng = random.Random(13)
    config = {"order_key": "KEY", "timeout_ms": 200, "retry_intervals_ms": [0, 20], "max_retry": 100}
    keys = [f"k{rng.randrange(12)}" for _ in range(400)]
    async with running_proxy(redis_url, config, queues=2) as service:
        produced: dict[str, int] = {}
        for qid in range(2):
            part = await produce(redis_url, [k for k in keys if hash(k) % 2 == qid], qid=qid)
            produced.update(part)
        checker = OrderChecker()
        results: list[QueueResult] = []
        for _ in range(2000):
            if not checker.missing(produced):
                break
            batch = await pull(service, rng.choice([None, 2, 8, 64]), results, max_batch=rng.choice([4, 16]),
                               linger_ms=300)
            results = []
            if batch.queue is None:
                continue
            runs = batch.runs or [1] * len(batch.messages)
            acked: list[int] = []
            failed: list[int] = []
            start = 0
            for size in runs:
                run = batch.messages[start:start + size]
                start += size
                for index, message in enumerate(run):
                    event = json.loads(message.value)
                    fate = rng.random()
                    if fate < 0.05:
                        break  # abandoned: times out with the rest of its run
                    checker.delivered(event["k"], event["seq"])
                    if fate < 0.15:
                        failed.append(message.offset)
                        if index + 1 < len(run) and rng.random() < 0.3:
                            acked.append(run[-1].offset)  # acked anyway, past the failure: ignored
                        break
                    checker.acked(event["k"], event["seq"])
                    acked.append(message.offset)
            results = result(batch, acked, failed)
        await service.api.submit(results)
        assert not checker.violations, checker.violations[:5]
        assert not checker.missing(produced)
        assert service.groups["g"].buffer.held == 0


@pytest.mark.parametrize("seed", range(4))
async def test_every_reply_shares_its_room_between_the_ready_keys(redis_url: str, seed: int) -> None:
    # Issue 45's fair pull: while other keys have ready messages, a key gets one message plus its run's
    # share of the reply, never more. Random backlogs (one message to a key's whole cap), random reply
    # sizes; before each pull every key left has its head ready.
    rng = random.Random(seed)
    remaining = {f"k{i}": rng.choice([1, 1, 2, 3, 8, 40, 100]) for i in range(rng.randrange(3, 40))}
    backlog = [key for key, n in remaining.items() for _ in range(n)]
    rng.shuffle(backlog)
    async with running_proxy(redis_url, {"order_key": "KEY", "timeout_ms": 60_000}) as service:
        produced = await produce(redis_url, backlog)
        checker = OrderChecker()
        await settle(service, len(remaining), len(backlog))
        while remaining:
            ready = dict(remaining)
            max_batch, per_key = rng.choice([4, 16, 64]), rng.choice([2, 8, 64])  # 64: max_pull_batch_size
            batch = await pull(service, per_key, max_batch=max_batch, linger_ms=0)
            got: dict[str, int] = {}
            for key, seq in events(batch):
                checker.delivered(key, seq)
                checker.acked(key, seq)
                got[key] = got.get(key, 0) + 1
            could = {key: min(n, per_key) for key, n in ready.items()}  # what each key could take
            assert len(batch.messages) == min(max_batch, sum(could.values())), (got, could, max_batch)
            if len(ready) >= max_batch:
                assert set(got.values()) == {1}, got  # one head each, no runs
            else:
                assert got.keys() == ready.keys(), (got, ready)  # every ready key has its head in
                for key, n in got.items():
                    # More than another key's count + 1 only once that other key had nothing more.
                    assert all(n <= got[other] + 1 or got[other] == could[other] for other in got), (key, got)
            for key, n in got.items():
                remaining[key] -= n
                if not remaining[key]:
                    del remaining[key]
            await service.api.submit(result(batch, offsets(batch, *range(len(batch.messages)))))
            await settle(service, len(remaining))
        assert not checker.violations and not checker.missing(produced)
        assert service.groups["g"].buffer.held == 0
