"""Fixtures of the engine's unit tests: a fake clock and a pull buffer on it (no Redis)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from ddmq.proxy.engine.pull_buffer import PullBuffer

from ..engine_fakes import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def buffer(clock: Clock) -> AsyncIterator[PullBuffer]:
    buffer = PullBuffer("g", clock)
    buffer.start()
    yield buffer
    await buffer.close()
