"""ProxyView: what the HTTP server (the pull API, the admin API and the console) sees of the running
proxy: its groups and their Redis (:class:`~ddmq.proxy.groups.registry.GroupRegistry`), the request
surface, the metrics, the clients pulling, and whether the proxy is running. The service builds it;
the server never holds the service itself.
"""

from __future__ import annotations

from collections.abc import Callable

from ddmq.proxy.api.consume import ConsumeApi
from ddmq.proxy.groups.registry import GroupRegistry, OverRegistry
from ddmq.proxy.ops.metrics import ProxyMetrics
from ddmq.proxy.servers.clients import ClientTracker


class ProxyView(OverRegistry):
    def __init__(
        self,
        registry: GroupRegistry,
        api: ConsumeApi,
        metrics: ProxyMetrics,
        clients: ClientTracker,
        running: Callable[[], bool],
    ) -> None:
        self.registry, self.api, self.metrics, self.clients = registry, api, metrics, clients
        self._running = running

    @property
    def running(self) -> bool:
        """True from the end of the proxy's start until its close begins (what ``/readyz`` reports)."""
        return self._running()

    @property
    def redis_url(self) -> str:
        return self.registry.redis_url
