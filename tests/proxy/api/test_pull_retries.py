"""Retriable pulls on a real proxy service (in this test's loop, over the session's Redis): what a retry
answers, that its results apply once, a fail never reaching a later delivery, and the memory's bounds."""

from __future__ import annotations

import pytest

from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.core.types import PullBatch, QueueResult
from ddmq.proxy.service import ProxyService

from ...support import until
from ..conftest import running_proxy
from ..test_service import ack, fail, produce

#: Long enough that nothing this test pulls times out while it runs.
TOPIC = {"timeout_ms": 60_000, "retry_intervals_ms": [10], "max_retry": 5}


async def pull(service: ProxyService, request_id: str | None, results: list[QueueResult] | None = None,
               linger_ms: int = 2000) -> PullBatch:
    return await service.api.pull("g", "t", 50, linger_ms, results or [], request_id=request_id)


def offsets(batch: PullBatch) -> list[int]:
    return [m.offset for m in batch.messages]


async def test_a_retry_answers_the_same_messages_and_its_acks_count_once(redis_url: str) -> None:
    async with running_proxy(redis_url, TOPIC, queues=1) as service:
        await produce(redis_url, [(f"k{i}", f"v{i}") for i in range(5)])
        buffer = service.registry.group("g").buffer
        await until("five messages ready", lambda: buffer.ready == 5, 10)
        first = await pull(service, "a")
        assert len(first.messages) == 5
        again = await pull(service, "a", linger_ms=0)
        assert offsets(again) == offsets(first)  # the same messages, in the same order
        stats = service.registry.group("g").buffer.stats
        acked_before, unknown_before = stats.acked, stats.unknown_acks
        await pull(service, "b", ack(again), linger_ms=0)
        await pull(service, "b", ack(again), linger_ms=0)  # the retry: its acks were applied by the first
        stats = service.registry.group("g").buffer.stats
        assert stats.acked - acked_before == len(again.messages)
        assert stats.unknown_acks == unknown_before
        assert stats.timed_out == 0
        # Acked since: nothing of "a" is in flight, so its retry is a new pull (nothing left to answer).
        assert (await pull(service, "a", linger_ms=0)).messages == []
        assert service.api.counters["retried_pulls"] == 1  # "a" once: "b" answered nothing


async def test_a_retried_fail_never_reaches_the_next_delivery(redis_url: str) -> None:
    async with running_proxy(redis_url, TOPIC, queues=1) as service:
        await produce(redis_url, [("k", "v0")])
        first = await pull(service, None)
        assert offsets(first) == [1]
        await pull(service, "f", fail(first), linger_ms=0)
        redelivered = await pull(service, None)  # after the retry interval
        assert offsets(redelivered) == [1]
        await pull(service, "f", fail(first), linger_ms=0)  # the retry of the pull that failed it
        job = service.registry.group("g").buffer.job(redelivered.queue, 1)  # type: ignore[arg-type]
        assert job is not None and job.state.name == "IN_FLIGHT" and job.attempts == 2
        await service.api.submit(ack(redelivered))


async def test_a_request_id_is_bounded(redis_url: str) -> None:
    async with running_proxy(redis_url, TOPIC, queues=1) as service:
        with pytest.raises(BadRequestError, match="request_id"):
            await pull(service, "x" * 129, linger_ms=0)
        with pytest.raises(BadRequestError, match="request_id"):
            await pull(service, "", linger_ms=0)
        assert service.api.retries.held("g") == (0, 0)


async def test_the_memory_of_a_group_is_bounded_oldest_first(redis_url: str) -> None:
    async with running_proxy(redis_url, TOPIC, queues=1) as service:
        # the bounds are the instance's (a compiled module's constants cannot be patched)
        service.api.retries.max_ids, service.api.retries.max_offsets = 50, 8
        for i in range(200):  # a client inventing ids: only the newest are kept
            await pull(service, f"idle-{i}", linger_ms=0)
        assert service.api.retries.held("g") == (50, 0)
        assert service.api.retries.known("g", "idle-0") is None
        assert service.api.retries.known("g", "idle-199") is not None
        await produce(redis_url, [(f"k{i}", f"v{i}") for i in range(20)])
        taken: list[PullBatch] = []
        while sum(len(b.messages) for b in taken) < 20:
            taken.append(await pull(service, f"busy-{len(taken)}"))
            ids, held = service.api.retries.held("g")
            assert ids <= 50 and (held <= 8 or ids == 1)
        await service.api.submit([r for batch in taken for r in ack(batch)])
