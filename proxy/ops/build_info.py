"""``ddmq_build_info{version, hot_path, event_loop} 1``: what this proxy process runs, for ``/metrics``.

``hot_path`` is ``compiled``, ``pure`` or ``partial`` and ``event_loop`` ``uvloop`` or ``asyncio``
(:mod:`ddmq.protocol.native`), so a dashboard can tell which proxies run the pure-Python fallback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ddmq.protocol import clitools
from ddmq.protocol.native import hot_path, loop_name


class BuildInfoCollector(Collector):
    """One constant series; the loop is read on the first scrape (the service may be built before it runs)."""

    def __init__(self) -> None:
        self._version = clitools.version()
        self._hot_path = hot_path().kind
        self._loop: str | None = None

    def collect(self) -> Iterator[Metric]:
        if self._loop is None:
            try:
                self._loop = loop_name(asyncio.get_running_loop())
            except RuntimeError:  # scraped from outside the loop: say so until a scrape inside it
                pass
        info = GaugeMetricFamily(
            "ddmq_build_info",
            "Always 1: the proxy's version, its hot path (compiled, pure or partial) and its event loop.",
            labels=["version", "hot_path", "event_loop"],
        )
        info.add_metric([self._version, self._hot_path, self._loop or "unknown"], 1)
        yield info
