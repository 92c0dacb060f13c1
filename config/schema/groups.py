"""How a consumer group consumes a topic, and queue leases among a group's proxies."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from ddmq.config.schema.actions import AsyncHttpConfig, FilterConfig, RedisActionConfig, TransitConfig
from ddmq.config.schema.base import (
    ACTION_NAMES,
    FAIR_KEY_KEY,
    FAIR_KEY_TAG,
    ORDER_KEY_KEY,
    ORDER_KEY_NONE,
    ORDER_KEY_QID,
    SINK_ACTIONS,
    Model,
    StartFrom,
)
from ddmq.protocol.redis.keys import DEFAULT_MEMBER_TTL_MS


class BreakerConfig(Model):
    """A breaker for failure storms (docs/failures.md): when the failures among a topic's last attempts
    pass ``failure_share``, the topic pauses itself on this proxy instead of using up retries, then
    probes with a few messages and closes when they succeed. Each proxy judges the queues it serves."""

    #: Off by default: a topic without it counts every failed attempt, as before.
    enabled: bool = False
    #: How many of the latest outcomes (acks, fails, timeouts) are judged.
    window: Annotated[int, Field(ge=1, le=100_000)] = 200
    #: The share of failures in the window that opens the breaker.
    failure_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    #: Outcomes the window must hold before it may open (so a few early failures do not stop a topic).
    min_attempts: Annotated[int, Field(ge=1, le=100_000)] = 20
    #: Messages handed out at a time while half-open (keys' heads, in their order); this many
    #: successes in a row close the breaker, one failure opens it again.
    probe: Annotated[int, Field(ge=1, le=1000)] = 5
    #: How long it stays open before it probes; doubled on every failed probe up to ``max_open_ms``.
    open_ms: Annotated[int, Field(ge=10, le=3_600_000)] = 5_000
    #: Longest time open between probes.
    max_open_ms: Annotated[int, Field(ge=10, le=86_400_000)] = 60_000

    @model_validator(mode="after")
    def _consistent(self) -> BreakerConfig:
        if self.min_attempts > self.window:
            raise ValueError(f"min_attempts ({self.min_attempts}) cannot be more than window ({self.window}): "
                             "the breaker could never open")
        if self.open_ms > self.max_open_ms:
            raise ValueError(f"open_ms ({self.open_ms}) cannot be more than max_open_ms ({self.max_open_ms})")
        return self


class TopicGroupConfig(Model):
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
    #: Most messages of one order key held in memory (its head and the successors queued behind it). A
    #: key's later messages stay in Redis, their offsets remembered, and are read again in order as the
    #: key drains, so a burst of one key never fills ``concurrency`` and the other keys keep flowing.
    key_buffer: Annotated[int, Field(ge=1, le=100_000)] = 100
    #: Tenants, off by default: what names a message's tenant, ``KEY`` (the message key), ``TAG`` (its
    #: tag) or a JSONPath into the JSON body, e.g. ``$.customer``. While several tenants have messages
    #: here, each holds at most its weighted share of ``concurrency`` in memory; the rest of its messages
    #: stay in Redis (remembered by offset, as for a key past ``key_buffer``) and are read again, in key
    #: order, as it drains, so a tenant with most of the traffic does not raise the others' latency. A
    #: message the expression finds nothing in is of the tenant ``""``. Needs the Order action.
    fair_key: str | None = None
    #: Weight of a tenant (1 when not named): its share of the window is its weight over the sum of the
    #: weights of the tenants with messages here.
    fair_weights: Annotated[
        dict[str, Annotated[float, Field(gt=0, le=1_000_000)]], Field(max_length=10_000)
    ] = {}
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
    #: A breaker for failure storms (pull consumers): see :class:`BreakerConfig`.
    breaker: BreakerConfig = BreakerConfig()
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
        if self.breaker.enabled and self.actions[-1] != "PullServer":
            raise ValueError("breaker: the breaker judges pull consumers (PullServer) only; a push chain "
                             "retries on its own schedule")
        return self

    @field_validator("order_key")
    @classmethod
    def _order_key(cls, value: str) -> str:
        if value in (ORDER_KEY_QID, ORDER_KEY_KEY, ORDER_KEY_NONE):
            return value
        if not value.startswith("$"):
            raise ValueError("order_key must be QID, KEY, NONE or a JSONPath starting with '$'")
        from ddmq.config.jsonpath import check_jsonpath

        return check_jsonpath(value)

    @model_validator(mode="after")
    def _json_before_jsonpath(self) -> TopicGroupConfig:
        if self.is_jsonpath_key and "Order" in self.actions:
            if "Json" not in self.actions or self.actions.index("Json") > self.actions.index("Order"):
                raise ValueError("a JSONPath order_key needs the Json action before Order")
        return self

    @field_validator("fair_key")
    @classmethod
    def _fair_key(cls, value: str | None) -> str | None:
        if value is None or value in (FAIR_KEY_KEY, FAIR_KEY_TAG):
            return value
        if not value.startswith("$"):
            raise ValueError("fair_key must be KEY, TAG or a JSONPath starting with '$'")
        from ddmq.config.jsonpath import check_jsonpath

        return check_jsonpath(value)

    @model_validator(mode="after")
    def _tenants(self) -> TopicGroupConfig:
        if self.fair_key is None:
            if self.fair_weights:
                raise ValueError("fair_weights is set but fair_key is not: weights need tenants")
            return self
        if "Order" not in self.actions:
            raise ValueError("fair_key: tenants take their share in the Order action; add Order to actions")
        if self.order_key == ORDER_KEY_QID:
            raise ValueError("fair_key: with order_key QID a queue is one key, and no tenant may overtake "
                             "another in it; order by KEY or a JSONPath to share between tenants")
        if self.fair_key.startswith("$") and (
            "Json" not in self.actions or self.actions.index("Json") > self.actions.index("Order")
        ):
            raise ValueError("a JSONPath fair_key needs the Json action before Order")
        return self

    @property
    def is_jsonpath_key(self) -> bool:
        return self.order_key.startswith("$")

    def retry_delay_ms(self, retry: int) -> int:
        """Delay before retry number ``retry`` (1-based)."""
        return self.retry_intervals_ms[min(retry, len(self.retry_intervals_ms)) - 1]


class LeaseConfig(Model):
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
