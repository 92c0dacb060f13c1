"""ProxyView: what the HTTP server (the pull API, the admin API and the console) sees of the running
proxy: its groups and their Redis (:class:`~ddmq.proxy.groups.registry.GroupRegistry`), the request
surface, the metrics, the clients pulling, and whether the proxy is running. The service builds it;
the server never holds the service itself.
"""

from __future__ import annotations

from collections.abc import Callable

from ddmq.config.schema import ProxyConfig
from ddmq.protocol.connection import AsyncRedis
from ddmq.proxy.api.consume import ConsumeApi
from ddmq.proxy.groups.group import ConsumerGroup
from ddmq.proxy.groups.registry import GroupRegistry
from ddmq.proxy.ops.metrics import ProxyMetrics
from ddmq.proxy.servers.clients import ClientTracker


class ProxyView:
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
    def config(self) -> ProxyConfig:
        return self.registry.config

    @property
    def groups(self) -> dict[str, ConsumerGroup]:
        return self.registry.groups

    @property
    def redis(self) -> AsyncRedis | None:
        return self.registry.redis

    @property
    def redis_url(self) -> str:
        return self.registry.redis_url
