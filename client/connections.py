"""Redis connections of the command-line tools, made in one place so that every ``--redis`` URL is
understood the same way by ``ddmq status``, ``ddmq offsets`` and the others."""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["sync_redis"]


def sync_redis(url: str, **kwargs: Any) -> redis.Redis:
    """A blocking client for ``url`` (``redis://``, ``rediss://`` or ``unix://``); ``kwargs`` go to redis-py."""
    return redis.Redis.from_url(url, **kwargs)
