"""Every Lua script the project runs in Redis, for the producers, the proxy and ``ddmq offsets reset``.

The scripts are where the produce sequence, the lease fencing and the dead-letter moves are atomic,
so they share one home in the contract both sides import; a script that composes another (the lease
commit checks :data:`STREAM_INTACT_LUA`, a replay runs :data:`PRODUCE_LUA`) includes its text. Each
touches the keys of one hash tag only (:mod:`ddmq.protocol.redis.keys`), so it runs on a Redis Cluster as
on one server, except the batches a single Redis takes in one call (``*_MANY``,
:data:`TOPIC_COUNTS_LUA`), which a Cluster gets per slot or as plain commands. The dead-letter scripts
read entries one at a time, so a call never holds more than its byte budget (plus one entry) in
Redis's memory or in its reply.
"""

from __future__ import annotations

from ddmq.protocol.redis.scripts.dead_letters import (
    CLAIM_LUA,
    CLAIMS_LUA,
    PAGE_LUA,
    PURGE_LUA,
    REPLAY_LUA,
)
from ddmq.protocol.redis.scripts.fencing import (
    HEARTBEAT_LUA,
    HEARTBEAT_MANY_LUA,
    LEASE_ACQUIRE_LUA,
    LEASE_COMMIT_LUA,
    LEASE_RECORD_LUA,
    LEASE_RELEASE_LUA,
    LEASE_RENEW_LUA,
    LEASE_RENEW_MANY_LUA,
    OFFSETS_RESET_LUA,
    OOM_PASS_LUA,
    REGISTER_GROUP_LUA,
    TOPIC_COUNTS_LUA,
)
from ddmq.protocol.redis.scripts.produce import (
    CALLS_REMEMBERED,
    IDEMPOTENT_PRODUCE_LUA,
    OUT_OF_ORDER,
    PRODUCE_LUA,
)
from ddmq.protocol.redis.scripts.retention import (
    EXPIRED_RECORD_LUA,
    TRIMMER_DROP_LUA,
    TRIMMER_PROBE_LUA,
)
from ddmq.protocol.redis.scripts.streams import (
    CHECK_STREAM_LUA,
    LAST_ID_LUA,
    RAISE_SEQUENCE_LUA,
    STREAM_INTACT_LUA,
)

__all__ = [
    "CALLS_REMEMBERED",
    "CHECK_STREAM_LUA",
    "CLAIMS_LUA",
    "CLAIM_LUA",
    "EXPIRED_RECORD_LUA",
    "HEARTBEAT_LUA",
    "HEARTBEAT_MANY_LUA",
    "IDEMPOTENT_PRODUCE_LUA",
    "LAST_ID_LUA",
    "LEASE_ACQUIRE_LUA",
    "LEASE_COMMIT_LUA",
    "LEASE_RECORD_LUA",
    "LEASE_RELEASE_LUA",
    "LEASE_RENEW_LUA",
    "LEASE_RENEW_MANY_LUA",
    "OFFSETS_RESET_LUA",
    "OOM_PASS_LUA",
    "OUT_OF_ORDER",
    "PAGE_LUA",
    "PRODUCE_LUA",
    "PURGE_LUA",
    "RAISE_SEQUENCE_LUA",
    "REGISTER_GROUP_LUA",
    "REPLAY_LUA",
    "STREAM_INTACT_LUA",
    "TOPIC_COUNTS_LUA",
    "TRIMMER_DROP_LUA",
    "TRIMMER_PROBE_LUA",
]
