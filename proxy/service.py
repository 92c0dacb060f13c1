"""ProxyService: the consume proxy's life cycle, start to close, as one object.

It owns the Redis connection (and the embedded redis-server when configured), the running groups
(:class:`~ddmq.proxy.groups.registry.GroupRegistry`, which also applies reloads), the offset committer
and the server adapters. The request surface is :attr:`ProxyService.api`
(:class:`~ddmq.proxy.api.consume.ConsumeApi`); each server adapter holds a view of it bound to that
server's limits, and calls nothing else.

>>> async with ProxyService(load("proxy.yaml")) as service:
...     await service.wait_closed()
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

from ddmq.config.schema import ProxyConfig, RetentionConfig
from ddmq.protocol.redis.connection import (
    AsyncRedis,
    is_cluster_url,
    quiet_dropped_cluster_nodes,
    redact_url,
)
from ddmq.proxy.api.consume import ConsumeApi
from ddmq.proxy.api.requests import RequestRules
from ddmq.proxy.cluster.audit import ReadAudit
from ddmq.proxy.cluster.commits import commit_periodically
from ddmq.proxy.cluster.lease_clock import LeaseClock
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.cluster.link_health import LinkHealth
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.cluster.retention import Retention
from ddmq.proxy.core.errors import DdmqError, UnavailableError
from ddmq.proxy.core.supervise import supervised
from ddmq.proxy.groups.changes import ConfigChange
from ddmq.proxy.groups.registry import GroupRegistry, OverRegistry
from ddmq.proxy.ops.build_info import BuildInfoCollector
from ddmq.proxy.ops.link import LinkCollector
from ddmq.proxy.ops.memory import RetentionCollector
from ddmq.proxy.ops.metrics import ProxyMetrics
from ddmq.proxy.servers.clients import ClientTracker
from ddmq.proxy.servers.exposure import exposure_warnings
from ddmq.proxy.servers.http import HttpServer
from ddmq.proxy.servers.http.view import ProxyView
from ddmq.proxy.servers.thrift.server import ThriftServer
from ddmq.proxy.store.broker import Broker, ConnectionCounter
from ddmq.proxy.store.client import broker_client, ping
from ddmq.proxy.store.embedded import EmbeddedRedis, EmbeddedRedisError

log = logging.getLogger(__name__)

#: ``maxmemory-policy`` values under which Redis never evicts the proxy's keys.
_SAFE_POLICIES = frozenset({"noeviction"})


@contextmanager
def _listening(what: str, host: str, port: int) -> Iterator[None]:
    """A port that cannot be bound (in use, not allowed) becomes one clear error, not a socket traceback."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UnavailableError(f"cannot listen on {host}:{port} ({what}): {reason}") from exc


class ProxyService(OverRegistry):
    def __init__(self, config: ProxyConfig) -> None:
        self.redis_url = config.redis
        self.registry = GroupRegistry(config)
        self.thrift_port: int | None = None
        self.http_port: int | None = None
        counters: Counter[str] = Counter()
        self.metrics = ProxyMetrics(self.registry, counters, self.server_stats)
        #: The trimmer (docs/retention.md); its last figures feed /metrics.
        self.retention: Retention | None = None
        self.metrics.register(RetentionCollector(self.registry, lambda: self.retention))
        self.metrics.register(BuildInfoCollector())
        leases = config.leases
        #: Redis's time and this host's rate against it (sampled by the upkeep), and the link's state.
        self.clock = LeaseClock(leases.ttl_ms, leases.renew_ms)
        self.health = LinkHealth("redis", config.redis_client.slow_ms)
        self.metrics.register(LinkCollector(self.health, self.clock))
        #: The request surface; the servers hold views of it bound to their own limits.
        self.api = ConsumeApi(
            self.registry, RequestRules(config.thrift.max_linger_ms),
            waits=lambda: self._state in ("starting", "running"), observe_pull=self.metrics.pull_timers.observe,
            counters=counters,
        )
        #: The clients pulling, for the console (fed by the server adapters).
        self.clients = ClientTracker(self.registry.ack_timeout_ms)
        self._embedded: EmbeddedRedis | None = None
        self._redis: AsyncRedis | None = None
        self._thrift: ThriftServer | None = None
        self._http: HttpServer | None = None
        self._committer: asyncio.Task[None] | None = None
        self._state = "new"
        self._closed = asyncio.Event()
        self._reloading = asyncio.Lock()

    @property
    def broker(self) -> Broker | None:
        return self.registry.broker

    @property
    def counters(self) -> Counter[str]:
        return self.api.counters

    # lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._state != "new":
            raise RuntimeError("ProxyService.start() called twice")
        self._state = "starting"
        try:
            await self._start()
        except BaseException:
            # Groups may have joined and taken leases before a later step failed (a port in use): leave
            # at once, or the other proxies would wait out the lease TTL for queues nobody reads.
            await self.registry.release_leases()
            await self._release()
            raise
        self._state = "running"

    async def _start_embedded(self) -> None:
        embedded = self.config.embedded_redis
        self._embedded = EmbeddedRedis(embedded.data_dir, port=embedded.port, executable=embedded.executable,
                                       maxmemory_mb=embedded.maxmemory_mb)
        try:
            await asyncio.to_thread(self._embedded.start)
        except EmbeddedRedisError as exc:
            self._embedded = None
            raise UnavailableError(f"cannot start the embedded redis-server: {exc}") from exc
        self.redis_url = self._embedded.url
        log.info("embedded redis-server at %s (data in %s)", redact_url(self.redis_url), embedded.data_dir)

    async def _start(self) -> None:
        config = self.config
        if config.embedded:
            await self._start_embedded()
        client, connections = await self._connect()
        await self._check_eviction(client)
        leases = LeaseStore(client, config.instance_id, config.leases.ttl_ms)
        membership = Membership(client, config.instance_id, config.leases.ttl_ms, self.clock)
        if config.audit_log:
            self.registry.read_audit = ReadAudit(config.audit_log, config.instance_id,
                                                 redis_now=lambda: self.clock.redis_now_ms() / 1000)
        self.registry.health = self.health
        await self.registry.start(self.redis_url, client, Broker(client, connections), leases, membership)
        if config.http.enabled:  # action timings are only read through /metrics
            self.metrics.instrument(self.groups.values())
        self._committer = asyncio.create_task(
            supervised("committer", lambda: commit_periodically(
                config.commit_interval_ms, lambda: self._state in ("starting", "running"), self.registry.commit_board,
            )),
            name="offset-committer",
        )
        self._start_retention()
        thrift = config.thrift
        self._thrift = ThriftServer(
            self.api.bound(RequestRules(thrift.max_linger_ms)),
            thrift.host,
            thrift.port,
            thrift.max_frame_bytes,
            max_connections=thrift.max_connections,
            idle_timeout_ms=thrift.idle_timeout_ms,
            frame_timeout_ms=thrift.request_timeout_ms,
            max_buffered_bytes=thrift.max_buffered_bytes,
            allowed_clients=thrift.allowed_clients,
            clients=self.clients,
        )
        with _listening("thrift", thrift.host, thrift.port):
            await self._thrift.start()
        self.thrift_port = self._thrift.port
        if config.http.enabled:
            view = ProxyView(self.registry, self.api, self.metrics, self.clients, lambda: self.running)
            self._http = HttpServer(view, config.http)
            with _listening("http", config.http.host, config.http.port):
                await self._http.start()
            self.http_port = self._http.port
        log.info(
            "ddmq-proxy %s ready: thrift %s:%d, http %s, redis %s, groups %s",
            config.instance_id, thrift.host, self.thrift_port,
            f"{config.http.host}:{self.http_port}" if self.http_port is not None else "off",
            redact_url(self.redis_url), sorted(self.groups),
        )
        for warning in exposure_warnings(config):
            log.warning("%s", warning)

    async def _connect(self) -> tuple[AsyncRedis, ConnectionCounter]:
        """The proxy's Redis client, with the config's deadlines, once Redis answers."""
        config = self.config
        connections = ConnectionCounter()  # lets readers notice a Redis restart or failover (see QueueReader)
        client = broker_client(self.redis_url, config.redis_client.deadlines(config.leases), connections)
        self._redis = client
        self.health.where = f"redis at {redact_url(self.redis_url)}"
        if is_cluster_url(self.redis_url):
            quiet_dropped_cluster_nodes(asyncio.get_running_loop())
        await ping(client, self.redis_url)
        return client, connections

    def _start_retention(self) -> None:
        assert self.registry.broker is not None
        interval_ms = min([t.retention.interval_ms for t in self.config.topics.values()] or [1000])
        self.retention = Retention(self.registry.broker, self.config.instance_id, self.retained_topics, interval_ms,
                                   now_ms=self.clock.redis_now_ms)
        self.retention.start()

    async def _check_eviction(self, client: AsyncRedis) -> None:
        """Say clearly when Redis may evict keys: a lease, a commit point or a message evicted under memory
        pressure would break the fencing and lose data, and nothing else would tell."""
        where = redact_url(self.redis_url)
        try:
            reply = await client.config_get("maxmemory-policy")
        except DdmqError as exc:  # managed Redis services often refuse CONFIG
            log.warning("cannot read maxmemory-policy of %s (%s): make sure it is noeviction, or Redis may evict "
                        "leases, committed offsets and messages when it fills up", where, exc)
            return
        unsafe = sorted(_policies(reply) - _SAFE_POLICIES)
        if unsafe:
            log.warning("%s has maxmemory-policy %s: when it fills up it may evict the proxy's leases, committed "
                        "offsets and unread messages; set maxmemory-policy noeviction (docs/retention.md)",
                        where, ", ".join(unsafe))

    def retained_topics(self) -> dict[str, tuple[int, RetentionConfig]]:
        """topic -> (queues, retention) of the topics this proxy declares or consumes (queues known)."""
        topics = {topic: (tc.queues, tc.retention) for topic, tc in self.config.topics.items()}
        for group in self.groups.values():
            for consumer in group.consumers.values():
                if consumer.queues and consumer.topic not in topics:
                    topics[consumer.topic] = (consumer.queues, RetentionConfig())
        return topics

    async def close(self) -> None:
        """Graceful stop: stop reading, answer parked pulls, leave the member sets, hand each queue over
        once clients acked what they hold of it (within ``shutdown_grace_ms``), flush offsets, stop the
        servers, and stop Redis if it is embedded."""
        if self._state in ("closing", "closed"):
            await self._closed.wait()
            return
        was_running = self._state == "running"
        self._state = "closing"
        async with self._reloading:  # a reload under way finishes first (its drain is bounded)
            pass
        try:
            if was_running:
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.config.shutdown_grace_ms / 1000
                await self.registry.stop_reading()
                # Each queue goes to its next owner as soon as its own messages in flight are settled.
                await self.registry.hand_off_all(self.config.shutdown_grace_ms)
                await self._grace(deadline)
                if self._committer is not None:
                    self._committer.cancel()
                    await asyncio.gather(self._committer, return_exceptions=True)
                await self.registry.commit_board.flush()
                await self.registry.release_leases()
        finally:
            await self._release()
            self._state = "closed"
            self._closed.set()

    async def _grace(self, deadline: float) -> None:
        """What is still in flight outside the queues handed over (a retiring topic's) until ``deadline``."""
        loop = asyncio.get_running_loop()
        # Polling keeps the hot ack path free of shutdown bookkeeping; this runs once per process.
        while loop.time() < deadline and self.registry.in_flight():  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def _release(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._thrift is not None:
            await self._thrift.close()
        await self.registry.close()
        if self.retention is not None:
            await self.retention.close()
        if self._committer is not None and not self._committer.done():
            self._committer.cancel()
            await asyncio.gather(self._committer, return_exceptions=True)
        if self.registry.read_audit is not None:
            self.registry.read_audit.close()
        if self.registry.broker is not None:
            await self.registry.broker.close()  # the idle watcher's connections, before the client's
        if self._redis is not None:
            await self._redis.aclose()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)

    def server_stats(self) -> dict[str, dict[str, int]]:
        """Per server ("thrift", "http"): its connection counters and gauges (see ThriftServer.stats)."""
        stats = {}
        if self._thrift is not None:
            stats["thrift"] = self._thrift.stats()
        if self._http is not None:
            stats["http"] = self._http.connections.stats()
        return stats

    @property
    def running(self) -> bool:
        """True from the end of start() until close() begins (what ``/readyz`` reports)."""
        return self._state == "running"

    async def reload(self, config: ProxyConfig) -> ConfigChange:
        """Apply a new, already validated config: groups and topics change live (see
        :mod:`ddmq.proxy.groups.registry`). Raises ConfigError, and changes nothing, when it cannot apply."""
        if self._state != "running":
            raise UnavailableError(f"cannot reload the config of a proxy that is {self._state}")
        async with self._reloading:
            if self._state != "running":
                raise UnavailableError(f"cannot reload the config of a proxy that is {self._state}")
            return await self.registry.apply(config)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> ProxyService:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _policies(reply: object) -> set[str]:
    """The policies in a ``CONFIG GET maxmemory-policy`` reply: {name: value}, or per node on a Cluster."""
    found: set[str] = set()
    if isinstance(reply, dict):
        for value in reply.values():
            if isinstance(value, dict):
                found |= _policies(value)
            else:
                found.add(value.decode() if isinstance(value, bytes) else str(value))
    return found
