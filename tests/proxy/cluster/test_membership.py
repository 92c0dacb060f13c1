"""Membership heartbeats against a real Redis, and the averaging assignment."""

from __future__ import annotations

import asyncio
import itertools

import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from ddmq.proxy.cluster.membership import HEARTBEAT_BATCH, SWEEP_EVERY, Membership, assign


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


async def test_silent_members_are_never_live_and_are_swept_every_few_heartbeats(redis_client: aioredis.Redis) -> None:
    """The batched heartbeat lists members by score and removes the silent ones only once in
    SWEEP_EVERY calls: a silent member is left out of every answer, and gone from the set after a sweep."""
    a = Membership(redis_client, "proxy-a", timeout_ms=300)
    b = Membership(redis_client, "proxy-b", timeout_ms=300)
    assert await a.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a"]}  # a's first call sweeps
    assert await b.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a", "proxy-b"]}
    await asyncio.sleep(0.4)  # b goes silent
    for _ in range(SWEEP_EVERY - 1):  # calls that do not sweep
        assert await a.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a"]}
    assert await redis_client.zscore(keys.members("g"), "proxy-b") is not None
    assert await a.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a"]}  # the sweep
    assert await redis_client.zrange(keys.members("g"), 0, -1) == [b"proxy-a"]


async def test_heartbeats_are_written_every_few_seconds_and_members_read_every_round(
    redis_client: aioredis.Redis,
) -> None:
    """Between two stamps a heartbeat only reads the group's members: a newcomer is seen at the next
    round; a proxy whose own heartbeat vanished keeps its assignment for that round and stamps again."""
    a = Membership(redis_client, "proxy-a", timeout_ms=30_000)
    b = Membership(redis_client, "proxy-b", timeout_ms=30_000)
    assert await a.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a"]}
    assert set(await redis_client.hkeys(keys.group_topics("g"))) == {b"t"}
    await redis_client.config_resetstat()
    assert await a.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a"]}
    ran = {name.removeprefix("cmdstat_"): v["calls"] for name, v in (await redis_client.info("commandstats")).items()}
    assert "zadd" not in ran and "hset" not in ran and "sadd" not in ran and ran["zrangebyscore"] == 1, ran
    assert await b.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a", "proxy-b"]}
    assert await a.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a", "proxy-b"]}
    # a new topic of the group is stamped at once
    assert await a.heartbeat_many({"g": ["t", "u"]}) == {"g": ["proxy-a", "proxy-b"]}
    assert set(await redis_client.hkeys(keys.group_topics("g"))) == {b"t", b"u"}
    await redis_client.delete(keys.members("g"))  # what a Redis restarted empty shows
    assert await a.heartbeat_many({"g": ["t", "u"]}) == {}  # left out: the last assignment stays
    assert await a.heartbeat_many({"g": ["t", "u"]}) == {"g": ["proxy-a"]}


async def test_a_proxy_waiting_for_member_changes_wakes_when_another_joins_or_leaves(
    redis_client: aioredis.Redis,
) -> None:
    """What lets the others rebalance at once on a start or a stop, instead of at their next round."""
    a = Membership(redis_client, "proxy-a", timeout_ms=30_000)
    b = Membership(redis_client, "proxy-b", timeout_ms=30_000)
    await a.heartbeat_many({"g": ["t"]})
    assert await a.wait_for_change(["g"], block_ms=5000)  # its own join, a moment ago, counts too
    assert not await a.wait_for_change(["g"], block_ms=50)  # nothing new
    waiting = asyncio.create_task(a.wait_for_change(["g", "other"], block_ms=20_000))
    assert await b.heartbeat_many({"g": ["t"]}) == {"g": ["proxy-a", "proxy-b"]}  # b joins: announced
    assert await asyncio.wait_for(waiting, 5)  # woken by the join, long before the block ends
    await b.heartbeat_many({"g": ["t"]})  # a heartbeat of a member already in: no event
    assert not await a.wait_for_change(["g"], block_ms=50)
    waiting = asyncio.create_task(a.wait_for_change(["g"], block_ms=20_000))
    await b.leave("g")
    assert await asyncio.wait_for(waiting, 5)
    assert await a.heartbeat("g") == ["proxy-a"]
    assert await redis_client.xlen(keys.member_events("g")) == 3
