"""``Redis``: write fields of each message to Redis commands, several messages per pipeline.

Settings under ``redis_action`` (see :class:`~ddmq.config.schema.RedisActionConfig`). For every
message, each configured command whose ``when`` holds (all, without ``when``) is built:

- ``set key value [PX ttl_ms]``;
- ``hset key field value ...`` (``hmset`` is the same: Redis 4 made HSET take many fields), then
  ``pexpire key ttl_ms`` when a TTL is set;
- ``del key``.

Keys are templates: ``{$.path}`` is replaced by the value found in the body (strings as they are,
other JSON values as JSON text), other braces are literal, so ``{rider:{$.id}}`` is a Redis Cluster
hash tag. Values are written as strings the same way. A key part or a ``set`` value that is missing
makes the message unpushable: it is dead-lettered at once. Hash fields that are missing are left out.

A pipeline that cannot run (connection refused, timeout) or a command Redis refuses (say WRONGTYPE)
is a failed attempt of the messages concerned, retried and finally dead-lettered like a pull client's
fail (see :mod:`ddmq.actions.push`). Messages of one pipeline are heads of distinct order keys.

The Redis written to is the user's, not the broker: its client is this action's own, and its errors are
the push's outcomes, so this module catches redis-py's errors itself, an edge of its own beside the
proxy's store (``tests/test_layers.py``, ``REDIS_EDGES``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ddmq.actions.base import ChainContext, register
from ddmq.actions.job import INVALID_JSON, NOT_PARSED, Job
from ddmq.actions.push import Failure, Outcome, PushAction
from ddmq.config.expression import Predicate, compile_expression
from ddmq.config.jsonpath import MISSING, compile_jsonpath, parse_key_template
from ddmq.config.schema import RedisCommandConfig

log = logging.getLogger(__name__)

def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"))


class _Command:
    """One configured command, compiled."""

    def __init__(self, config: RedisCommandConfig) -> None:
        self.command = config.command
        self.key = parse_key_template(config.key)
        self.value = compile_jsonpath(config.value) if config.value else None
        self.fields = [(name, compile_jsonpath(path)) for name, path in config.fields.items()]
        self.ttl_ms = config.ttl_ms
        self.when: Predicate | None = compile_expression(config.when) if config.when else None
        self.source = config.key

    def build(self, data: Any) -> list[tuple[Any, ...]] | Failure:
        """The Redis calls for ``data`` (maybe none), or why there cannot be any."""
        if self.when is not None and not self.when(data):
            return []
        pieces = []
        for part in self.key:
            if isinstance(part, str):
                pieces.append(part)
                continue
            value = part(data)
            if value is MISSING or value is None:
                return Failure(f"{self.command}: the key {self.source!r} needs a value the body lacks", permanent=True)
            pieces.append(_text(value))
        key = "".join(pieces)
        if self.command == "del":
            return [("DEL", key)]
        if self.command == "set":
            assert self.value is not None
            value = self.value(data)
            if value is MISSING:
                return Failure(f"set {key}: the value's path finds nothing", permanent=True)
            if self.ttl_ms is not None:
                return [("SET", key, _text(value), "PX", self.ttl_ms)]
            return [("SET", key, _text(value))]
        flat: list[str] = []
        for name, getter in self.fields:
            value = getter(data)
            if value is not MISSING:
                flat += (name, _text(value))
        if not flat:
            return []
        calls: list[tuple[Any, ...]] = [("HSET", key, *flat)]
        if self.ttl_ms is not None:
            calls.append(("PEXPIRE", key, self.ttl_ms))
        return calls


@register("Redis")
class RedisAction(PushAction):
    name = "Redis"

    def __init__(self, ctx: ChainContext) -> None:
        config = ctx.config.redis_action
        assert config is not None  # the config refuses Redis without its settings
        super().__init__(ctx, workers=config.max_in_flight, batch_size=config.batch_size)
        self.config = config
        self._commands = [_Command(command) for command in config.commands]
        self._client: aioredis.Redis | None = None

    def open(self) -> None:
        self._client = aioredis.Redis.from_url(self.config.url, max_connections=self.config.max_in_flight + 1)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def calls_for(self, job: Job) -> list[tuple[Any, ...]] | Failure:
        data = job.data
        if data is INVALID_JSON or data is NOT_PARSED:
            return Failure(f"Redis: {job.last_error or 'body is not JSON'}", permanent=True)
        calls: list[tuple[Any, ...]] = []
        for command in self._commands:
            built = command.build(data)
            if isinstance(built, Failure):
                return built
            calls += built
        return calls

    async def push(self, jobs: list[Job]) -> list[Outcome]:
        outcomes: list[Outcome] = [None] * len(jobs)
        spans: list[tuple[int, int, int]] = []  # job index, first result, results
        client = self._client
        assert client is not None, "Redis action not started"
        pipe = client.pipeline(transaction=False)
        count = 0
        for i, job in enumerate(jobs):
            calls = self.calls_for(job)
            if isinstance(calls, Failure):
                outcomes[i] = calls
                continue
            for call in calls:
                pipe.execute_command(*call)
            spans.append((i, count, len(calls)))
            count += len(calls)
        if not count:
            return outcomes
        try:
            async with asyncio.timeout(self.config.timeout_ms / 1000):
                results = await pipe.execute(raise_on_error=False)
        except TimeoutError:
            return self._all_failed(outcomes, spans, f"no answer from Redis within {self.config.timeout_ms} ms")
        except RedisError as exc:
            return self._all_failed(outcomes, spans, f"Redis pipeline failed: {exc!r}")
        finally:
            await pipe.reset()
        for i, first, n in spans:
            errors = [r for r in results[first : first + n] if isinstance(r, Exception)]
            if errors:
                outcomes[i] = Failure(f"Redis refused a command: {errors[0]}")
        return outcomes

    @staticmethod
    def _all_failed(outcomes: list[Outcome], spans: list[tuple[int, int, int]], reason: str) -> list[Outcome]:
        for i, _, _ in spans:
            outcomes[i] = Failure(reason)
        return outcomes
