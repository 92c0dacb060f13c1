"""A real ProxyService (in this test's event loop) over the real Redis of the session; for the unit
tests of the engine and of what builds on it, a fake clock and a pull buffer on it (no Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from ddmq.config import parse
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.service import ProxyService

from .engine_fakes import Clock


def proxy_config(redis_url: str, topic_config: dict[str, Any] | None = None, queues: int = 4, **proxy: Any) -> Any:
    return parse(
        {
            "instance_id": proxy.pop("instance_id", "test-proxy"),
            "redis": redis_url,
            "thrift": {"port": 0},
            "commit_interval_ms": 50,
            "shutdown_grace_ms": 0,
            "topics": {"t": {"queues": queues}},
            "groups": {"g": {"t": topic_config or {}}},
            **proxy,
        }
    )


@asynccontextmanager
async def running_proxy(
    redis_url: str, topic_config: dict[str, Any] | None = None, **kw: Any
) -> AsyncIterator[ProxyService]:
    service = ProxyService(proxy_config(redis_url, topic_config, **kw))
    await service.start()
    try:
        yield service
    finally:
        await service.close()



@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def buffer(clock: Clock) -> AsyncIterator[PullBuffer]:
    buffer = PullBuffer("g", clock)
    buffer.start()
    yield buffer
    await buffer.close()
