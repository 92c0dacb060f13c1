"""The Redis URL's ``cluster`` parameter: parsing, errors, and the client each form builds."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from ddmq.config.schema import ProxyConfig
from ddmq.protocol.redis.connection import async_redis, check_url, is_cluster_url, sync_redis


@pytest.mark.parametrize(
    ("url", "cluster"),
    [
        ("redis://127.0.0.1:6379/0", False),
        ("redis://127.0.0.1:6379/0?cluster=false", False),
        ("redis://127.0.0.1:7000/0?cluster=true", True),
        ("redis://127.0.0.1:7000?cluster=1&socket_timeout=5", True),
        ("rediss://user:pw@h1:7000,h2:7001/0?cluster=yes", True),
    ],
)
def test_cluster_is_said_by_the_query(url: str, cluster: bool) -> None:
    assert is_cluster_url(url) is cluster
    assert check_url(url) == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:7000/0?cluster=maybe", "neither true nor false"),
        ("redis://127.0.0.1:7000/3?cluster=true", "database 0 only"),
        ("redis://h1:7000,/0?cluster=true", "empty host"),
        ("redis://h1:7000,h2/0?cluster=true", "is not host:port"),
    ],
)
def test_nonsense_is_refused_with_the_reason(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_url(url)
    with pytest.raises(ValueError, match="redis"):
        ProxyConfig.model_validate({"redis": url})


def test_each_form_builds_its_client() -> None:
    assert type(sync_redis("redis://127.0.0.1:1/0")) is redis.Redis
    assert type(async_redis("redis://127.0.0.1:1/0")) is redis.asyncio.Redis
    # cluster clients connect lazily (async) or at once (sync): only the async one can be built offline
    seeds = async_redis("redis://127.0.0.1:1,127.0.0.2:2/0?cluster=true&socket_timeout=3")
    assert isinstance(seeds, redis.asyncio.cluster.RedisCluster)
    assert sorted(seeds.nodes_manager.startup_nodes) == ["127.0.0.1:1", "127.0.0.2:2"]
    assert seeds.connection_kwargs["socket_timeout"] == 3.0
    with pytest.raises(redis.ConnectionError, match="cannot be connected"):
        sync_redis("redis://127.0.0.1:1/0?cluster=true")


async def test_the_connect_hook_reaches_every_cluster_node(cluster_url: str) -> None:
    """The proxy counts the connections it opens to notice a restart or failover (a replica promoted
    without the last writes is a rollback); on a cluster that hook must reach each node's connections."""
    opened: list[str] = []

    async def on_connect(connection: redis.asyncio.connection.AbstractConnection) -> None:
        opened.append(f"{connection.host}:{connection.port}")
        await connection.on_connect()

    client = async_redis(cluster_url, redis_connect_func=on_connect)
    try:
        for qid in range(16):  # keys spread over every master
            await client.set(f"probe:{{t:{qid}}}", 1)
        masters = {f"{node.host}:{node.port}" for node in client.get_primaries()}
        assert masters <= set(opened), (masters, opened)
    finally:
        await client.aclose()
