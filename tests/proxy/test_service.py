"""PullBuffer, offsets and the service surface against a real Redis: ack, retry schedule, timeout
redelivery, dead letters, long polls, unknown acks, commit points and restart."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys
from ddmq.proxy.core.errors import UnknownGroupError, UnknownTopicError
from ddmq.proxy.core.types import PullBatch, QueueResult
from ddmq.proxy.service import ProxyService

from .conftest import proxy_config, running_proxy


def ack(batch: PullBatch) -> list[QueueResult]:
    assert batch.queue is not None
    return [QueueResult("g", batch.queue.topic, str(batch.queue.qid), [m.offset for m in batch.messages], [])]


def fail(batch: PullBatch) -> list[QueueResult]:
    assert batch.queue is not None
    return [QueueResult("g", batch.queue.topic, str(batch.queue.qid), [], [m.offset for m in batch.messages])]


async def produce(redis_url: str, messages: list[tuple[str | None, str]], qid: int | None = None) -> None:
    producer = AsyncProducer(redis_url)
    try:
        for key, value in messages:
            await producer.send("t", value, key=key, qid=qid)
    finally:
        await producer.close()


async def pull(service: ProxyService, linger_ms: int = 2000, results: list[QueueResult] | None = None,
               max_batch: int | None = None) -> PullBatch:
    return await service.api.pull("g", "t", max_batch, linger_ms, results or [])


async def test_one_key_is_delivered_one_at_a_time_in_order(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "KEY"}) as service:
        await produce(redis_url, [("k", f"m{i}") for i in range(10)])
        seen = []
        results: list[QueueResult] = []
        for _ in range(10):
            batch = await pull(service, results=results)
            assert len(batch.messages) == 1, "only the head of a key may be out"
            seen.append(batch.messages[0].value)
            results = ack(batch)
        await service.api.submit(results)
        assert seen == [f"m{i}".encode() for i in range(10)]
        assert (await pull(service, linger_ms=0)).messages == []


async def test_fail_retries_on_schedule_then_dead_letters_and_releases_the_successor(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    config = {"order_key": "KEY", "max_retry": 2, "retry_intervals_ms": [300, 600]}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("k", "poison"), ("k", "next")])
        first = await pull(service)
        assert [m.value for m in first.messages] == [b"poison"]
        gaps = []
        batch = first
        for _ in range(2):
            failed_at = time.monotonic()
            batch = await pull(service, results=fail(batch))
            gaps.append(time.monotonic() - failed_at)
            assert [m.value for m in batch.messages] == [b"poison"], "the successor must wait"
        assert gaps[0] >= 0.25 and gaps[1] >= 0.55, f"retried before its interval: {gaps}"
        after_dead = await pull(service, results=fail(batch))
        assert [m.value for m in after_dead.messages] == [b"next"]
        dead = await redis_client.xrange(keys.dead_letters("g", "t"))
        assert len(dead) == 1
        fields = dead[0][1]
        assert fields[b"v"] == b"poison" and fields[b"attempts"] == b"3"
        assert b"client reported failure" in fields[b"error"]
        assert service.groups["g"].buffer.stats.dead_lettered == 1


async def test_unacked_message_is_redelivered_after_timeout_and_late_ack_finishes_it(redis_url: str) -> None:
    config = {"order_key": "KEY", "timeout_ms": 300, "retry_intervals_ms": [0]}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("k", "slow"), ("k", "after")])
        first = await pull(service)
        again = await pull(service)
        assert [m.offset for m in again.messages] == [first.messages[0].offset]
        assert service.groups["g"].buffer.stats.timed_out == 1
        # The first delivery's ack arrives late: it still finishes the message.
        nxt = await pull(service, results=ack(first))
        assert [m.value for m in nxt.messages] == [b"after"]
        assert service.groups["g"].buffer.stats.late_acks == 0  # it was in flight again when acked


async def test_long_poll_wakes_on_new_message_and_expires_empty(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        started = time.monotonic()
        empty = await pull(service, linger_ms=300)
        assert empty.messages == [] and time.monotonic() - started >= 0.25
        parked = asyncio.create_task(pull(service, linger_ms=10_000))
        await asyncio.sleep(0.2)
        assert not parked.done()
        await produce(redis_url, [("k", "wake")])
        batch = await asyncio.wait_for(parked, 8)
        assert [m.value for m in batch.messages] == [b"wake"]


async def test_acks_for_unknown_offsets_queues_and_groups_are_ignored(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        await produce(redis_url, [("k", "x")])
        batch = await pull(service)
        bogus = [
            QueueResult("g", "t", str(batch.queue.qid if batch.queue else 0), [123456], [654321]),
            QueueResult("g", "t", "not-a-qid", [1], []),
            QueueResult("g", "t", "99", [1], []),
            QueueResult("g", "other", "0", [1], []),
            QueueResult("nope", "t", "0", [1], []),
        ]
        await service.api.submit(bogus)
        stats = service.groups["g"].buffer.stats
        assert stats.unknown_acks == 1 and stats.unknown_fails == 1
        # a qid that can be no queue's names no message at all (left out, invalid_results); the other
        # three name messages of queues this proxy does not serve (ignored, unknown_results)
        assert service.counters["invalid_results"] == 1
        assert service.counters["unknown_results"] == 3
        # still serving, and the real ack still works
        await service.api.submit(ack(batch))
        assert service.groups["g"].buffer.stats.acked == 1  # stats is a snapshot: read it again


async def test_unknown_group_and_topic_are_clear_errors(redis_url: str) -> None:
    async with running_proxy(redis_url) as service:
        with pytest.raises(UnknownGroupError, match="unknown group 'ghost'"):
            await service.api.pull("ghost", None, None, 0, [])
        with pytest.raises(UnknownTopicError):
            await service.api.pull("g", "ghost", None, 0, [])
        with pytest.raises(UnknownGroupError):
            await service.api.consume_stats("ghost", None)


async def test_commit_never_passes_an_unfinished_offset_and_restart_resumes_there(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    config = {"order_key": "KEY"}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [(f"k{i}", f"m{i}") for i in range(1, 6)], qid=0)
        # Five keys: every message is a head. The reader may land them in more than one read.
        offsets: list[int] = []
        while len(offsets) < 5 and (batch := await pull(service, max_batch=10)).messages:
            offsets += [m.offset for m in batch.messages]
        assert offsets == [1, 2, 3, 4, 5]
        await service.api.submit([QueueResult("g", "t", "0", [2, 3, 4, 5], [])])
        await asyncio.sleep(0.2)
        assert await redis_client.get(keys.committed("g", "t", 0)) == b"1"
        stats = await service.api.consume_stats("g", "t")
        assert stats[0].consume_offsets["0"] == 1 and stats[0].produce_offsets["0"] == 6
    assert await redis_client.get(keys.finished("g", "t", 0)) == b"2-5"
    # The proxy stopped with offset 1 unfinished: a new one resumes there and, knowing 2..5 were
    # finished, delivers only offset 1 again.
    async with running_proxy(redis_url, config) as service:
        batch = await pull(service, max_batch=10)
        assert [m.offset for m in batch.messages] == [1]
        assert service.groups["g"].consumers["t"].counters["skipped_finished"] == 4
        await service.api.submit(ack(batch))
        await asyncio.sleep(0.2)
        assert await redis_client.get(keys.committed("g", "t", 0)) == b"6"
        assert await redis_client.get(keys.finished("g", "t", 0)) is None
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("k9", "m6")], qid=0)
        batch = await pull(service, max_batch=10)
        assert [m.offset for m in batch.messages] == [6]


async def test_a_stalled_key_does_not_block_other_keys(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "KEY", "timeout_ms": 60_000}) as service:
        messages = [("stuck", f"s{i}") for i in range(5)] + [(f"k{i % 50}", f"m{i}") for i in range(500)]
        await produce(redis_url, messages, qid=0)
        delivered: dict[str, list[str]] = {}
        results: list[QueueResult] = []
        while True:
            batch = await pull(service, linger_ms=500, results=results)
            if not batch.messages:
                break
            results = []
            for m in batch.messages:
                delivered.setdefault(m.key, []).append(m.value.decode())
            # never ack the stuck key's head
            ok = [m.offset for m in batch.messages if m.key != "stuck"]
            assert batch.queue is not None
            results = [QueueResult("g", "t", str(batch.queue.qid), ok, [])]
        assert delivered.pop("stuck") == ["s0"]
        for i in range(50):
            assert delivered[f"k{i}"] == [f"m{j}" for j in range(i, 500, 50)]


async def test_backpressure_reads_no_more_than_concurrency(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "NONE", "concurrency": 10, "read_batch_size": 4}) as service:
        await produce(redis_url, [(None, f"m{i}") for i in range(100)], qid=0)
        consumer = service.groups["g"].consumers["t"]
        got = []
        batch = await pull(service, max_batch=100)
        got += batch.messages
        await asyncio.sleep(0.3)
        assert consumer.unfinished <= 10
        results = ack(batch)
        while len(got) < 100:
            batch = await pull(service, max_batch=100, results=results)
            assert consumer.unfinished <= 10
            got += batch.messages
            results = ack(batch)
        await service.api.submit(results)
        assert sorted(m.offset for m in got) == list(range(1, 101))


async def test_body_that_is_not_json_follows_the_fallback_rule(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "$.rider.id"}) as service:
        await produce(redis_url, [("a", "not json {"), ("a", json.dumps({"rider": {"id": 7}})), ("a", "[]")])
        batch = await pull(service, max_batch=10, linger_ms=1000)
        values = [m.value for m in batch.messages]
        while len(values) < 3:
            more = await pull(service, max_batch=10, linger_ms=1000)
            values += [m.value for m in more.messages]
        assert sorted(values) == sorted([b"not json {", b'{"rider": {"id": 7}}', b"[]"])
        counters = service.groups["g"].consumers["t"].counters
        assert counters["json_invalid"] == 1 and counters["order_key_missing"] == 2


async def test_an_entry_not_written_by_the_producer_stops_that_queue_only(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    async with running_proxy(redis_url, {"order_key": "KEY"}) as service:
        await produce(redis_url, [("a", "before")], qid=0)
        await redis_client.xadd(keys.stream("t", 0), {"v": b"foreign"})  # a plain XADD *: id ms-seq
        await produce(redis_url, [("b", "other queue")], qid=1)
        values = []
        results: list[QueueResult] = []
        for _ in range(2):
            batch = await pull(service, results=results)
            values += [m.value for m in batch.messages]
            results = ack(batch)
        assert sorted(values) == [b"before", b"other queue"]
        assert (await pull(service, linger_ms=300, results=results)).messages == []


async def test_memory_for_timeouts_is_bounded_by_what_is_in_flight(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "NONE", "timeout_ms": 60_000}) as service:
        await produce(redis_url, [(None, f"m{i}") for i in range(500)], qid=0)
        buffer = service.groups["g"].buffer
        results: list[QueueResult] = []
        delivered = 0
        while delivered < 500:
            batch = await pull(service, max_batch=50, results=results)
            delivered += len(batch.messages)
            assert buffer.redelivery.timed == buffer.in_flight == len(batch.messages)
            assert buffer.redelivery.wheel_ticks == 1  # the acked batches' ticks are gone, not left empty
            results = ack(batch)
        await service.api.submit(results)
        # Everything acked long before its 60 s deadline: nothing is left to time out.
        assert buffer.redelivery.timed == 0 and buffer.held == 0 and buffer.redelivery.wheel_ticks == 0


async def test_concurrency_bounds_unfinished_jobs_across_all_readers(redis_url: str) -> None:
    """Every reader sizes its read by the room left; reads landing together must not overshoot it."""
    config = {"order_key": "NONE", "concurrency": 10, "read_batch_size": 10}
    async with running_proxy(redis_url, config, queues=4) as service:
        await produce(redis_url, [(f"k{i}", f"m{i}") for i in range(200)])
        consumer = service.groups["g"].consumers["t"]
        async with asyncio.timeout(10):
            while consumer.unfinished < 10:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # give every reader the chance to overshoot
        assert consumer.unfinished == 10
        seen: list[bytes] = []
        results: list[QueueResult] = []
        while len(seen) < 200:
            batch = await pull(service, results=results, max_batch=64)
            assert consumer.unfinished <= 10
            seen += [m.value for m in batch.messages]
            results = ack(batch) if batch.messages else []
        await service.api.submit(results)
        assert sorted(seen) == sorted(f"m{i}".encode() for i in range(200))


async def test_a_pull_during_start_up_long_polls(redis_url: str) -> None:
    """The Thrift server listens before the HTTP server: a client that connects in between must get
    its long poll, not an empty answer at once (a client whose pull came back empty at start-up
    would back off or, like a test, give up on messages produced a moment later)."""
    service = ProxyService(proxy_config(redis_url, {"order_key": "KEY"}, http={"enabled": True, "port": 0}))
    starting = asyncio.create_task(service.start())
    try:
        while service.thrift_port is None and not starting.done():  # noqa: ASYNC110 (no event to wait on: start-up sets no flag between its servers)
            await asyncio.sleep(0)
        pulling = asyncio.create_task(pull(service, linger_ms=10_000))
        await asyncio.sleep(0)  # the pull's first step (up to parking) runs before this returns
        assert not service.running, "the pull must have reached the service while it was starting"
        await starting
        await produce(redis_url, [("k", "m0"), ("k", "m1")])
        batch = await asyncio.wait_for(pulling, 15)
        assert [m.value for m in batch.messages] == [b"m0"]  # the key's head; its successor waits
        batch = await pull(service, results=ack(batch))
        assert [m.value for m in batch.messages] == [b"m1"]
        await service.api.submit(ack(batch))
    finally:
        if not starting.done():
            await starting
        await service.close()
