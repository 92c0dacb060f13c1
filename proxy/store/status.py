"""A group's owners, leases and offsets for the admin API, read as ``ddmq status`` reads them.

:func:`group_owners` opens a short-lived blocking connection of its own (the admin handler runs it in a
thread), so a slow status read never holds one of the proxy's connections, and reads what the command
line would show (:func:`~ddmq.protocol.redis.status.group_status`) plus each topic's dead letters.
"""

from __future__ import annotations

from ddmq.protocol.redis.connection import sync_redis
from ddmq.protocol.redis.keys import dead_letters
from ddmq.protocol.redis.status import GroupStatus, group_status
from ddmq.proxy.store.broker import map_redis_errors

__all__ = ["group_owners"]

#: Seconds one reply of the status read may take.
STATUS_TIMEOUT_S = 5


def group_owners(url: str, group: str, topics: list[str]) -> tuple[GroupStatus, dict[str, int]]:
    """``group``'s status over ``topics`` and the number of dead letters per topic, from Redis at
    ``url``; BrokerError when Redis fails."""
    with map_redis_errors(f"reading the owners of group {group}"):
        with sync_redis(url, socket_timeout=STATUS_TIMEOUT_S) as client:  # a Cluster's reads its slot map here
            status = group_status(client, group, topics)
            pipe = client.pipeline(transaction=False)
            for topic in topics:
                pipe.xlen(dead_letters(group, topic))
            return status, dict(zip(topics, pipe.execute(), strict=True))
