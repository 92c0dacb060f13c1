"""Membership heartbeats against a real Redis, and the averaging assignment."""

from __future__ import annotations

import asyncio
import itertools

import redis.asyncio as aioredis

from ddmq.proxy.cluster.membership import Membership, assign


def test_assignment_covers_every_queue_exactly_once_and_is_balanced() -> None:
    for members_count, queues in itertools.product(range(1, 7), range(0, 20)):
        members = [f"p{i}" for i in range(members_count)]
        shares = [list(assign(list(reversed(members)), queues, m)) for m in members]
        assert sorted(q for share in shares for q in share) == list(range(queues))
        sizes = [len(share) for share in shares]
        assert max(sizes) - min(sizes) <= 1


def test_rocketmq_averaging_layout() -> None:
    members = ["a", "b", "c"]
    assert [list(assign(members, 8, m)) for m in members] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert list(assign(members, 8, "stranger")) == []
    assert [list(assign(members, 2, m)) for m in members] == [[0], [1], []]


async def test_heartbeats_list_live_members_and_forget_silent_ones(redis_client: aioredis.Redis) -> None:
    a = Membership(redis_client, "proxy-a", timeout_ms=300)
    b = Membership(redis_client, "proxy-b", timeout_ms=300)
    assert await a.heartbeat("g") == ["proxy-a"]
    assert await b.heartbeat("g") == ["proxy-a", "proxy-b"]
    await asyncio.sleep(0.4)  # a goes silent
    assert await b.heartbeat("g") == ["proxy-b"]
    await a.heartbeat("g")
    await a.leave("g")
    assert await b.heartbeat("g") == ["proxy-b"]
    assert await b.heartbeat("other") == ["proxy-b"]
