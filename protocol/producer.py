"""Produce messages into a topic's queues (Redis streams) with dense offsets.

>>> with Producer("redis://127.0.0.1:6379/0") as producer:
...     producer.send("rides", b'{"ride": 42}', key="rider-42")
SendResult(topic='rides', qid=0, offset=1)

Layout written here and read by the proxy (names from :mod:`ddmq.protocol.keys`):

- Topic metadata: hash ``keys.topic_meta(topic)`` with field ``queues`` (decimal), and the topic
  name in the set ``keys.topics()``. The first producer creates both (``HSETNX``) with its
  ``default_queues``; later producers use the stored number.
- Queue choice: an explicit ``qid``, else ``hashing.queue_for_key(key, queues)``, else round-robin
  per producer and topic.
- Offsets are dense per queue, starting at 1, and the entry id is exactly ``0-<offset>``. One Lua
  script call per queue and batch reads the last offset from ``keys.sequence(topic, qid)``, adds the
  entries, then stores the new last offset; the sequence only moves after the entries are written,
  so a failed call leaves no gap. Both keys share the queue's hash tag (single slot).
- Entry fields: :mod:`ddmq.protocol.stream_entry`.

Redis failures surface as :class:`ProduceError`; wrong arguments as ``ValueError``/``TypeError``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple

from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from ddmq.protocol import keys, stream_entry
from ddmq.protocol.connection import REDIS_ERRORS, AsyncRedis, SyncRedis, async_redis, redact_url, sync_redis
from ddmq.protocol.hashing import queue_for_key
from ddmq.protocol.queues import (
    PRODUCE_LUA,
    ProduceError,
    TopicMismatchError,
    check_declared,
    check_queue_count,
    ensure_topic,
    parse_queues,
    redis_errors,
    repair_queue,
    topic_queues,
)

__all__ = [
    "MESSAGE_FIELDS",
    "AsyncProducer",
    "OutgoingMessage",
    "ProduceError",
    "Producer",
    "SendResult",
    "TopicMismatchError",
    "ensure_topic",
    "repair_queue",
]

logger = logging.getLogger(__name__)

#: Messages per script call; bigger batches for one queue become several calls in the same round trip,
#: so one call never blocks Redis for long.
MAX_MESSAGES_PER_CALL = 1000


class SendResult(NamedTuple):
    topic: str
    qid: int
    offset: int


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message for :meth:`Producer.send_batch`; a dict with the same keys works too.

    An empty key counts as no key (the entry cannot tell them apart), so the queue is round-robin.
    """

    value: bytes | str
    key: str | None = None
    tag: str | None = None
    properties: Mapping[str, str] | None = None
    qid: int | None = None


MESSAGE_FIELDS = frozenset({"value", "key", "tag", "properties", "qid"})


def _as_message(item: OutgoingMessage | Mapping[str, Any]) -> OutgoingMessage:
    if isinstance(item, OutgoingMessage):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - MESSAGE_FIELDS
        if unknown:
            raise ValueError(f"unknown message field(s) {sorted(unknown)}; known: {sorted(MESSAGE_FIELDS)}")
        if "value" not in item:
            raise ValueError("a message needs a 'value'")
        return OutgoingMessage(**item)
    raise TypeError(f"expected OutgoingMessage or a mapping, not {type(item).__name__}")


class _Call(NamedTuple):
    """One script call: messages (by input position) for one queue."""

    qid: int
    positions: list[int]
    keys: tuple[str, str]
    args: list[bytes | int]


class _Planner:
    """Queue choice and script arguments; shared by the sync and async producers (no I/O here)."""

    def __init__(self, default_queues: int, maxlen: int | None) -> None:
        if default_queues < 1:
            raise ValueError("default_queues must be at least 1")
        if maxlen is not None and maxlen < 1:
            raise ValueError("maxlen must be at least 1 (or None for no trimming)")
        self.default_queues = default_queues
        self.maxlen = maxlen
        self.queues: dict[str, int] = {}
        self._next_rr: dict[str, int] = {}

    @staticmethod
    def check_qid(topic: str, qid: int | None, queues: int) -> None:
        if qid is not None and (isinstance(qid, bool) or not isinstance(qid, int) or not 0 <= qid < queues):
            raise ValueError(f"qid {qid!r} is out of range for topic {topic!r} with {queues} queues")

    def choose_qid(self, topic: str, message: OutgoingMessage, queues: int) -> int:
        if message.qid is not None:
            return message.qid
        if message.key:
            return queue_for_key(message.key, queues)
        # a random start, so many short-lived producers do not all begin at queue 0
        rr = self._next_rr.get(topic)
        if rr is None:
            rr = random.randrange(queues)
        self._next_rr[topic] = (rr + 1) % queues
        return rr % queues

    def plan(self, topic: str, messages: Sequence[OutgoingMessage], queues: int) -> list[_Call]:
        now_ms = time.time_ns() // 1_000_000
        by_queue: dict[int, list[tuple[int, list[bytes]]]] = {}
        # validate everything before choosing queues, so a bad message does not advance round-robin
        entries = [stream_entry.encode_entry(m.value, m.key, m.tag, m.properties, now_ms) for m in messages]
        for message in messages:
            self.check_qid(topic, message.qid, queues)
        for position, (message, items) in enumerate(zip(messages, entries, strict=True)):
            qid = self.choose_qid(topic, message, queues)
            by_queue.setdefault(qid, []).append((position, items))
        calls = []
        maxlen: bytes | int = b"" if self.maxlen is None else self.maxlen
        for qid, queued in by_queue.items():
            for start in range(0, len(queued), MAX_MESSAGES_PER_CALL):
                chunk = queued[start:start + MAX_MESSAGES_PER_CALL]
                args: list[bytes | int] = [len(chunk), maxlen]
                for _, items in chunk:
                    args.append(len(items))
                    args.extend(items)
                queue_keys = (keys.stream(topic, qid), keys.sequence(topic, qid))
                calls.append(_Call(qid, [p for p, _ in chunk], queue_keys, args))
        return calls

    @staticmethod
    def results(topic: str, total: int, calls: Sequence[_Call], firsts: Sequence[int]) -> list[SendResult]:
        results: list[SendResult | None] = [None] * total
        for call, first in zip(calls, firsts, strict=True):
            for i, position in enumerate(call.positions):
                results[position] = SendResult(topic, call.qid, first + i)
        return [r for r in results if r is not None]


def _pipeline_outcome(
    topic: str, calls: Sequence[_Call], replies: Sequence[object]
) -> tuple[dict[int, int], list[int]]:
    """Split replies into first offsets (by call index) and the calls to repeat after NOSCRIPT."""
    firsts: dict[int, int] = {}
    retry: list[int] = []
    failed: list[str] = []
    cause: BaseException | None = None
    for index, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            retry.append(index)  # the script did not run at all, so repeating is safe
        elif isinstance(reply, int):
            firsts[index] = reply
        else:
            failed.append(f"queue {calls[index].qid}: {reply}")
            if cause is None and isinstance(reply, BaseException):
                cause = reply
    if failed:
        written = sorted({calls[i].qid for i in firsts})
        raise ProduceError(
            f"producing to topic {topic!r} failed for {'; '.join(failed)}"
            + (f" (queues {written} were written)" if written else "")
        ) from cause
    return firsts, retry


class Producer:
    """Synchronous producer on a redis-py client.

    ``url_or_client`` is a URL (the producer owns and closes that client; ``?cluster=true`` for a Redis
    Cluster, see :mod:`ddmq.protocol.connection`) or an existing ``redis.Redis`` or
    ``redis.cluster.RedisCluster`` (left open by :meth:`close`). ``default_queues`` is used only when the
    topic does not exist yet; ``maxlen`` trims each queue approximately (``MAXLEN ~``) to that many entries.
    """

    def __init__(
        self, url_or_client: str | SyncRedis, /, *, default_queues: int = 8, maxlen: int | None = None
    ) -> None:
        self._planner = _Planner(default_queues, maxlen)
        if isinstance(url_or_client, str):
            try:
                self._redis: SyncRedis = sync_redis(url_or_client)
            except REDIS_ERRORS as exc:  # a cluster client reads the slot map at once
                raise ProduceError(f"cannot reach the Redis Cluster at {redact_url(url_or_client)}: {exc}") from exc
            self._owned = True
        else:
            self._redis = url_or_client
            self._owned = False
        self._script: Script = self._redis.register_script(PRODUCE_LUA)

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owned:
            self._redis.close()

    def queue_count(self, topic: str) -> int:
        """The topic's number of queues; creates the topic with ``default_queues`` if it is missing."""
        keys.check_name("topic", topic)
        cached = self._planner.queues.get(topic)
        if cached is None:
            cached = self._topic_queues(topic, self._planner.default_queues)
            self._planner.queues[topic] = cached
        return cached

    def ensure_topic(self, topic: str, queues: int) -> int:
        """Create the topic with ``queues`` queues, or check that it has that many.

        Raises :class:`TopicMismatchError` when it exists with a different number.
        """
        keys.check_name("topic", topic)
        check_queue_count(queues)
        stored = check_declared(topic, self._topic_queues(topic, queues), queues)
        self._planner.queues[topic] = stored
        return stored

    def _topic_queues(self, topic: str, queues: int) -> int:
        with redis_errors(topic):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hsetnx(keys.topic_meta(topic), "queues", queues)
            pipe.hget(keys.topic_meta(topic), "queues")
            pipe.sadd(keys.topics(), topic)
            _, raw, _ = pipe.execute()
        return parse_queues(topic, raw)

    def send(
        self,
        topic: str,
        value: bytes | str,
        key: str | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        qid: int | None = None,
    ) -> SendResult:
        """Send one message; returns where it landed."""
        return self.send_batch(topic, [OutgoingMessage(value, key, tag, properties, qid)])[0]

    def send_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> list[SendResult]:
        """Send messages in one round trip (one script call per queue); results keep the input order."""
        batch = [_as_message(m) for m in messages]
        if not batch:
            return []
        calls = self._planner.plan(topic, batch, self.queue_count(topic))
        firsts: dict[int, int] = {}
        pending = list(range(len(calls)))
        with redis_errors(topic):
            for command, script in (("EVALSHA", self._script.sha), ("EVAL", self._script.script)):
                pipe = self._redis.pipeline(transaction=False)
                for index in pending:
                    # the raw command: redis-py's cluster pipelines refuse evalsha(), yet route this one by its keys
                    pipe.execute_command(command, script, 2, *calls[index].keys, *calls[index].args)
                replies = pipe.execute(raise_on_error=False)
                done, retry = _pipeline_outcome(topic, [calls[i] for i in pending], replies)
                firsts.update({pending[i]: first for i, first in done.items()})
                pending = [pending[i] for i in retry]
                if not pending:
                    break
                # A restarted server, or a replica just promoted, has an empty script cache: EVAL sends the
                # script itself (and caches it there); SCRIPT LOAD would only reach the masters redis-py knew.
                logger.debug("produce script not cached on the server; sending it")
            else:
                raise ProduceError(f"producing to topic {topic!r} failed: the script could not be loaded")
        return _Planner.results(topic, len(batch), calls, [firsts[i] for i in range(len(calls))])


class AsyncProducer:
    """The asyncio twin of :class:`Producer`, on ``redis.asyncio``; same arguments and results.

    >>> async with AsyncProducer("redis://127.0.0.1:6379/0") as producer:
    ...     await producer.send("rides", b"hello", key="rider-42")
    """

    def __init__(
        self,
        url_or_client: str | AsyncRedis,
        /,
        *,
        default_queues: int = 8,
        maxlen: int | None = None,
    ) -> None:
        self._planner = _Planner(default_queues, maxlen)
        if isinstance(url_or_client, str):
            self._redis: AsyncRedis = async_redis(url_or_client)
            self._owned = True
        else:
            self._redis = url_or_client
            self._owned = False
        self._script: AsyncScript = self._redis.register_script(PRODUCE_LUA)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owned:
            await self._redis.aclose()

    async def queue_count(self, topic: str) -> int:
        """The topic's number of queues; creates the topic with ``default_queues`` if it is missing."""
        keys.check_name("topic", topic)
        cached = self._planner.queues.get(topic)
        if cached is None:
            cached = await topic_queues(self._redis, topic, self._planner.default_queues)
            self._planner.queues[topic] = cached
        return cached

    async def ensure_topic(self, topic: str, queues: int) -> int:
        """See :func:`ensure_topic`."""
        stored = await ensure_topic(self._redis, topic, queues)
        self._planner.queues[topic] = stored
        return stored

    async def send(
        self,
        topic: str,
        value: bytes | str,
        key: str | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        qid: int | None = None,
    ) -> SendResult:
        return (await self.send_batch(topic, [OutgoingMessage(value, key, tag, properties, qid)]))[0]

    async def send_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> list[SendResult]:
        batch = [_as_message(m) for m in messages]
        if not batch:
            return []
        calls = self._planner.plan(topic, batch, await self.queue_count(topic))
        firsts: dict[int, int] = {}
        pending = list(range(len(calls)))
        with redis_errors(topic):
            for command, script in (("EVALSHA", self._script.sha), ("EVAL", self._script.script)):
                pipe = self._redis.pipeline(transaction=False)
                for index in pending:
                    # the raw command: redis-py's cluster pipelines refuse evalsha(), yet route this one by its keys
                    pipe.execute_command(command, script, 2, *calls[index].keys, *calls[index].args)
                replies = await pipe.execute(raise_on_error=False)
                done, retry = _pipeline_outcome(topic, [calls[i] for i in pending], replies)
                firsts.update({pending[i]: first for i, first in done.items()})
                pending = [pending[i] for i in retry]
                if not pending:
                    break
                # A restarted server, or a replica just promoted, has an empty script cache: EVAL sends the
                # script itself (and caches it there); SCRIPT LOAD would only reach the masters redis-py knew.
                logger.debug("produce script not cached on the server; sending it")
            else:
                raise ProduceError(f"producing to topic {topic!r} failed: the script could not be loaded")
        return _Planner.results(topic, len(batch), calls, [firsts[i] for i in range(len(calls))])
