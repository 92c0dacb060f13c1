"""Shared fixtures: one real redis-server for the whole session, emptied before each test, and a real
Redis Cluster (3 masters, 1 replica each) started the first time a test asks for it.

Async tests run on asyncio's loop; those marked ``both_loops`` (cancellation and shutdown) run once on
it and once on uvloop, the proxy's default loop (``pytest_asyncio_loop_factories``).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterator, Mapping

import pytest
import redis
import redis.asyncio

from ddmq.protocol.native import loop_factory
from ddmq.proxy.store.embedded import EmbeddedRedis, find_executable
from ddmq.proxy.store.embedded_cluster import EmbeddedCluster
from tests.harness import servers

#: ``cluster-node-timeout``: a killed master's replica takes over about two of these later.
CLUSTER_NODE_TIMEOUT_MS = 1000

_ASYNCIO: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
#: The loops a ``both_loops`` test runs on; the project depends on uvloop wherever it installs.
BOTH_LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {**_ASYNCIO, "uvloop": loop_factory("uvloop")}


def pytest_configure(config: pytest.Config) -> None:
    servers.choose()  # DDMQ_TEST_REDIS: the whole run on Redis 7.0 or Valkey 8.1 (tests/harness/servers.py)
    config.addinivalue_line("markers", "both_loops: run this async test on asyncio's event loop and on uvloop")
    # A shell without job control starts a background job (`.ci/run &`) with SIGINT ignored, and an
    # ignored signal stays ignored in every process started after it: the commands the tests stop
    # with Ctrl-C would never see it. A handler (unlike SIG_IGN) is reset to the default by exec, so
    # with one here the tests' children get SIGINT as a terminal would deliver it.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_report_header(config: pytest.Config) -> str:
    return f"redis server: {os.environ.get(servers.CHOICE_ENV) or 'redis-6.2'} ({find_executable()})"


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return BOTH_LOOPS if item.get_closest_marker("both_loops") else _ASYNCIO


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A private redis-server (the same class the proxy embeds) on a free port."""
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis-data")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> Iterator[str]:
    """The server's URL, with every key removed before the test."""
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    yield redis_server.url


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(redis_url, decode_responses=False)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedCluster]:
    """3 masters with 1 replica each, from the same redis-server binary, on free ports."""
    cluster = EmbeddedCluster(
        tmp_path_factory.mktemp("redis-cluster"), masters=3, replicas=1, node_timeout_ms=CLUSTER_NODE_TIMEOUT_MS
    ).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: EmbeddedCluster) -> str:
    """The cluster's URL (every node a seed), healthy (a node a test killed is back) and empty."""
    for node in redis_cluster.nodes:
        if not node.running:
            node.start()
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    return redis_cluster.url
