"""The proxy's Redis client (proxy/store/client.py) raises BrokerError for every failure of its commands,
pipelines and scripts, on one server and on a Cluster, and leaves what redis-py does inside a call alone:
the EVALSHA fallback, the one retry on a new connection, error replies inside a pipeline as values."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from ddmq.protocol.net import free_port
from ddmq.protocol.redis.connection import AsyncRedis, Deadlines, eval_script, eval_scripts
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.store.broker import ConnectionCounter, map_redis_errors
from ddmq.proxy.store.client import ScriptNotCachedError, broker_client, ping
from ddmq.proxy.store.embedded import EmbeddedRedis

#: A script that answers its first key's value.
GET_LUA = "return redis.call('GET', KEYS[1])"
QUICK = Deadlines(timeout_ms=2_000, connect_timeout_ms=1_000)


def client_of(url: str) -> AsyncRedis:
    return broker_client(url, QUICK, ConnectionCounter())


async def test_a_stopped_redis_fails_commands_pipelines_and_scripts_as_broker_errors(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "redis").start()
    client = client_of(server.url)
    try:
        await client.set("k", "v")
        server.stop()
        with pytest.raises(BrokerError, match=r"^redis failed on GET k: ") as raised:
            await client.get("k")
        assert isinstance(raised.value.__cause__, redis.ConnectionError)
        async with client.pipeline(transaction=False) as pipe:
            pipe.get("k")
            pipe.xlen("s")
            with pytest.raises(BrokerError, match=r"a pipeline of 2 commands \(GET k, \.\.\.\)"):
                await pipe.execute(raise_on_error=False)
        with pytest.raises(BrokerError, match=r"EVALSHA k"):
            await eval_script(client, GET_LUA, ["k"], [])
        with pytest.raises(BrokerError):
            await eval_scripts(client, [(GET_LUA, ["k"], [])])
    finally:
        await client.aclose()
        server.stop()


async def test_nothing_listening_is_a_broker_error_naming_the_url_when_connecting() -> None:
    port = free_port()
    url = f"redis://:secret@127.0.0.1:{port}/0"
    client = client_of(url)
    try:
        with pytest.raises(BrokerError) as raised:
            await ping(client, url)
        assert str(raised.value).startswith(f"redis failed while connecting to redis://:***@127.0.0.1:{port}/0: ")
        assert "secret" not in str(raised.value)
    finally:
        await client.aclose()


async def test_a_wrong_type_is_a_broker_error_and_error_replies_in_a_pipeline_stay_values(redis_url: str) -> None:
    client = client_of(redis_url)
    try:
        await client.set("k", "v")
        with pytest.raises(BrokerError, match=r"^redis failed on LPUSH k: WRONGTYPE") as raised:
            await client.lpush("k", "x")
        assert isinstance(raised.value.__cause__, ResponseError)
        async with client.pipeline(transaction=False) as pipe:
            pipe.lpush("k", "x")
            pipe.get("k")
            wrong, value = await pipe.execute(raise_on_error=False)
        assert isinstance(wrong, ResponseError) and value == b"v"
        async with client.pipeline(transaction=False) as pipe:
            pipe.lpush("k", "x")
            with pytest.raises(BrokerError, match="WRONGTYPE"):
                await pipe.execute()
        with pytest.raises(BrokerError, match="WRONGTYPE"):
            await eval_script(client, "return redis.call('LPUSH', KEYS[1], 'x')", ["k"], [])
    finally:
        await client.aclose()


async def test_evalsha_after_a_script_flush_still_runs_the_script(redis_url: str) -> None:
    client = client_of(redis_url)
    try:
        await client.set("k", "v")
        assert await eval_script(client, GET_LUA, ["k"], []) == b"v"
        await client.script_flush()
        with pytest.raises(ScriptNotCachedError) as raised:  # a BrokerError that is redis-py's NoScriptError too
            await client.evalsha("0" * 40, 0)
        assert isinstance(raised.value, BrokerError) and isinstance(raised.value, NoScriptError)
        assert await eval_script(client, GET_LUA, ["k"], []) == b"v"  # EVALSHA, NOSCRIPT, EVAL
        await client.script_flush()
        assert await eval_scripts(client, [(GET_LUA, ["k"], []), (GET_LUA, ["nope"], [])]) == [b"v", None]
        await client.script_flush()
        assert await client.register_script(GET_LUA)(keys=["k"]) == b"v"  # redis-py's own fallback
    finally:
        await client.aclose()


async def test_a_lost_connection_is_tried_once_more_on_a_new_one(redis_url: str) -> None:
    connections = ConnectionCounter()
    client = broker_client(redis_url, QUICK, connections)
    try:
        await client.set("k", "v")
        own_id = await client.client_id()
        async with aioredis.Redis.from_url(redis_url) as other:
            assert await other.client_kill_filter(_id=own_id) == 1
        assert await client.get("k") == b"v"  # no error: redis-py's retry on a new connection
        assert connections.count == 2
    finally:
        await client.aclose()


async def test_the_store_says_what_it_was_doing_when_the_client_failed(redis_url: str) -> None:
    client = client_of(redis_url)
    try:
        await client.set("k", "v")
        with pytest.raises(BrokerError) as raised:
            with map_redis_errors("reading the list k"):
                await client.lrange("k", 0, -1)
        assert str(raised.value).startswith("redis failed while reading the list k: WRONGTYPE")
        assert isinstance(raised.value.__cause__, ResponseError)
    finally:
        await client.aclose()


async def test_a_cluster_client_fails_as_broker_errors_and_falls_back_to_eval(cluster_url: str) -> None:
    client = client_of(cluster_url)
    try:
        await client.set("{q}k", "v")
        with pytest.raises(BrokerError, match="WRONGTYPE"):
            await client.lpush("{q}k", "x")
        pipe = client.pipeline()
        pipe.lpush("{q}k", "x")
        pipe.get("{q}k")
        wrong, value = await pipe.execute(raise_on_error=False)
        assert isinstance(wrong, ResponseError) and value == b"v"
        await client.script_flush()
        assert await eval_script(client, GET_LUA, ["{q}k"], []) == b"v"
        assert await client.mget_nonatomic(["{q}k", "{r}k"]) == [b"v", None]
    finally:
        await client.aclose()
