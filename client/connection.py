"""The Redis connection factory: :mod:`ddmq.protocol.connection` (shared with the proxy), kept importable here."""

from ddmq.protocol.connection import (
    REDIS_ERRORS,
    AsyncRedis,
    SyncRedis,
    async_redis,
    check_url,
    eval_script,
    is_cluster_url,
    quiet_dropped_cluster_nodes,
    sync_redis,
)

__all__ = [
    "REDIS_ERRORS",
    "AsyncRedis",
    "SyncRedis",
    "async_redis",
    "check_url",
    "eval_script",
    "is_cluster_url",
    "quiet_dropped_cluster_nodes",
    "sync_redis",
]
