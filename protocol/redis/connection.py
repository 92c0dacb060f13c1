"""Redis clients from a URL: one server, or a Redis Cluster when the URL says ``cluster=true``.

Every part of the project that takes a Redis URL (the proxy's ``redis:``, ``Producer``, ``ddmq produce``,
``ddmq status``, ``ddmq demo-producer``) builds its client here, so "cluster" is said one way:

>>> client = async_redis("redis://127.0.0.1:7000/0?cluster=true")            # one seed node
>>> client = async_redis("redis://10.0.0.1:7000,10.0.0.2:7000/0?cluster=true")  # several seeds

The seeds are only where the client starts: it asks one of them for the slot map and then talks to
every master directly, following ``MOVED``/``ASK`` and reloading the map after a failover. The other
query parameters and the credentials are redis-py's (``redis.from_url``) and apply to every node. A
cluster has database 0 only. Without ``cluster`` (or with ``cluster=false``) the URL is passed to
redis-py unchanged.

redis-py raises ``RedisClusterException`` (not a ``RedisError``) when a command cannot be routed or
no node answers at all: :data:`REDIS_ERRORS` names both for ``except`` clauses at the edges.

*Every call has a deadline.* A client made here has socket timeouts (connect, read, write), TCP
keepalive and a health check (a ``PING`` before a command on a connection idle past the interval),
from :class:`Deadlines` (defaults below; the proxy derives its own from its lease timings): a
connection that goes silent (a half-open TCP after a network blip, a NAT or load balancer that dropped
its state) fails its call within the timeout and is replaced, instead of hanging its caller for ever.
Query parameters of the URL (``?socket_timeout=...``) still win, as redis-py's do. No command the
project sends blocks longer than :data:`LONGEST_BLOCK_MS`, so the read timeout is that plus a margin.

*Foreign errors become Redis's.* Under uvloop, writing to a connection that the server reset raises
``RuntimeError`` from the event loop rather than an ``OSError``, which redis-py neither maps nor
retries; the connection classes used here turn it (and an ``EOFError`` from a stream cut mid-reply)
into ``redis.ConnectionError``, so the caller's usual failure path (and redis-py's retry on a new
connection) takes it, whichever loop runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from typing import Any, TypeAlias

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, RedisClusterException

from ddmq.protocol.redis.urls import (
    DEFAULT_DEADLINES,
    LONGEST_BLOCK_MS,
    ClusterUrl,
    Deadlines,
    check_url,
    is_cluster_url,
    redact_url,
)

__all__ = [
    "LONGEST_BLOCK_MS",
    "REDIS_ERRORS",
    "REDIS_FAILURES",
    "AsyncCluster",
    "AsyncRedis",
    "Deadlines",
    "SyncRedis",
    "async_redis",
    "check_url",
    "eval_script",
    "eval_scripts",
    "is_cluster_url",
    "quiet_dropped_cluster_nodes",
    "redact_url",
    "server_time_ms",
    "sync_redis",
]

logger = logging.getLogger(__name__)

#: A client of one server or of a cluster; everything the project calls exists on both.
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
SyncRedis: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"

#: What a Redis call may raise when Redis is at fault, on one server or on a cluster.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
#: :data:`REDIS_ERRORS`, socket errors (a timeout is an ``OSError``) and a stream cut mid-reply
#: (``asyncio.IncompleteReadError`` is an ``EOFError``): Redis is unavailable.
REDIS_FAILURES: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError, EOFError)

def async_redis(
    url: str,
    deadlines: Deadlines = DEFAULT_DEADLINES,
    *,
    client_class: type[redis.asyncio.Redis] | None = None,
    cluster_class: type[AsyncCluster] | None = None,
    **kwargs: Any,
) -> AsyncRedis:
    """An asyncio client for ``url`` with ``deadlines``; ``kwargs`` go to redis-py (e.g.
    ``decode_responses``) and override the deadlines' options. ``client_class`` (a subclass of redis-py's
    ``Redis``) and ``cluster_class`` (of :class:`AsyncCluster`) are what to build, for a caller that
    adds to the client (the proxy's raises its own error for every failure)."""
    kwargs = {**deadlines.options(), **kwargs}
    if not is_cluster_url(url):
        client = (client_class or redis.asyncio.Redis).from_url(url, **kwargs)
        pool = client.connection_pool
        pool.connection_class = _mapped_connection(pool.connection_class)
        return client
    parsed = ClusterUrl(url)
    seeds = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in parsed.others]
    return (cluster_class or AsyncCluster).from_url(parsed.first, startup_nodes=seeds or None, **kwargs)


def sync_redis(url: str, deadlines: Deadlines = DEFAULT_DEADLINES, **kwargs: Any) -> SyncRedis:
    """A blocking client for ``url`` with ``deadlines``; ``kwargs`` go to redis-py and override them.

    A cluster client reads the slot map here, so an unreachable cluster raises ``redis.ConnectionError``
    at once (a single-server client connects at its first command)."""
    kwargs = {**deadlines.options(), **kwargs}
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **kwargs)
    parsed = ClusterUrl(url)
    seeds = [redis.cluster.ClusterNode(host, port) for host, port in parsed.others]
    try:
        return redis.cluster.RedisCluster.from_url(parsed.first, startup_nodes=seeds or None, **kwargs)
    except RedisClusterException as exc:  # it asks for the slot map at once; none of the seeds answered
        raise redis.ConnectionError(str(exc)) from exc


def server_time_ms(client: SyncRedis) -> int:
    """Redis's clock (ms), what member heartbeats are scored with: a reader comparing them with its own
    clock would see live proxies as gone, or gone ones as alive, whenever the two clocks disagree. On
    a Cluster, any master's (their clocks are taken to agree)."""
    reply: Any = client.time()
    if isinstance(reply, dict):  # one answer per node
        reply = next(iter(reply.values()))
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


_SHAS: dict[str, str] = {}
#: Script calls in flight at once on a Cluster (see :func:`eval_scripts`).
_CLUSTER_CONCURRENCY = 64


async def eval_script(client: AsyncRedis, script: str, keys: list[str], args: list[Any]) -> Any:
    """Run a Lua script by its SHA, sending its text only when the node does not know it.

    A restarted server, or a replica just promoted to master, has an empty script cache; redis-py's
    ``register_script`` would then ``SCRIPT LOAD`` to the masters it knew before the failover. EVAL
    sends the script to the node that owns the keys (and caches it there)."""
    sha = _sha(script)
    try:
        return await client.evalsha(sha, len(keys), *keys, *args)
    except NoScriptError:
        return await client.eval(script, len(keys), *keys, *args)


async def eval_scripts(client: AsyncRedis, calls: Sequence[tuple[str, list[str], list[Any]]]) -> list[Any]:
    """Run many script calls (script, keys, args) at once: in one pipeline (one round trip) on a single
    Redis; on a Cluster, where each call's keys must share a slot as usual, concurrently, 64 at a time
    (redis-py's cluster pipeline takes no scripts).
    Calls whose node did not know their script are sent again with its text (see :func:`eval_script`).
    Each answer is the script's reply or the exception it raised; a failure of the whole pipeline (no
    connection) raises."""
    if not calls:
        return []
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        # redis-py's cluster pipeline refuses scripts: the calls go out concurrently instead (each to
        # its slot's master), a bounded number at a time.
        replies_: list[Any] = []
        for start in range(0, len(calls), _CLUSTER_CONCURRENCY):
            chunk = calls[start:start + _CLUSTER_CONCURRENCY]
            replies_ += await asyncio.gather(*(eval_script(client, *call) for call in chunk), return_exceptions=True)
        return replies_
    async with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            pipe.evalsha(_sha(script), len(keys), *keys, *args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
    unknown = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if unknown:
        async with client.pipeline(transaction=False) as pipe:
            for index in unknown:
                script, keys, args = calls[index]
                pipe.eval(script, len(keys), *keys, *args)
            for index, reply in zip(unknown, await pipe.execute(raise_on_error=False), strict=True):
                replies[index] = reply
    return replies


def _sha(script: str) -> str:
    sha = _SHAS.get(script)
    if sha is None:
        sha = _SHAS[script] = hashlib.sha1(script.encode()).hexdigest()
    return sha


def _streams_keys(args: tuple[Any, ...]) -> list[Any] | None:
    """The stream names of an XREAD / XREADGROUP command, or None when it has no ``STREAMS``."""
    for index, arg in enumerate(args):
        if isinstance(arg, (str, bytes)) and arg.upper() in ("STREAMS", b"STREAMS"):
            rest = args[index + 1 :]
            return list(rest[: len(rest) // 2])
    return None


_MAPPED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _mapped_connection(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """``base`` (redis-py's TCP, TLS or Unix socket connection) with the event loop's own errors of a
    lost connection raised as ``redis.ConnectionError`` (see the module's docstring)."""
    mapped = _MAPPED.get(base)
    if mapped is None:
        mapped = _MAPPED[base] = type(f"Mapped{base.__name__}", (_MapsLostConnections, base), {})
    return mapped


class _MapsLostConnections:
    """Mixed into a redis-py connection class by :func:`_mapped_connection`.

    The write is redis-py's own, but its deadline is ``asyncio.timeout``, not ``asyncio.wait_for``:
    on Python 3.11 ``wait_for`` loses a cancellation that arrives as the write completes (fixed in
    3.12), which with a socket timeout set would leave a task that was told to stop running on."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        connection: Any = self
        if not connection.is_connected:
            await connection.connect_check_health(check_health=False)
        if check_health:
            await connection.check_health()
        if isinstance(command, str):
            command = command.encode()
        if isinstance(command, bytes):
            command = [command]
        try:
            async with asyncio.timeout(connection.socket_timeout or None):
                connection._writer.writelines(command)
                await connection._writer.drain()
        except TimeoutError:
            await connection.disconnect(nowait=True)
            raise redis.TimeoutError("Timeout writing to socket") from None
        except (OSError, RuntimeError) as exc:  # uvloop: "unable to perform operation on <TCPTransport closed=True>"
            await connection.disconnect(nowait=True)
            raise redis.ConnectionError(f"connection lost while writing: {exc!r}") from exc
        except BaseException:  # a write cut short: the connection's state is unknown
            await connection.disconnect(nowait=True)
            raise

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().read_response(*args, **kwargs)  # type: ignore[misc]
        except (RuntimeError, EOFError) as exc:
            await self.disconnect(nowait=True)  # type: ignore[attr-defined]
            raise redis.ConnectionError(f"connection lost while reading: {exc!r}") from exc


class AsyncCluster(redis.asyncio.cluster.RedisCluster):  # type: ignore[misc]  # redis is untyped here
    """redis-py's cluster client, routing stream reads without a round trip.

    redis-py finds the keys of commands whose key positions move (XREAD, XREADGROUP) by asking the
    server (``COMMAND GETKEYS``) before every call, which would double the round trips of the
    proxy's busiest command. Their keys are simply the first half of what follows ``STREAMS``.
    """

    def __init__(self, *args: Any, redis_connect_func: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Every node's connections, now and after a slot map change, are built from these kwargs.
        mapped = _mapped_connection(self.connection_kwargs.get("connection_class", redis.asyncio.Connection))
        self.connection_kwargs["connection_class"] = mapped
        for node in self.nodes_manager.startup_nodes.values():
            node.connection_class = mapped
        if redis_connect_func is not None:
            # redis-py's cluster client takes no connect hook, but builds every node's connections from
            # these kwargs (the nodes manager shares the dict; the seed nodes hold copies).
            self.connection_kwargs["redis_connect_func"] = redis_connect_func
            for node in self.nodes_manager.startup_nodes.values():
                node.connection_kwargs["redis_connect_func"] = redis_connect_func

    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() in ("XREAD", "XREADGROUP"):
            streams = _streams_keys(args)
            if streams:
                slots = {self.keyslot(stream) for stream in streams}
                if len(slots) != 1:
                    raise RedisClusterException(f"{command} - all keys must map to the same key slot")
                return int(slots.pop())
        return int(await super()._determine_slot(command, *args))


def quiet_dropped_cluster_nodes(loop: asyncio.AbstractEventLoop) -> None:
    """Log redis-py's "Unclosed ClusterNode object" reports at DEBUG instead of asyncio's ERROR.

    When the slot map changes (failover, resharding) redis-py's cluster client replaces its node
    objects; a replaced node whose connection was busy at that moment reports itself through the
    loop's exception handler when it is garbage-collected, and its sockets close with it. Nothing is
    wrong and nothing can be closed from here, so the report is kept out of the error log."""
    previous = loop.get_exception_handler()
    message = redis.asyncio.cluster.ClusterNode._DEL_MESSAGE

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == message:
            logger.debug("redis-py dropped a cluster node object after a slot map change: %s", context.get("client"))
        elif previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
