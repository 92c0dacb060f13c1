"""The record of operator actions in a real Redis: bounded in entries and bytes, newest first, by group,
and entries written by hand read without an error."""

from __future__ import annotations

import json
import logging

import pytest
import redis
import redis.asyncio

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.actions import (
    MAX_DETAIL_BYTES,
    MAX_KEPT,
    recent_actions,
    recent_actions_sync,
    record_action,
    record_action_sync,
)
from ddmq.protocol.redis.connection import async_redis, sync_redis


def test_record_is_capped_and_read_newest_first(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        for n in range(MAX_KEPT + 200):
            record_action_sync(client, "alice@host", "pause", group="g1" if n % 2 else "g2", detail={"n": n})
        assert client.xlen(keys.actions()) == MAX_KEPT
        newest = recent_actions_sync(client, 3)
        assert [a.detail["n"] for a in newest] == [MAX_KEPT + 199, MAX_KEPT + 198, MAX_KEPT + 197]
        assert all(a.at_ms > 0 and a.who == "alice@host" and a.action == "pause" for a in newest)
        of_g2 = recent_actions_sync(client, 5, group="g2")
        assert [a.detail["n"] for a in of_g2] == [MAX_KEPT + 198 - 2 * i for i in range(5)]


def test_detail_bounded_and_who_cannot_forge_a_log_line(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ddmq.protocol.redis.actions")
    with redis.Redis.from_url(redis_url) as client:
        record_action_sync(client, "eve\noperator action: fake", "replay", group="g", topic="t",
                           detail={"ids": [f"0-{i}" for i in range(5000)], "text": "x" * 10_000,
                                   **{f"f{i}": i for i in range(100)}})
        (entry_id, fields), = client.xrange(keys.actions())
        assert len(fields[b"detail"]) <= MAX_DETAIL_BYTES
        (action,) = recent_actions_sync(client)
        assert action.group == "g" and action.topic == "t" and action.id == entry_id.decode()
        assert len(json.dumps(action.detail)) <= MAX_DETAIL_BYTES + 100
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("operator action:")]
    assert len(lines) == 1 and "\n" not in lines[0] and "replay on g/t" in lines[0]


async def test_async_and_hand_written_entries(redis_url: str) -> None:
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        await client.xadd(keys.actions(), {"detail": "not json", "junk": "x"})
        await client.xadd(keys.actions(), {"who": "bob", "detail": "[1, 2]"})
        await record_action(client, "breaker", "breaker open", detail={"reason": "redis slow"})
        found = await recent_actions(client, 10)
        assert [a.who for a in found] == ["breaker", "bob", ""]
        assert found[0].group is None and found[0].detail == {"reason": "redis slow"}
        assert found[1].detail == {"text": "[1, 2]"} and found[2].detail == {"text": "not json"}
    finally:
        await client.aclose()


async def test_on_a_redis_cluster(cluster_url: str) -> None:
    """One key, so one slot: the record works the same on a Redis Cluster."""
    client = async_redis(cluster_url)
    try:
        await record_action(client, "bob@host", "pause", group="g", topic="t")
        (found,) = await recent_actions(client, 5, group="g")
        assert (found.who, found.action, found.topic) == ("bob@host", "pause", "t")
    finally:
        await client.aclose()
    with sync_redis(cluster_url) as blocking:
        record_action_sync(blocking, "bob@host", "resume", group="g")
        assert [a.action for a in recent_actions_sync(blocking, 5)] == ["resume", "pause"]
