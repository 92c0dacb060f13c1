"""A push group whose queues move: a second proxy joins while the first is pushing to a real HTTP
server. Every message reaches the server, each key in order (a key may be replayed from its committed
point once, when its queue moves), and committed offsets end equal to produce offsets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from ddmq.protocol.redis import keys

from ..proxy.conftest import running_proxy
from .conftest import Behaviour, Upstream, keyed, produce, push_config

LEASES = {"ttl_ms": 1500, "renew_ms": 400, "claim_interval_ms": 100, "handoff_drain_ms": 300}


async def all_committed(redis_client: aioredis.Redis, queues: int) -> bool:
    for qid in range(queues):
        committed = await redis_client.get(keys.committed("g", "t", qid))
        produced = await redis_client.get(keys.sequence("t", qid))
        if produced is not None and (committed is None or int(committed) != int(produced) + 1):
            return False
    return True


async def test_push_keeps_order_and_loses_nothing_when_queues_move(
    redis_url: str, redis_client: aioredis.Redis, upstream_factory: Callable[[Behaviour, int], Awaitable[Upstream]]
) -> None:
    async def slowish(upstream: Upstream, key: str, seq: int, attempt: int) -> web.Response:
        await asyncio.sleep(0.002)
        return web.Response(status=200)

    upstream = await upstream_factory(slowish, 0)
    upstream.epochs = {"/a": 0, "/b": 1}  # B takes queues over from A: its deliveries are a new epoch
    all_keys = [f"k{i}" for i in range(40)]
    seqs = 25
    config_a = {**push_config([f"{upstream.url}/a"], max_in_flight=4), "max_retry": 0}
    config_b = {**push_config([f"{upstream.url}/b"], max_in_flight=4), "max_retry": 0}
    async with running_proxy(redis_url, config_a, instance_id="proxy-a", leases=LEASES) as proxy_a:
        producing = asyncio.create_task(produce(redis_url, keyed(all_keys, seqs)))
        async with asyncio.timeout(30):
            while upstream.paths["/a"] < 200:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        async with running_proxy(redis_url, config_b, instance_id="proxy-b", leases=LEASES):
            await producing
            async with asyncio.timeout(60):
                while not await all_committed(redis_client, 4):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            assert upstream.paths["/b"] > 0, "proxy B took queues over and pushed"
            assert set(proxy_a.groups["g"].consumers["t"].held) != {0, 1, 2, 3}
    checker = upstream.checker
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing({key: seqs for key in all_keys}) == {}


@pytest.mark.both_loops
async def test_pushes_cut_off_by_shutdown_are_pushed_again_after_restart(
    redis_url: str, redis_client: aioredis.Redis, upstream_factory: Callable[[Behaviour, int], Awaitable[Upstream]]
) -> None:
    release = asyncio.Event()

    async def hang_on_a(upstream: Upstream, key: str, seq: int, attempt: int) -> web.Response:
        if upstream.paths["/b"] == 0:  # only proxy A pushes so far: its requests get no answer
            await release.wait()
        return web.Response(status=200)

    upstream = await upstream_factory(hang_on_a, 0)
    upstream.epochs = {"/a": 0, "/b": 1}
    all_keys = [f"k{i}" for i in range(6)]
    try:
        config_a = {**push_config([f"{upstream.url}/a"], max_in_flight=4, timeout_ms=60_000)}
        async with running_proxy(redis_url, config_a, instance_id="proxy-a", leases=LEASES):
            await produce(redis_url, keyed(all_keys, 5))
            async with asyncio.timeout(30):
                while upstream.paths["/a"] < 4:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
        # A closed with 4 pushes unanswered: they stay unfinished, so uncommitted.
        assert not await all_committed(redis_client, 4)
        config_b = {**push_config([f"{upstream.url}/b"], max_in_flight=4)}
        async with running_proxy(redis_url, config_b, instance_id="proxy-b", leases=LEASES):
            async with asyncio.timeout(60):
                while not await all_committed(redis_client, 4):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
    finally:
        release.set()
    checker = upstream.checker
    assert upstream.paths["/a"] == 4, "A pushed only its 4 workers' heads, then stopped"
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing({key: 5 for key in all_keys}) == {}
