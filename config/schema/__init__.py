"""The configuration schema. Units are in the names (``timeout_ms``); unknown fields are errors.

Action names are checked against :data:`ACTION_NAMES` here so a typo fails when the file loads.
The registry in ``ddmq.actions`` holds the implementations and a test keeps the two in step.
"""

from __future__ import annotations

from ddmq.config.schema.actions import (
    AsyncHttpConfig,
    Expression,
    FilterConfig,
    JsonPath,
    RedisActionConfig,
    RedisCommandConfig,
    TransitConfig,
)
from ddmq.config.schema.base import (
    ACTION_NAMES,
    FAIR_KEY_KEY,
    FAIR_KEY_TAG,
    ORDER_KEY_KEY,
    ORDER_KEY_NONE,
    ORDER_KEY_QID,
    SINK_ACTIONS,
    StartFrom,
)
from ddmq.config.schema.groups import (
    BreakerConfig,
    LeaseConfig,
    TopicGroupConfig,
)
from ddmq.config.schema.metrics import MetricsConfig
from ddmq.config.schema.proxy import (
    EmbeddedRedisConfig,
    ProxyConfig,
    RedisClientConfig,
)
from ddmq.config.schema.servers import (
    ConnectionLimits,
    HttpConfig,
    ListenConfig,
    ThriftConfig,
)
from ddmq.config.schema.topics import (
    RetentionConfig,
    TopicConfig,
)

__all__ = [
    "ACTION_NAMES",
    "FAIR_KEY_KEY",
    "FAIR_KEY_TAG",
    "ORDER_KEY_KEY",
    "ORDER_KEY_NONE",
    "ORDER_KEY_QID",
    "SINK_ACTIONS",
    "AsyncHttpConfig",
    "BreakerConfig",
    "ConnectionLimits",
    "EmbeddedRedisConfig",
    "Expression",
    "FilterConfig",
    "HttpConfig",
    "JsonPath",
    "LeaseConfig",
    "ListenConfig",
    "MetricsConfig",
    "ProxyConfig",
    "RedisActionConfig",
    "RedisClientConfig",
    "RedisCommandConfig",
    "RetentionConfig",
    "StartFrom",
    "ThriftConfig",
    "TopicConfig",
    "TopicGroupConfig",
    "TransitConfig",
]
