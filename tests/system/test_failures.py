"""Failures that keep a key's story whole (docs/failures.md), over Thrift and over HTTP alike.

Each case runs once per adapter against a real proxy, real Redis and real sockets: the client verbs
(fail details with a retry delay and a reason, release, extend), ``on_exhausted: park`` across a
kill -9 and a lease hand-off, the operator's key actions through the admin API, and
``on_exhausted: dead_letter_key`` keeping every rider's call -> pickup -> pay in order through
dead-lettering and a replay of the key.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import pytest
import redis.asyncio

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.proxy.service import ProxyService

from ..http_support import ApiClient, OpenApiChecker
from ..support import ProxyProcess
from .test_adapters import ADAPTERS, GUARD_S, HttpWire, ThriftWire, Wire, proxy

pytestmark = pytest.mark.parametrize("adapter", ADAPTERS)


class Msg(NamedTuple):
    qid: int
    offset: int
    key: str
    value: str


class Verbs(NamedTuple):
    """One queue's results, the verbs included (fields 80-82 / release, extend, fail_details)."""

    qid: int
    success: list[int] = []
    fail: list[int] = []
    release: list[int] = []
    extend: list[int] = []
    fail_details: list[tuple[int, int | None, str | None]] = []


async def pull(client: Wire, results: list[Verbs] = (), linger_ms: int = 0, max_batch: int = 16,  # type: ignore[assignment]
               topic: str = "t") -> list[Msg]:
    """A pull carrying ``results``; the messages it answers."""
    if isinstance(client, ThriftWire):
        request = wire.PullRequest(groupId="g", topic=topic, maxBatchSize=max_batch, maxLingerTime=linger_ms,
                                   result=_thrift_results(results, topic))
        async with asyncio.timeout(GUARD_S + linger_ms / 1000):
            response = await client._client.pull(request)
        qid = int(response.context.qid) if response.context.qid else -1
        return [Msg(qid, m.offset, m.key, m.value.decode()) for m in response.messages]
    assert isinstance(client, HttpWire)
    body: dict[str, Any] = {"group": "g", "topic": topic, "max_batch": max_batch, "linger_ms": linger_ms,
                            "results": _json_results(results, topic)}
    async with asyncio.timeout(GUARD_S + linger_ms / 1000):
        status, answer = await client._api.call("POST", "/v1/pull", json=body)
    assert status == 200, answer
    return [Msg(answer["qid"], m["offset"], m["key"], base64.b64decode(m["value_base64"]).decode())
            for m in answer["messages"]]


def _thrift_results(results: list[Verbs], topic: str) -> wire.ConsumeResult | None:
    return wire.link_results([
        wire.ConsumeResult(
            wire.Context("g", topic, str(r.qid)), r.success, r.fail,
            releaseOffsets=r.release or None, extendOffsets=r.extend or None,
            failDetails=[wire.FailDetail(o, after, reason) for o, after, reason in r.fail_details] or None,
        )
        for r in results
    ])


def _json_results(results: list[Verbs], topic: str) -> list[dict[str, Any]]:
    nodes = []
    for r in results:
        node: dict[str, Any] = {"topic": topic, "qid": r.qid, "success": r.success, "fail": r.fail}
        if r.release:
            node["release"] = r.release
        if r.extend:
            node["extend"] = r.extend
        if r.fail_details:
            node["fail_details"] = [{"offset": o, "retry_after_ms": a, "reason": why} for o, a, why in r.fail_details]
        nodes.append(node)
    return nodes


async def submit(client: Wire, results: list[Verbs], topic: str = "t") -> None:
    """Results without a pull (Thrift ``submit``, HTTP ``/v1/ack``)."""
    async with asyncio.timeout(GUARD_S):
        if isinstance(client, ThriftWire):
            assert await client._client.submit(_thrift_results(results, topic)) is True
        else:
            assert isinstance(client, HttpWire)
            status, _ = await client._api.call("POST", "/v1/ack",
                                               json={"group": "g", "results": _json_results(results, topic)})
            assert status == 200


async def admin(service_port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    path, _, query = path.partition("?")
    params = dict(part.split("=", 1) for part in query.split("&")) if query else None
    async with aiohttp.ClientSession() as session:
        api = ApiClient(session, f"http://127.0.0.1:{service_port}", OpenApiChecker())
        return await api.call(method, path, json=body, params=params)


def produce(redis_url: str, messages: list[tuple[str, str]], topic: str = "t") -> None:
    with Producer(redis_url) as producer:
        producer.send_batch(topic, [{"key": key, "value": value} for key, value in messages])


async def drain(client: Wire, want: int, handle: Any, *, seconds: float = GUARD_S) -> list[Msg]:
    """Pull until ``want`` messages were handed to ``handle(msg) -> Verbs-ish action``; returns them."""
    seen: list[Msg] = []
    results: list[Verbs] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while len(seen) < want:
        assert loop.time() < deadline, f"only {len(seen)} of {want} messages: {seen}"
        messages = await pull(client, results, linger_ms=200)
        results = []
        for m in messages:
            seen.append(m)
            verbs = handle(m)  # None: left in flight
            if verbs is not None:
                results.append(verbs)
    if results:
        await submit(client, results)
    return seen


def ack(m: Msg) -> Verbs:
    return Verbs(m.qid, success=[m.offset])


# client verbs --------------------------------------------------------------------------------------


async def test_retry_after_ms_is_honoured_and_the_reason_kept(adapter: str, redis_url: str) -> None:
    config = {"order_key": "KEY", "max_retry": 3, "retry_intervals_ms": [10], "max_retry_after_ms": 5000}
    async with proxy(adapter, redis_url, config) as (service, client):
        produce(redis_url, [("k", "v")])
        [m] = await drain(client, 1, lambda m: None)
        loop = asyncio.get_running_loop()
        asked = loop.time()
        assert await pull(client, [Verbs(m.qid, fail_details=[(m.offset, 1000, "payment service said no")])]) == []
        status, keys = await admin(service.http_port, "GET", "/admin/groups/g/topics/t/keys?state=failing")
        assert status == 200 and keys["counts"]["failing"] == 1
        assert keys["keys"][0]["reason"] == "payment service said no" and keys["keys"][0]["attempts"] == 1
        again: list[Msg] = []
        while not again:
            assert loop.time() - asked < 3, "not redelivered"
            again = await pull(client, linger_ms=100)
        waited = loop.time() - asked
        assert again[0].offset == m.offset
        assert 0.8 <= waited <= 1.2, f"redelivered after {waited:.3f} s, asked for 1.000 s"
        # A delay past max_retry_after_ms is cut to it; a reason past 1 KiB is cut to 1 KiB.
        await pull(client, [Verbs(m.qid, fail_details=[(m.offset, 10_000_000, "x" * 5000)])])
        status, keys = await admin(service.http_port, "GET", "/admin/groups/g/topics/t/keys?key=k")
        assert keys["keys"][0]["reason"] == "x" * 1024


async def test_an_extended_message_is_not_redelivered_while_its_handler_runs(adapter: str, redis_url: str) -> None:
    timeout_ms = 300
    config = {"order_key": "KEY", "timeout_ms": timeout_ms, "max_retry": 0, "retry_intervals_ms": [10]}
    async with proxy(adapter, redis_url, config) as (service, client):
        produce(redis_url, [("k", "v"), ("k", "w")])
        [m] = await pull(client, linger_ms=2000)
        loop = asyncio.get_running_loop()
        started = loop.time()
        while loop.time() - started < 3 * timeout_ms / 1000:  # the handler runs 3 x timeout_ms
            assert await pull(client, [Verbs(m.qid, extend=[m.offset])], linger_ms=timeout_ms // 3) == []
        [n] = await pull(client, [ack(m)], linger_ms=2000)
        assert (n.key, n.value) == ("k", "w")
        await submit(client, [ack(n)])
        stats = service.groups["g"].buffer.stats
        assert stats.timed_out == 0 and stats.dead_lettered == 0 and stats.extended >= 4


async def test_a_released_message_counts_no_attempt(adapter: str, redis_url: str) -> None:
    # max_retry 0: any attempt counted against it would dead-letter the message at once.
    config = {"order_key": "KEY", "max_retry": 0, "retry_intervals_ms": [10], "max_pull_batch_size": 1}
    async with proxy(adapter, redis_url, config) as (service, client):
        produce(redis_url, [("k", "first"), ("k", "second"), ("other", "x")])
        released = 0
        results: list[Verbs] = []
        got: list[str] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + GUARD_S
        while "second" not in got:
            assert loop.time() < deadline, got
            messages = await pull(client, results, linger_ms=500, max_batch=1)
            results = []
            for m in messages:
                if m.value == "first" and released < 10:
                    released += 1  # given back: it must come back first in its key, uncounted
                    results.append(Verbs(m.qid, release=[m.offset]))
                else:
                    got.append(m.value)
                    results.append(ack(m))
        await submit(client, results)
        assert got.index("first") < got.index("second") and released == 10
        # a release or an extension of a message not in flight to the group is ignored and counted
        await submit(client, [Verbs(0, release=[1, 99]), Verbs(1, extend=[1])])
        stats = service.groups["g"].buffer.stats
        assert stats.dead_lettered == 0 and stats.released == 10 and stats.failed == 0
        assert stats.ignored_verbs == 3 and stats.extended == 0


async def test_a_client_without_the_new_fields_sees_todays_behaviour(adapter: str, redis_url: str) -> None:
    config = {"order_key": "KEY", "max_retry": 1, "retry_intervals_ms": [300], "on_exhausted": "dead_letter"}
    async with proxy(adapter, redis_url, config) as (service, client):
        produce(redis_url, [("k", "a"), ("k", "b")])
        [m] = await pull(client, linger_ms=2000)
        loop = asyncio.get_running_loop()
        failed_at = loop.time()
        assert await pull(client, [Verbs(m.qid, fail=[m.offset])]) == []
        [again] = await pull(client, linger_ms=2000)
        assert again.offset == m.offset and loop.time() - failed_at >= 0.3  # the group's retry interval
        [n] = await pull(client, [Verbs(m.qid, fail=[m.offset])], linger_ms=2000)  # past max_retry: moves on
        assert n.value == "b"
        await submit(client, [ack(n)])
        status, letters = await admin(service.http_port, "GET", "/admin/groups/g/topics/t/dead-letters")
        assert status == 200
        assert [(e["value_text"], e["error"]) for e in letters["entries"]] == [("a", "client reported failure")]
        stats = service.groups["g"].buffer.stats
        assert (stats.released, stats.extended, stats.ignored_verbs) == (0, 0, 0)


# park ----------------------------------------------------------------------------------------------


def _rides_config(policy: str, **extra: Any) -> dict[str, Any]:
    return {"order_key": "KEY", "max_retry": 1, "retry_intervals_ms": [10], "on_exhausted": policy, **extra}


async def test_retry_and_skip_of_a_parked_key_through_the_admin_api(adapter: str, redis_url: str) -> None:
    async with proxy(adapter, redis_url, _rides_config("park")) as (service, client):
        produce(redis_url, [("rider-1", "call"), ("rider-1", "pickup"), ("rider-1", "pay"),
                            ("rider-2", "call"), ("rider-2", "pickup")])

        def poison(m: Msg) -> Verbs:
            if m.key == "rider-1" and m.value == "call":
                return Verbs(m.qid, fail_details=[(m.offset, None, "boom")])
            return ack(m)

        seen = await drain(client, 2 + 2, poison)  # rider-1's call twice (max_retry 1), rider-2's two
        assert [m.value for m in seen if m.key == "rider-1"] == ["call", "call"]
        keys_url = "/admin/groups/g/topics/t/keys"
        status, keys = await admin(service.http_port, "GET", keys_url + "?state=parked")
        assert status == 200 and keys["counts"]["parked"] == 1
        [row] = keys["keys"]
        assert (row["key"], row["state"], row["reason"], row["waiting"]) == ("rider-1", "parked", "boom", 2)
        assert await pull(client, linger_ms=300) == []  # its successors wait, uncounted
        # retry: the head comes again, attempts reset; it fails twice more and parks again
        status, acted = await admin(service.http_port, "POST", keys_url + "/retry", {"key": "rider-1", "by": "ops"})
        assert status == 200 and acted["applied"][0]["state"] == "waiting"
        again = await drain(client, 2, poison)
        assert [m.value for m in again] == ["call", "call"]
        # skip: dead-lettered in the name of who asked, the key moves on in order
        status, acted = await admin(service.http_port, "POST", keys_url + "/skip", {"key": "rider-1", "by": "alice"})
        assert status == 200 and acted["key"] == "rider-1"
        rest = await drain(client, 2, ack)
        assert [m.value for m in rest] == ["pickup", "pay"]
        status, letters = await admin(service.http_port, "GET", "/admin/groups/g/topics/t/dead-letters")
        assert [e["error"] for e in letters["entries"]] == ["skipped by alice"]
        status, _ = await admin(service.http_port, "POST", keys_url + "/retry", {"key": "nobody"})
        assert status == 404


async def test_park_holds_a_key_across_a_kill_and_a_lease_handoff(adapter: str, redis_url: str, tmp_path: Path) -> None:
    http_port = _free_port()
    process = ProxyProcess(
        tmp_path, redis_url, {"g": {"t": _rides_config("park")}}, {"t": {"queues": 2}},
        http={"enabled": True, "port": http_port, "host": "127.0.0.1"},
        leases={"ttl_ms": 1000, "renew_ms": 200},
    ).start()
    try:
        await _listening(http_port)
        produce(redis_url, [("rider-1", "call"), ("rider-1", "pickup"), ("rider-2", "call")])
        async with _client(adapter, process.port, http_port) as client:
            seen = await drain(client, 3, lambda m: Verbs(m.qid, fail=[m.offset]) if m.key == "rider-1" else ack(m))
            assert sorted(m.value for m in seen if m.key == "rider-1") == ["call", "call"]
            await _wait_parked(redis_url, "rider-1")
        process.kill()
        process.start()
        await _listening(http_port)
        async with _client(adapter, process.port, http_port) as client:
            produce(redis_url, [("rider-2", "pickup")])
            after_kill: list[Msg] = []
            while ("rider-2", "pickup") not in [(m.key, m.value) for m in after_kill]:
                # acks the dead proxy had not committed come again (at least once); rider-1 must not
                after_kill += await drain(client, 1, ack)
            assert [m for m in after_kill if m.key == "rider-1"] == []
            assert await pull(client, linger_ms=500) == []  # rider-1 stays parked after the kill
        status, keys = await admin(http_port, "GET", "/admin/groups/g/topics/t/keys?key=rider-1")
        assert keys["keys"][0]["state"] == "parked" and keys["keys"][0]["head_offset"] is not None
        # a lease hand-off: another proxy takes the queues over when this one stops
        async with proxy(adapter, redis_url, _rides_config("park"), queues=2, instance_id="taker",
                         leases={"ttl_ms": 1000, "renew_ms": 200}) as (taker, client):
            process.stop()
            await _wait_held(taker, 2)
            assert await pull(client, linger_ms=500) == []
            status, keys = await admin(taker.http_port, "GET", "/admin/groups/g/topics/t/keys?key=rider-1")
            assert keys["keys"][0]["state"] == "parked" and keys["keys"][0]["waiting"] == 1
            status, acted = await admin(taker.http_port, "POST", "/admin/groups/g/topics/t/keys/resume",
                                        {"key": "rider-1"})
            assert status == 200 and acted["applied"] == [{"qid": 1, "state": "waiting"}]
            rest = await drain(client, 2, ack)
            assert [m.value for m in rest] == ["call", "pickup"]
    finally:
        process.stop()


async def test_any_proxy_shows_and_acts_on_a_key_another_proxy_holds(adapter: str, redis_url: str) -> None:
    config = _rides_config("park")
    leases = {"ttl_ms": 4000, "renew_ms": 300}  # long enough that a loaded machine does not move queues
    async with proxy(adapter, redis_url, config, queues=2, instance_id="a", leases=leases) as (a, client_a), \
            proxy(adapter, redis_url, config, queues=2, instance_id="b", leases=leases) as (b, client_b):
        await _wait_split(a, b)
        holder, other = (client_a, b) if 1 in a.groups["g"].consumers["t"].held else (client_b, a)
        key = next(f"rider-{i}" for i in range(100) if queue_for_key(f"rider-{i}", 2) == 1)
        produce(redis_url, [(key, "call"), (key, "pickup")])
        await drain(holder, 2, lambda m: Verbs(m.qid, fail=[m.offset]))  # twice: parked
        keys_url = "/admin/groups/g/topics/t/keys"
        status, keys = await admin(other.http_port, "GET", keys_url + "?state=parked")
        assert status == 200 and [(r["key"], r["qid"], r["waiting"]) for r in keys["keys"]] == [(key, 1, 1)], (
            keys, a.groups["g"].consumers["t"].held, b.groups["g"].consumers["t"].held)
        status, acted = await admin(other.http_port, "POST", keys_url + "/skip", {"key": key, "by": "bob"})
        assert status == 200 and acted["applied"] == [{"qid": 1, "state": "waiting"}]
        rest = await drain(holder, 1, ack)
        assert [m.value for m in rest] == ["pickup"]


# dead_letter_key -----------------------------------------------------------------------------------


async def test_dead_letter_key_keeps_every_riders_story_in_order_through_a_replay(
    adapter: str, redis_url: str
) -> None:
    riders = [f"rider-{i}" for i in range(30)]
    broken = set(riders[::5])  # their pickup fails past max_retry until "fixed"
    story = ("call", "pickup", "pay")
    async with proxy(adapter, redis_url, _rides_config("dead_letter_key")) as (service, client):
        produce(redis_url, [(rider, event) for event in story for rider in riders])
        processed: dict[str, list[str]] = {rider: [] for rider in riders}
        fixed = False

        def handle(m: Msg) -> Verbs:
            if m.key in broken and m.value == "pickup" and not fixed:
                return Verbs(m.qid, fail_details=[(m.offset, None, "pickup failed")])
            processed[m.key].append(m.value)
            return ack(m)

        good = 3 * (len(riders) - len(broken)) + len(broken) * (1 + 2)  # broken: call, pickup twice
        await drain(client, good, handle)
        letters_url = "/admin/groups/g/topics/t/dead-letters"

        async def dead() -> int:
            return (await admin(service.http_port, "GET", letters_url))[1]["total"]

        loop = asyncio.get_running_loop()
        deadline = loop.time() + GUARD_S
        while await dead() < 2 * len(broken):  # every broken rider's pickup and pay, sequenced
            assert loop.time() < deadline
            await asyncio.sleep(0.05)
        assert all(processed[r] == ["call"] for r in broken)
        fixed = True
        for rider in sorted(broken):
            status, answer = await admin(service.http_port, "POST", letters_url + "/replay", {"key": rider})
            assert status == 200 and answer["replayed"] == 2
        await drain(client, 2 * len(broken), handle)
        assert processed == {rider: list(story) for rider in riders}  # in order, none lost
        assert await dead() == 0


# helpers -------------------------------------------------------------------------------------------


def _free_port() -> int:
    return free_port()


@asynccontextmanager
async def _client(adapter: str, thrift_port: int, http_port: int) -> AsyncIterator[Wire]:
    if adapter == "thrift":
        async with AsyncProxyClient("127.0.0.1", thrift_port, timeout_s=GUARD_S) as c:
            yield ThriftWire(c)
    else:
        async with aiohttp.ClientSession() as session:
            yield HttpWire(ApiClient(session, f"http://127.0.0.1:{http_port}", OpenApiChecker()))


async def _listening(port: int) -> None:
    """ProxyProcess waits for the Thrift port; the HTTP server may open a moment later."""
    for _ in range(400):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise AssertionError(f"nothing listens on {port}")


async def _wait_parked(redis_url: str, key: str) -> None:
    async with redis.asyncio.Redis.from_url(redis_url) as r:
        for _ in range(200):
            raw = await r.hgetall(keys.parked_keys("g", "t"))
            if any(json.loads(v)["key"] == key and json.loads(v)["offset"] for v in raw.values()):
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{key} not parked in Redis")


async def _wait_split(a: ProxyService, b: ProxyService) -> None:
    """Until each proxy holds one queue, the same one for a second (a hand-off may still be moving)."""
    stable = 0
    last: tuple[int, ...] = ()
    for _ in range(600):
        held = (*a.groups["g"].consumers["t"].held, *b.groups["g"].consumers["t"].held)
        stable = stable + 1 if held == last and len(held) == 2 and len(set(held)) == 2 else 0
        if stable >= 20:
            return
        last = held
        await asyncio.sleep(0.05)
    raise AssertionError("the two proxies did not split the queues")


async def _wait_held(service: ProxyService, queues: int) -> None:
    for _ in range(400):
        if len(service.groups["g"].consumers["t"].held) == queues:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the queues were not taken over")

