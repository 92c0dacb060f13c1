"""Proxy configuration: typed, frozen models validated when the file loads.

>>> from ddmq.config import load
>>> cfg = load("proxy.yaml")          # raises ConfigError naming the bad field's path
>>> cfg.groups["cg_rides"]["rides"].timeout_ms
5000
"""

from ddmq.config.loader import load, parse
from ddmq.config.schema import (
    ACTION_NAMES,
    EmbeddedRedisConfig,
    HttpConfig,
    LeaseConfig,
    ListenConfig,
    ProxyConfig,
    StartFrom,
    TopicConfig,
    TopicGroupConfig,
)

__all__ = [
    "ACTION_NAMES",
    "EmbeddedRedisConfig",
    "HttpConfig",
    "LeaseConfig",
    "ListenConfig",
    "ProxyConfig",
    "StartFrom",
    "TopicConfig",
    "TopicGroupConfig",
    "load",
    "parse",
]
