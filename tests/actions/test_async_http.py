"""AsyncHttp against a real aiohttp server that is slow, fails, times out and answers non-2xx.

Checked: per-key order (the next message of a key reaches the server only after the previous one was
answered 2xx or dead-lettered), every message finished (committed offsets reach produce offsets),
retries and dead letters as configured, requests in flight never above ``max_in_flight``, and no task
per message.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

import redis.asyncio as aioredis
from aiohttp import web

from ddmq.actions.async_http import AsyncHttpAction
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys

from ..proxy.conftest import running_proxy
from .conftest import (
    Behaviour,
    Upstream,
    dead_letters,
    keyed,
    produce,
    proxy_tasks,
    push_config,
    readers_started,
    wait_all_finished,
)


async def mixed(upstream: Upstream, key: str, seq: int, attempt: int) -> web.Response:
    kind = key.split("-")[0]
    if kind == "slow":
        await asyncio.sleep(0.03)
    elif kind == "flaky" and seq == 3 and attempt <= 2:
        return web.Response(status=500, text="try again")
    elif kind == "missing" and seq == 1 and attempt == 1:
        return web.Response(status=404, text="no such thing")
    elif kind == "moved" and seq == 2 and attempt == 1:
        return web.Response(status=302, headers={"Location": "/elsewhere"})
    elif kind == "dead" and seq == 5:
        return web.Response(status=503, text="down for good")
    elif kind == "stuck" and seq == 2 and attempt == 1:
        await asyncio.sleep(2.5)  # past timeout_ms: the proxy gives up on this attempt
    return web.Response(status=200, text="ok")


async def test_order_retries_dead_letters_and_bounded_concurrency(
    redis_url: str, redis_client: aioredis.Redis, upstream_factory: Callable[[Behaviour, int], Awaitable[Upstream]]
) -> None:
    upstream = await upstream_factory(mixed, 2)
    kinds = ["slow", "flaky", "missing", "moved", "dead", "stuck", "plain"]
    all_keys = [f"{kind}-{i}" for kind in kinds for i in range(4)]
    seqs = 8
    # A generous timeout: only the "stuck" attempts may pass it, even on a loaded machine (a normal answer
    # the proxy gave up on would be pushed again: allowed, but not what this test counts).
    config = push_config([f"{upstream.url}/a", f"{upstream.url}/b"], timeout_ms=2000, max_in_flight=4)
    async with running_proxy(redis_url, config) as service:
        [action] = [a for a in service.groups["g"].consumers["t"].chain if isinstance(a, AsyncHttpAction)]
        await readers_started(service)
        baseline_tasks = proxy_tasks()
        most_tasks = most_in_flight = 0
        producing = asyncio.create_task(produce(redis_url, keyed(all_keys, seqs)))
        finishing: asyncio.Task[None] | None = None
        while finishing is None or not finishing.done():
            if finishing is None and producing.done():
                finishing = asyncio.create_task(wait_all_finished(service))
            most_tasks = max(most_tasks, proxy_tasks())
            most_in_flight = max(most_in_flight, action.in_flight)
            await asyncio.sleep(0.005)
        await producing
        await finishing
        await asyncio.sleep(0.1)  # one commit interval: the committed offsets too
        for qid in range(4):
            committed = await redis_client.get(keys.committed("g", "t", qid))
            produced = await redis_client.get(keys.sequence("t", qid))
            assert int(committed) == int(produced) + 1
        consumer = service.groups["g"].consumers["t"]
        assert consumer.unfinished == 0

    checker = upstream.checker
    assert checker.violations == []
    assert checker.missing({key: seqs for key in all_keys}) == {}
    # Server-side concurrency is checked in the next test: here the server keeps running the handlers
    # of attempts the proxy gave up on (timeouts), so only the proxy's own count is meaningful.
    assert 1 < most_in_flight <= 4, "max_in_flight bounds the requests to the upstream"
    # The test's producer and waiter, the committer's flush, a dead-letter write per dead key, aiohttp's
    # helper tasks (a few per request in flight): nothing near one task per message (224 here).
    assert most_tasks - baseline_tasks <= 2 + 1 + 4 + 3 * 4
    # Retries as configured: flaky needed 3 attempts, 404/302/timeout 2, dead ones 1 + max_retry.
    for i in range(4):
        assert upstream.attempts[f"flaky-{i}", 3] == 3
        assert upstream.attempts[f"missing-{i}", 1] == 2
        assert upstream.attempts[f"moved-{i}", 2] == 2
        assert upstream.attempts[f"stuck-{i}", 2] == 2
        assert upstream.attempts[f"dead-{i}", 5] == 3
        assert upstream.attempts[f"plain-{i}", 7] == 1
    assert upstream.paths["/elsewhere"] == 0, "3xx is a failed attempt, not followed"
    assert upstream.paths["/a"] > 0 and upstream.paths["/b"] > 0, "urls are used round-robin"
    dead = await dead_letters(redis_client)
    assert sorted(json.loads(d["v"])["k"] for d in dead) == [f"dead-{i}" for i in range(4)]
    for entry in dead:
        assert json.loads(entry["v"])["seq"] == 5
        assert entry["attempts"] == "3"
        assert "HTTP 503" in entry["error"] and "down for good" in entry["error"]


async def test_slow_upstream_backpressure(
    redis_url: str, upstream_factory: Callable[[Behaviour, int], Awaitable[Upstream]]
) -> None:
    async def slow(upstream: Upstream, key: str, seq: int, attempt: int) -> web.Response:
        await asyncio.sleep(0.01)
        return web.Response(status=204)

    upstream = await upstream_factory(slow, 0)
    all_keys = [f"k{i}" for i in range(50)]
    config = {**push_config([upstream.url], max_in_flight=3), "concurrency": 40, "read_batch_size": 16}
    async with running_proxy(redis_url, config) as service:
        consumer = service.groups["g"].consumers["t"]
        [action] = [a for a in consumer.chain if isinstance(a, AsyncHttpAction)]
        await produce(redis_url, keyed(all_keys, 6))
        await readers_started(service)
        baseline_tasks = proxy_tasks()
        most_unfinished = most_waiting = most_tasks = 0
        finishing = asyncio.create_task(wait_all_finished(service))
        while not finishing.done():
            most_unfinished = max(most_unfinished, consumer.unfinished)
            most_waiting = max(most_waiting, action.waiting)
            most_tasks = max(most_tasks, proxy_tasks())
            assert action.in_flight <= 3
            await asyncio.sleep(0.005)
        await finishing
    assert upstream.checker.violations == []
    assert upstream.checker.missing({key: 6 for key in all_keys}) == {}
    # However the readers' reads land, unfinished jobs never pass concurrency (docs/design/engine.md, "Push actions").
    assert most_unfinished <= 40, "readers stop at concurrency"
    assert most_waiting <= most_unfinished
    assert upstream.max_in_flight <= 3
    # The waiter, the committer's flush, and aiohttp's helper tasks (a body writer per request, which may
    # outlive its request a moment): a few per request in flight, not one per message (300 here).
    assert most_tasks - baseline_tasks <= 1 + 1 + 3 * 3


async def test_request_shape_form_query_token_headers(
    redis_url: str, upstream_factory: Callable[[Behaviour, int], Awaitable[Upstream]]
) -> None:
    async def ok(upstream: Upstream, key: str, seq: int, attempt: int) -> web.Response:
        return web.Response(status=200)

    upstream = await upstream_factory(ok, 0)
    config = push_config(
        [f"{upstream.url}/hook"],
        method="PUT",
        body="form",
        query_params={"order": "$.order.id", "absent": "$.nope"},
        headers={"X-Source": "ddmq-test"},
        token="s3cret",
    )
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("o1", {"k": "o1", "seq": 0, "order": {"id": 42}, "note": "héllo"})])
        await wait_all_finished(service)
    [request] = upstream.requests
    assert request.method == "PUT"
    assert dict(request.query) == {"order": "42"}
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["X-Source"] == "ddmq-test"
    assert request.headers["X-Ddmq-Topic"] == "t" and request.headers["X-Ddmq-Group"] == "g"
    assert request.headers["X-Ddmq-Offset"] == "1"
    assert request.content_type == "application/x-www-form-urlencoded"
    form = parse_qs(upstream.bodies[0].decode())
    assert form == {"k": ["o1"], "seq": ["0"], "order": ['{"id":42}'], "note": ["héllo"]}


async def test_unpushable_message_is_dead_lettered_at_once_and_its_key_moves_on(
    redis_url: str, redis_client: aioredis.Redis, upstream_factory: Callable[[Behaviour, int], Awaitable[Upstream]]
) -> None:
    async def ok(upstream: Upstream, key: str, seq: int, attempt: int) -> web.Response:
        return web.Response(status=200)

    upstream = await upstream_factory(ok, 3)
    config = {**push_config([upstream.url], body="form"), "order_key": "KEY", "max_retry": 3}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("a", "[1, 2]"), ("a", {"k": "a", "seq": 1})])
        await wait_all_finished(service)
    [dead] = await dead_letters(redis_client)
    assert dead["v"] == "[1, 2]" and dead["attempts"] == "1"
    assert "JSON object" in dead["error"]
    assert upstream.attempts == Counter({("a", 1): 1})


async def test_unreachable_upstream_dead_letters_after_the_retries(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    config = {**push_config([f"http://127.0.0.1:{free_port()}/"], timeout_ms=500), "order_key": "KEY"}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("a", {"n": 1}), ("a", {"n": 2}), ("b", {"n": 3})])
        await wait_all_finished(service)
    dead = await dead_letters(redis_client)
    assert [json.loads(d["v"])["n"] for d in dead if d["k"] == "a"] == [1, 2], "dead-lettered in key order"
    assert len(dead) == 3
    assert all(d["attempts"] == "3" and "failed" in d["error"] for d in dead)


async def test_credentials_in_a_push_url_stay_out_of_errors(redis_url: str, redis_client: aioredis.Redis) -> None:
    """An upstream URL with a password: its failures (refused, and non-2xx) name it masked."""
    refused = f"http://pusher:s3cret-pw@127.0.0.1:{free_port()}/"
    config = {**push_config([refused], timeout_ms=500), "order_key": "KEY"}
    async with running_proxy(redis_url, config) as service:
        await produce(redis_url, [("a", {"n": 1})])
        await wait_all_finished(service)
    (dead,) = await dead_letters(redis_client)
    assert "s3cret-pw" not in dead["error"] and "pusher:***@127.0.0.1" in dead["error"], dead["error"]
