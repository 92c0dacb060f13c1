"""``ddmq_build_info`` on /metrics: the version, the hot path of this install and the loop the service runs on."""

from __future__ import annotations

from importlib import metadata

import pytest

from ddmq.protocol.native import hot_path

from ..servers.test_http_api import http_proxy
from .test_metrics import scrape, value


@pytest.mark.both_loops
async def test_build_info_names_the_version_the_hot_path_and_the_running_loop(
    redis_url: str, request: pytest.FixtureRequest
) -> None:
    loop = request.node.callspec.id  # "asyncio" or "uvloop": the loop this test runs on
    async with http_proxy(redis_url, queues=1) as (_, api):
        samples = await scrape(api)
    labels = {"version": metadata.version("ddmq-proxy"), "hot_path": hot_path().kind, "event_loop": loop}
    assert value(samples, "ddmq_build_info", **labels) == 1.0
    assert [key for key in samples if key[0] == "ddmq_build_info"] == [("ddmq_build_info", frozenset(labels.items()))]
