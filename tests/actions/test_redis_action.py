"""The Redis action against the real Redis: commands, TTLs, conditions, per-key order (last write wins
only if order held), refused commands and an unreachable Redis going through retries to dead letters."""

from __future__ import annotations

import json
from typing import Any

import redis.asyncio as aioredis

from ddmq.protocol.net import free_port

from ..proxy.conftest import running_proxy
from .conftest import dead_letters, produce, wait_all_finished


def redis_chain(url: str, commands: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "actions": ["Json", "Order", "Redis"],
        "order_key": "$.rider",
        "max_retry": 1,
        "retry_intervals_ms": [20],
        "redis_action": {"url": url, "commands": commands, "batch_size": 8, "max_in_flight": 2, **extra},
    }


COMMANDS = [
    {"command": "set", "key": "last:{$.rider}", "value": "$.event", "ttl_ms": 600_000},
    {"command": "set", "key": "seq:{$.rider}", "value": "$.seq"},
    {"command": "hset", "key": "{rider:{$.rider}}", "fields": {"event": "$.event", "seq": "$.seq", "no": "$.nope"}},
    {
        "command": "hmset",
        "key": "trip:{$.trip.id}",
        "fields": {"rider": "$.rider", "trip": "$.trip"},
        "ttl_ms": 600_000,
        "when": "$.trip.id != null",
    },
    {"command": "del", "key": "pending:{$.rider}", "when": "$.event == 'pay'"},
]


async def test_commands_land_in_key_order(redis_url: str, redis_client: aioredis.Redis) -> None:
    riders = [f"r{i}" for i in range(30)]
    events = ["call", "pickup", "pay"]
    for rider in riders:
        await redis_client.set(f"pending:{rider}", "1")
    async with running_proxy(redis_url, redis_chain(redis_url, COMMANDS)) as service:
        messages = []
        for seq in range(30):
            for rider in riders:
                body: dict[str, Any] = {"rider": rider, "seq": seq, "event": events[seq % 3]}
                if seq == 0:
                    body["trip"] = {"id": f"t-{rider}", "km": 3.5}
                messages.append((rider, body))
        await produce(redis_url, messages)
        await wait_all_finished(service)
        counters = service.groups["g"].consumers["t"].counters
        assert counters["pushed"] == 900 and counters["push_failed"] == 0
    for rider in riders:
        # Every write of a rider went to the same keys: only in-order writes leave the last one there.
        assert await redis_client.get(f"seq:{rider}") == b"29"
        assert await redis_client.get(f"last:{rider}") == b"pay"
        assert 0 < await redis_client.pttl(f"last:{rider}") <= 600_000
        assert await redis_client.pttl(f"seq:{rider}") == -1
        assert await redis_client.hgetall(f"{{rider:{rider}}}") == {b"event": b"pay", b"seq": b"29"}
        assert await redis_client.hgetall(f"trip:t-{rider}") == {
            b"rider": rider.encode(),
            b"trip": json.dumps({"id": f"t-{rider}", "km": 3.5}, separators=(",", ":")).encode(),
        }
        assert await redis_client.pttl(f"trip:t-{rider}") > 0
        assert await redis_client.exists(f"pending:{rider}") == 0
    assert await dead_letters(redis_client) == []


async def test_refused_and_unbuildable_commands_are_dead_lettered(redis_url: str, redis_client: aioredis.Redis) -> None:
    await redis_client.set("{rider:bad}", "a string, so HSET is refused (WRONGTYPE)")
    async with running_proxy(redis_url, redis_chain(redis_url, COMMANDS)) as service:
        await produce(
            redis_url,
            [
                ("bad", {"rider": "bad", "seq": 0, "event": "call"}),
                ("bad", {"rider": "bad", "seq": 1, "event": "pickup"}),
                ("", {"seq": 0, "event": "call"}),  # no rider: its keys cannot be built
                ("ok", {"rider": "ok", "seq": 0, "event": "call"}),
            ],
        )
        await wait_all_finished(service)
    dead = sorted(await dead_letters(redis_client), key=lambda d: (d["k"], d["offset"]))
    assert [(d["k"], json.loads(d["v"]).get("seq"), d["attempts"]) for d in dead] == [
        ("", 0, "1"),
        ("bad", 0, "2"),
        ("bad", 1, "2"),
    ]
    assert "needs a value the body lacks" in dead[0]["error"]
    assert "WRONGTYPE" in dead[1]["error"]
    # SET ran before the refused HSET in the same pipeline (no transaction): the write is at-least-once.
    assert await redis_client.get("seq:ok") == b"0"


async def test_unreachable_redis_retries_then_dead_letters_in_key_order(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    config = redis_chain(f"redis://127.0.0.1:{free_port()}/0", COMMANDS[:1], timeout_ms=500)
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("a", {"rider": "a", "seq": i, "event": "e"}) for i in range(3)])
        await wait_all_finished(service)
    dead = await dead_letters(redis_client)
    assert [json.loads(d["v"])["seq"] for d in dead] == [0, 1, 2]
    assert all(d["attempts"] == "2" and "Redis pipeline failed" in d["error"] for d in dead)
