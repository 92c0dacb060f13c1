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
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from typing import Any, TypeAlias
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import NoScriptError, RedisClusterException

__all__ = [
    "REDIS_ERRORS",
    "REDIS_FAILURES",
    "AsyncRedis",
    "SyncRedis",
    "async_redis",
    "check_url",
    "eval_script",
    "eval_scripts",
    "is_cluster_url",
    "quiet_dropped_cluster_nodes",
    "redact_url",
    "sync_redis",
]

logger = logging.getLogger(__name__)

#: A client of one server or of a cluster; everything the project calls exists on both.
AsyncRedis: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
SyncRedis: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"

#: What a Redis call may raise when Redis is at fault, on one server or on a cluster.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
#: :data:`REDIS_ERRORS` and socket errors (a timeout is an ``OSError``): Redis is unavailable.
REDIS_FAILURES: tuple[type[Exception], ...] = (*REDIS_ERRORS, OSError)

#: A URL's ``user:password@`` part (the password ends at the last ``@`` before the host list).
_CREDENTIALS = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:@/?#]*):(?P<password>[^/?#]*)@")
_SECRET_QUERY = frozenset({"password", "ssl_password"})


def redact_url(url: str) -> str:
    """``url`` as it may be shown: the password (in ``user:password@`` or a ``password=`` query
    parameter) replaced by ``***``, e.g. ``redis://:***@10.0.0.5:6379/0``. Every log line, error
    message and answer that names a Redis URL goes through here."""
    shown = _CREDENTIALS.sub(lambda m: f"{m['head']}:***@", url, count=1)
    if "?" in shown:
        base, _, query = shown.partition("?")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(name in _SECRET_QUERY for name, _ in pairs):
            shown = base + "?" + "&".join(
                f"{name}=***" if name in _SECRET_QUERY else urlencode({name: value}) for name, value in pairs
            )
    return shown


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", ""})


class _ClusterUrl:
    """A cluster URL split into redis-py's single-host URL and the other seeds."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        credentials, _, hosts = parts.netloc.rpartition("@")
        seeds = [seed.strip() for seed in hosts.split(",")]
        if not all(seeds):
            raise ValueError(f"Redis URL {redact_url(url)!r}: empty host in the seed list")
        query = [(name, value) for name, value in parse_qsl(parts.query, keep_blank_values=True) if name != "cluster"]
        netloc = f"{credentials}@{seeds[0]}" if credentials else seeds[0]
        self.first = urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))
        self.others: list[tuple[str, int]] = []
        for seed in seeds[1:]:
            host, _, port = seed.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"Redis URL {redact_url(url)!r}: seed {seed!r} is not host:port")
            self.others.append((host.strip("[]"), int(port)))
        if parts.path.strip("/") not in ("", "0"):
            raise ValueError(f"Redis URL {redact_url(url)!r}: a Redis Cluster has database 0 only")


def is_cluster_url(url: str) -> bool:
    """True when the URL's query says ``cluster=true`` (``1``, ``yes``, ``on`` too); ValueError on nonsense."""
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name == "cluster":
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
            raise ValueError(f"Redis URL {redact_url(url)!r}: cluster={value!r} is neither true nor false")
    return False


def check_url(url: str) -> str:
    """``url`` if its cluster part makes sense (seeds as ``host:port``, database 0), else ValueError."""
    if is_cluster_url(url):
        _ClusterUrl(url)
    return url


def async_redis(url: str, **kwargs: Any) -> AsyncRedis:
    """An asyncio client for ``url``; ``kwargs`` go to redis-py (e.g. ``decode_responses``)."""
    if not is_cluster_url(url):
        return redis.asyncio.Redis.from_url(url, **kwargs)
    parsed = _ClusterUrl(url)
    seeds = [redis.asyncio.cluster.ClusterNode(host, port) for host, port in parsed.others]
    return _AsyncCluster.from_url(parsed.first, startup_nodes=seeds or None, **kwargs)


def sync_redis(url: str, **kwargs: Any) -> SyncRedis:
    """A blocking client for ``url``; ``kwargs`` go to redis-py.

    A cluster client reads the slot map here, so an unreachable cluster raises ``redis.ConnectionError``
    at once (a single-server client connects at its first command)."""
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **kwargs)
    parsed = _ClusterUrl(url)
    seeds = [redis.cluster.ClusterNode(host, port) for host, port in parsed.others]
    try:
        return redis.cluster.RedisCluster.from_url(parsed.first, startup_nodes=seeds or None, **kwargs)
    except RedisClusterException as exc:  # it asks for the slot map at once; none of the seeds answered
        raise redis.ConnectionError(str(exc)) from exc


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


class _AsyncCluster(redis.asyncio.cluster.RedisCluster):  # type: ignore[misc]  # redis is untyped here
    """redis-py's cluster client, routing stream reads without a round trip.

    redis-py finds the keys of commands whose key positions move (XREAD, XREADGROUP) by asking the
    server (``COMMAND GETKEYS``) before every call, which would double the round trips of the
    proxy's busiest command. Their keys are simply the first half of what follows ``STREAMS``.
    """

    def __init__(self, *args: Any, redis_connect_func: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
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
