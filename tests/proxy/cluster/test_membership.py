"""Membership heartbeats against a real Redis, and the averaging assignment."""

from __future__ import annotations

import asyncio
import itertools

import redis.asyncio as aioredis

from ddmq.protocol import keys
from ddmq.proxy.cluster.membership import HEARTBEAT_BATCH, Membership, assign


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


async def test_one_heartbeat_of_many_groups_registers_them_and_lists_their_members(
    redis_client: aioredis.Redis,
) -> None:
    a = Membership(redis_client, "proxy-a", timeout_ms=300)
    b = Membership(redis_client, "proxy-b", timeout_ms=300)
    assert await b.heartbeat("g1", "t") == ["proxy-b"]
    live = await a.heartbeat_many({"g1": ["t", "u"], "g2": ["t"], "g3": []})
    assert live == {"g1": ["proxy-a", "proxy-b"], "g2": ["proxy-a"], "g3": ["proxy-a"]}
    assert set(await redis_client.hkeys(keys.group_topics("g1"))) == {b"t", b"u"}
    assert await redis_client.smembers(keys.groups()) == {b"g1", b"g2"}  # a group without topics is not registered
    await asyncio.sleep(0.4)  # b goes silent
    assert await a.heartbeat_many({"g1": ["t"]}) == {"g1": ["proxy-a"]}
    many = {f"m{i:03d}": ["t"] for i in range(2 * HEARTBEAT_BATCH + 1)}  # more than one script call
    await redis_client.script_flush()
    assert await a.heartbeat_many(many) == {group: ["proxy-a"] for group in many}
    assert len(await redis_client.smembers(keys.groups())) == 2 + len(many)
    assert await a.heartbeat_many({}) == {}
