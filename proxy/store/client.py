"""The proxy's Redis client: redis-py's, with every failure raised as :class:`BrokerError`.

Redis's errors become the proxy's here, at the edge, and nowhere above: the client the proxy builds
(:func:`broker_client`, for one server or a Cluster) raises :class:`~ddmq.proxy.core.errors.BrokerError`
from its commands, its pipelines and its scripts (a lost connection, a timeout, a refused or wrong
command, a Cluster that cannot route), naming the command and its first key; the ``__cause__`` is
redis-py's error. Every part of the proxy (the store, leases, membership, replays, fetch, lag,
metrics) uses that client, so none catches redis-py's errors.

What redis-py does inside a call is left as it is: the single-server client's one immediate retry on a
new connection after a ``ConnectionError``, the Cluster client's retries and redirections, and the
fallback of a script call from ``EVALSHA`` to ``EVAL`` when the server does not know the script
(:func:`~ddmq.protocol.redis.connection.eval_script`, and redis-py's own ``Script``): a missing script is
a :class:`ScriptNotCachedError`, a ``BrokerError`` that is also redis-py's ``NoScriptError``. The error
replies a pipeline run with ``raise_on_error=False`` hands back stay values.

The store's own methods say what they were doing when Redis failed (:func:`map_redis_errors`), also for
the connections they use directly (a reader's link, the idle watcher's).

>>> client = broker_client("redis://127.0.0.1:6379/0", Deadlines(), ConnectionCounter())
>>> await client.xlen("nope:0")  # Redis down: BrokerError("redis failed on XLEN nope:0: Error 111 ...")
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.client
import redis.asyncio.cluster
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisClusterException

from ddmq.protocol.redis.connection import (
    REDIS_FAILURES,
    AsyncCluster,
    AsyncRedis,
    Deadlines,
    async_redis,
    is_cluster_url,
    redact_url,
)
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.store.broker import ConnectionCounter, map_redis_errors

__all__ = ["BrokerCluster", "BrokerRedis", "ScriptNotCachedError", "broker_client", "ping"]


class ScriptNotCachedError(BrokerError, NoScriptError):  # type: ignore[misc]  # redis is untyped here
    """The server does not know the script an ``EVALSHA`` named (restarted, or a replica just promoted):
    a ``NoScriptError`` too, so the callers that send the script itself next take it."""


def _named(args: tuple[Any, ...]) -> str:
    """A command as an error names it: its name and its first key (a script call's, a stream read's)."""
    if not args:
        return "a command"
    name = _text(args[0]).upper()
    key: Any = None
    if name in ("EVAL", "EVALSHA") and len(args) > 3 and str(args[2]) not in ("0", "b'0'"):
        key = args[3]
    elif name in ("XREAD", "XREADGROUP"):
        after = [i for i, arg in enumerate(args) if _text(arg).upper() == "STREAMS"]
        key = args[after[0] + 1] if after and len(args) > after[0] + 1 else None
    elif len(args) > 1 and name not in ("EVAL", "EVALSHA"):
        key = args[1]
    return name if key is None else f"{name} {_text(key)[:200]}"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _mapped(what: str, exc: Exception) -> BrokerError:
    kind = ScriptNotCachedError if isinstance(exc, NoScriptError) else BrokerError
    return kind(f"redis failed on {what}: {exc}")


class _MapsErrors:
    """Mixed into a redis-py client class: its commands and pipelines raise BrokerError."""

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return await super().execute_command(*args, **options)  # type: ignore[misc]
        except REDIS_FAILURES as exc:
            raise _mapped(_named(args), exc) from exc


class _MappedPipeline(redis.asyncio.client.Pipeline):  # type: ignore[misc]  # redis is untyped here
    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = self.command_stack  # (args, options) per command; emptied by the execution
        first, size = (stack[0][0] if stack else ()), len(stack)
        try:
            return list(await super().execute(raise_on_error))
        except REDIS_FAILURES as exc:
            raise _mapped(_pipeline(first, size), exc) from exc


class _MappedClusterPipeline(redis.asyncio.cluster.ClusterPipeline):  # type: ignore[misc]
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        # redis-py keeps the queued commands in its execution strategy; the error names the first
        queued = getattr(getattr(self, "_execution_strategy", None), "_command_queue", None) or ()
        first, size = (tuple(getattr(queued[0], "args", ())) if queued else ()), len(self)
        try:
            return list(await super().execute(raise_on_error, allow_redirections))
        except REDIS_FAILURES as exc:
            raise _mapped(_pipeline(first, size), exc) from exc


def _pipeline(first: tuple[Any, ...], size: int) -> str:
    return f"a pipeline of {size} command{'s' if size != 1 else ''}" + (f" ({_named(first)}, ...)" if first else "")


class BrokerRedis(_MapsErrors, redis.asyncio.Redis):  # type: ignore[misc]  # redis is untyped here
    """The proxy's client of one Redis server."""

    def pipeline(self, transaction: bool = True, shard_hint: str | None = None) -> _MappedPipeline:
        return _MappedPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class BrokerCluster(_MapsErrors, AsyncCluster):
    """The proxy's client of a Redis Cluster."""

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> _MappedClusterPipeline:
        if shard_hint:  # as redis-py's own
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        return _MappedClusterPipeline(self, transaction)


def broker_client(url: str, deadlines: Deadlines, connections: ConnectionCounter) -> AsyncRedis:
    """The proxy's client for ``url`` (bytes replies), counting the connections it opens in ``connections``.

    On one server a lost connection is tried once more at once, on a new one; a timeout is not: the
    call already waited its deadline, and the proxy's own loops retry. A Cluster client keeps redis-py's
    retries (slot map reloads, redirections)."""
    options: dict[str, Any] = {}
    if not is_cluster_url(url):
        options["retry"] = redis.asyncio.retry.Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
    return async_redis(url, deadlines, client_class=BrokerRedis, cluster_class=BrokerCluster,
                       decode_responses=False, redis_connect_func=connections.on_connect, **options)


async def ping(client: AsyncRedis, url: str) -> None:
    """Whether Redis at ``url`` answers ``client``: BrokerError ``redis failed while connecting to <url>``
    (the password masked) when it does not."""
    with map_redis_errors(f"connecting to {redact_url(url)}"):
        await client.ping()
