"""UpstreamJobBlockingQueue: only a key's head runs; successors are reactivated first; keys never wait on each other."""

from __future__ import annotations

import asyncio
import random

import pytest
import redis.asyncio as aioredis

from ddmq.config.schema import TopicGroupConfig
from ddmq.proxy.core.types import QueueId, StoredMessage
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.engine.ordering import UpstreamJobBlockingQueue
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.topic_jobs import TopicJobs
from ddmq.proxy.store.broker import Broker
from ddmq.proxy.store.key_commands import ParkStore


def make_owner() -> TopicJobs:
    # Never started: the queue only needs jobs that know their owner.
    redis = aioredis.Redis()
    return TopicJobs("g", "t", TopicGroupConfig(), Broker(redis), PullBuffer("g"), ParkStore(redis, "g", "t"),
                     lambda qid: True)


def make_job(owner: TopicJobs, offset: int, key: object) -> UpstreamJob:
    job = UpstreamJob(owner, QueueId("t", 0), StoredMessage(offset, b"", "", "", {}, 0), OffsetTracker(1))
    job.order_key = key  # type: ignore[assignment]
    return job


def drain(queue: UpstreamJobBlockingQueue) -> list[UpstreamJob]:
    out = []
    while (job := queue.pop()) is not None:
        out.append(job)
    return out


async def test_only_the_head_of_a_key_is_runnable() -> None:
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    jobs = [make_job(consumer, i, "k") for i in range(1, 4)]
    assert [queue.put(j) for j in jobs] == [True, False, False]
    assert drain(queue) == [jobs[0]]
    assert jobs[1].state is JobState.WAITING
    assert queue.chain_length("k") == 3
    assert queue.release(jobs[0]) is jobs[1]
    assert drain(queue) == [jobs[1]]
    queue.release(jobs[1])
    assert drain(queue) == [jobs[2]]
    queue.release(jobs[2])
    assert queue.active_keys == 0 and queue.chain_length("k") == 0


async def test_reactivated_jobs_are_served_before_the_main_queue() -> None:
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    a1, a2 = make_job(consumer, 1, "a"), make_job(consumer, 2, "a")
    queue.put(a1)
    queue.put(a2)
    assert drain(queue) == [a1]
    fresh = [make_job(consumer, 10 + i, f"k{i}") for i in range(3)]
    for job in fresh:
        queue.put(job)
    queue.release(a1)
    assert drain(queue) == [a2, *fresh]


async def test_a_stalled_key_does_not_hold_back_other_keys() -> None:
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    jobs = [make_job(consumer, i, "stuck" if i % 10 == 0 else f"k{i % 7}") for i in range(1, 1001)]
    for job in jobs:
        queue.put(job)
    delivered: list[UpstreamJob] = []
    while True:
        runnable = drain(queue)
        if not runnable:
            break
        for job in runnable:
            delivered.append(job)
            if job.order_key != "stuck":
                queue.release(job)  # every key but "stuck" finishes its head
    others = [j for j in jobs if j.order_key != "stuck"]
    assert sorted(j.offset for j in delivered if j.order_key != "stuck") == [j.offset for j in others]
    assert [j.order_key for j in delivered].count("stuck") == 1
    assert queue.chain_length("stuck") == 100


async def test_keys_are_exact_not_hashed() -> None:
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    assert hash(-1) == hash(-2)  # CPython: a real collision
    first, second = make_job(consumer, 1, -1), make_job(consumer, 2, -2)
    assert queue.put(first) and queue.put(second)
    assert drain(queue) == [first, second]


async def test_jobs_without_a_key_are_always_runnable() -> None:
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    jobs = [make_job(consumer, i, None) for i in range(5)]
    assert all(queue.put(j) for j in jobs)
    assert drain(queue) == jobs
    assert queue.release(jobs[0]) is None


@pytest.mark.parametrize("admit", [False, True], ids=["put", "admit"])
async def test_random_interleaving_keeps_per_key_order_and_one_running_job_per_key(admit: bool) -> None:
    """Jobs enter by ``put`` (the dispatcher pops every runnable one) or by ``admit`` (a lone runnable
    head runs at once, as the Order action runs it): either way each key's jobs run one at a time, in
    offset order, each once, and an admitted job never overtakes one waiting to run."""
    rng = random.Random(7)
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    keys = [f"k{i}" for i in range(20)] + [None]
    produced: dict[object, list[int]] = {}
    running: dict[object, UpstreamJob] = {}
    unkeyed_running: list[UpstreamJob] = []
    served: dict[object, list[int]] = {}
    offset = 0
    for _ in range(5000):
        action = rng.random()
        if action < 0.5:
            offset += 1
            key = rng.choice(keys)
            produced.setdefault(key, []).append(offset)
            job = make_job(consumer, offset, key)
            waiting_to_run = queue.runnable
            if not admit:
                queue.put(job)
            elif queue.admit(job):  # runs now: it overtakes nothing, and its key had nothing unfinished
                assert waiting_to_run == 0 and job.state is JobState.RUNNABLE
                served.setdefault(key, []).append(offset)
                if key is None:
                    unkeyed_running.append(job)
                else:
                    assert key not in running, "two jobs of one key ran at once"
                    running[key] = job
        elif action < 0.8:
            job = queue.pop()
            if job is not None:
                served.setdefault(job.order_key, []).append(job.offset)
                if job.order_key is None:
                    unkeyed_running.append(job)
                else:
                    assert job.order_key not in running, "two jobs of one key ran at once"
                    running[job.order_key] = job
        else:
            if running and rng.random() < 0.8:
                key = rng.choice(list(running))
                queue.release(running.pop(key))
            elif unkeyed_running:
                queue.release(unkeyed_running.pop())
    # finish everything left
    while True:
        for job in list(running.values()):
            queue.release(job)
        running.clear()
        job = queue.pop()
        if job is None:
            break
        served.setdefault(job.order_key, []).append(job.offset)
        if job.order_key is not None:
            running[job.order_key] = job
        while (more := queue.pop()) is not None:
            served.setdefault(more.order_key, []).append(more.offset)
            if more.order_key is not None:
                assert more.order_key not in running
                running[more.order_key] = more
    assert served == produced


async def test_admit_runs_a_lone_head_at_once_and_queues_behind_anything_waiting_to_run() -> None:
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    a1, a2, b1, c1 = (make_job(consumer, n, key) for n, key in ((1, "a"), (2, "a"), (3, "b"), (4, "c")))
    assert queue.admit(a1) and a1.state is JobState.RUNNABLE and queue.runnable == 0
    assert not queue.admit(a2) and a2.state is JobState.WAITING  # behind its key's head
    assert queue.release(a1) is a2  # a2 is reactivated: waiting to run
    assert not queue.admit(b1) and b1.state is JobState.RUNNABLE  # so b1 queues behind it
    assert not queue.admit(c1)
    assert drain(queue) == [a2, b1, c1]
    assert queue.admit(make_job(consumer, 5, "d"))  # nothing waits to run again


async def test_wait_returns_once_a_job_may_run_and_blocks_while_none_can() -> None:
    consumer = make_owner()
    queue = UpstreamJobBlockingQueue()
    waiters = [asyncio.create_task(queue.wait()) for _ in range(2)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    queue.put(make_job(consumer, 1, "a"))
    await asyncio.wait_for(asyncio.gather(*waiters), 1)  # both waiters woken by one put
    await asyncio.wait_for(queue.wait(), 1)  # still set: returns at once
    assert drain(queue) and queue.pop() is None  # popping the queue empty clears it
    blocked = asyncio.create_task(queue.wait())
    cancelled = asyncio.create_task(queue.wait())
    await asyncio.sleep(0.01)
    assert not blocked.done()
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    job = make_job(consumer, 2, "b")
    queue.put(job)
    await asyncio.wait_for(blocked, 1)  # a cancelled waiter does not stop the others being woken
    assert drain(queue) == [job]
