"""An operator's pause holds a push chain (``AsyncHttp``) as it holds pulls: a real proxy, real Redis, a
real HTTP upstream. While the topic is paused nothing reaches the upstream, every message is read and
waits, and no attempt is counted; after the resume every message is pushed once, each key in order,
and every offset is committed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from aiohttp import web

from ddmq.actions.async_http import AsyncHttpAction
from ddmq.protocol.redis.pauses import pause_async, resume_async

from ..proxy.conftest import running_proxy
from ..support import until
from .conftest import Behaviour, Upstream, keyed, produce, push_config, readers_started, wait_all_finished


async def accept(upstream: Upstream, key: str, seq: int, attempt: int) -> web.Response:
    return web.Response(status=200, text="ok")


async def test_a_paused_push_chain_pushes_nothing_and_goes_on_in_order_after_the_resume(
    redis_url: str, redis_client: aioredis.Redis, upstream_factory: Callable[[Behaviour, int], Awaitable[Upstream]]
) -> None:
    upstream = await upstream_factory(accept, 2)
    keys_ = [f"k{i}" for i in range(20)]
    seqs = 5
    config = push_config([f"{upstream.url}/push"], max_in_flight=4)
    # a heartbeat of 100 ms: the proxy reads the pauses that often
    async with running_proxy(redis_url, config, leases={"claim_interval_ms": 100}) as service:
        [action] = [a for a in service.groups["g"].consumers["t"].chain if isinstance(a, AsyncHttpAction)]
        consumer = service.groups["g"].consumers["t"]
        buffer = service.groups["g"].buffer
        await readers_started(service)
        await pause_async(redis_client, "g", "t", "alice")
        await until("the proxy follows the pause", lambda: buffer.push_hold("t") is not None, 30)

        await produce(redis_url, keyed(keys_, seqs))
        total = len(keys_) * seqs
        # Everything read; each worker holds one key's head and the other heads wait behind them: from
        # here nothing can be pushed until the resume.
        await until("every message read", lambda: consumer.counters["read"] == total, 30)
        await until("every worker held by the pause", lambda: action.held == 4, 30)
        assert upstream.requests == [] and action.in_flight == 0
        assert all(job.attempts == 0 for _, job in consumer.blocking_queue.heads())

        await resume_async(redis_client, "g", "t")
        await wait_all_finished(service)
        assert action.held == 0
    assert len(upstream.requests) == total
    assert set(upstream.attempts.values()) == {1}  # each pushed once: the pause counted no attempt
    assert upstream.checker.violations == []  # each key in order
    assert upstream.checker.missing({key: seqs for key in keys_}) == {}  # none lost
