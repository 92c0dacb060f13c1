"""Produce messages into a topic's queues (Redis streams) with dense offsets, each message once.

>>> with Producer("redis://127.0.0.1:6379/0") as producer:
...     producer.send("rides", b'{"ride": 42}', key="rider-42")
SendResult(topic='rides', qid=0, offset=1)

Layout written here and read by the proxy (names from :mod:`ddmq.protocol.redis.keys`):

- Topic metadata: hash ``keys.topic_meta(topic)`` with field ``queues`` (decimal), and the topic
  name in the set ``keys.topics()``. The first producer creates both (``HSETNX``) with its
  ``default_queues``; later producers use the stored number.
- Queue choice: an explicit ``qid``, else ``hashing.queue_for_key(key, queues)``, else the dedup id's
  queue the same way (so a message sent again after a restart meets its dedup id), else round-robin
  per producer and topic.
- Offsets are dense per queue, starting at 1, and the entry id is exactly ``0-<offset>``. One Lua
  script call per queue and batch reads the last offset from ``keys.sequence(topic, qid)``, adds the
  entries, then stores the new last offset; the sequence only moves after the entries are written,
  so a failed call leaves no gap. Every key of a call shares the queue's hash tag (single slot).
- Entry fields: :mod:`ddmq.protocol.redis.stream_entry`.

Failures: each call carries the producer's random id and a per-queue sequence number, and the script
(``IDEMPOTENT_PRODUCE_LUA``) answers a call it already applied with the offsets it gave then, so the
producer retries retriable Redis errors (:mod:`ddmq.protocol.produce.delivery`) until ``delivery_timeout_ms``
and raises :class:`~ddmq.protocol.produce.delivery.DeliveryError` after it; wrong arguments raise
``ValueError``/``TypeError`` before anything is written.

Tracing: where ``opentelemetry-api`` is installed a send is a span and its messages carry its trace
context in their properties (:mod:`ddmq.protocol.produce.tracing`; ``DDMQ_TRACING=off`` turns it off).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript, Script
from redis.retry import Retry

from ddmq.protocol.produce import tracing
from ddmq.protocol.produce.calls import (
    DEFAULT_DEDUP_WINDOW_S,
    MESSAGE_FIELDS,
    OutgoingMessage,
    Planner,
    SendResult,
    as_message,
)
from ddmq.protocol.produce.delivery import (
    DEFAULT_DELIVERY_TIMEOUT_MS,
    DEFAULT_REQUEST_TIMEOUT_MS,
    DeliveryError,
    MessageTooLargeError,
    RedisFullError,
    RetryPolicy,
)
from ddmq.protocol.produce.steps import Execute, ProducerCore, Stepper, Steps
from ddmq.protocol.redis.connection import (
    REDIS_ERRORS,
    AsyncRedis,
    SyncRedis,
    async_redis,
    is_cluster_url,
    redact_url,
    sync_redis,
)
from ddmq.protocol.redis.queues import (
    ProduceError,
    TopicMismatchError,
    ensure_topic,
    repair_queue,
)
from ddmq.protocol.redis.scripts import IDEMPOTENT_PRODUCE_LUA

__all__ = [
    "DEFAULT_DEDUP_WINDOW_S",
    "MESSAGE_FIELDS",
    "AsyncProducer",
    "DeliveryError",
    "MessageTooLargeError",
    "OutgoingMessage",
    "ProduceError",
    "Producer",
    "RedisFullError",
    "SendResult",
    "TopicMismatchError",
    "ensure_topic",
    "repair_queue",
]

T = TypeVar("T")


def _client_options(url: str, request_timeout_ms: int, asynchronous: bool) -> dict[str, Any]:
    """Socket timeouts for a client the producer builds, and no retries inside redis-py on one server:
    the producer retries whole calls itself, with its own deadline and count."""
    seconds = request_timeout_ms / 1000
    options: dict[str, Any] = {"socket_timeout": seconds, "socket_connect_timeout": seconds}
    if not is_cluster_url(url):
        options["retry"] = AsyncRetry(NoBackoff(), 0) if asynchronous else Retry(NoBackoff(), 0)
    return options


@dataclass
class _Settings:
    """What the sync and async producers take beyond the client, checked once."""

    default_queues: int = 8
    maxlen: int | None = None
    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    retry_backoff_ms: int = 50
    retry_backoff_max_ms: int = 1000
    dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S
    max_message_bytes: int | None = None

    def planner(self) -> Planner:
        if self.request_timeout_ms < 1:
            raise ValueError(f"request_timeout_ms must be at least 1, not {self.request_timeout_ms!r}")
        return Planner(
            self.default_queues, self.maxlen, delivery_timeout_ms=self.delivery_timeout_ms,
            dedup_window_s=self.dedup_window_s, max_message_bytes=self.max_message_bytes,
        )

    def policy(self) -> RetryPolicy:
        return RetryPolicy(self.delivery_timeout_ms, self.retry_backoff_ms, self.retry_backoff_max_ms)


_SETTINGS_DOC = """
    ``url_or_client`` is a URL (the producer owns and closes that client; ``?cluster=true`` for a Redis
    Cluster, see :mod:`ddmq.protocol.redis.connection`) or an existing ``redis.Redis`` or
    ``redis.cluster.RedisCluster`` (left open by :meth:`close`). ``default_queues`` is used only when the
    topic does not exist yet; ``maxlen`` trims each queue approximately (``MAXLEN ~``) to that many
    entries. A send retries retriable Redis errors with backoff (``retry_backoff_ms`` doubling up to
    ``retry_backoff_max_ms``, jittered) until ``delivery_timeout_ms`` has passed, then raises
    :class:`DeliveryError`; ``request_timeout_ms`` is the socket timeout of a client built from a URL.
    ``dedup_window_s``: how long a message's ``dedup_id`` is remembered. ``max_message_bytes``: larger
    messages are refused (:class:`MessageTooLargeError`) before anything of their batch is written.
    One send at a time per producer (others wait); use several producers for parallel sends.
"""


class Producer:
    __doc__ = "Synchronous producer on a redis-py client.\n" + _SETTINGS_DOC

    def __init__(
        self,
        url_or_client: str | SyncRedis,
        /,
        *,
        default_queues: int = 8,
        maxlen: int | None = None,
        delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        retry_backoff_ms: int = 50,
        retry_backoff_max_ms: int = 1000,
        dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
        max_message_bytes: int | None = None,
    ) -> None:
        settings = _Settings(
            default_queues, maxlen, delivery_timeout_ms, request_timeout_ms, retry_backoff_ms,
            retry_backoff_max_ms, dedup_window_s, max_message_bytes,
        )
        planner = settings.planner()  # checks the settings before a client is built
        self._lock = threading.Lock()
        if isinstance(url_or_client, str):
            try:
                self._redis: SyncRedis = sync_redis(
                    url_or_client, **_client_options(url_or_client, request_timeout_ms, asynchronous=False)
                )
            except REDIS_ERRORS as exc:  # a cluster client reads the slot map at once
                raise ProduceError(f"cannot reach the Redis Cluster at {redact_url(url_or_client)}: {exc}") from exc
            self._owned = True
        else:
            self._redis = url_or_client
            self._owned = False
        script: Script = self._redis.register_script(IDEMPOTENT_PRODUCE_LUA)
        self._core = ProducerCore(planner, settings.policy(), self._redis, script.sha)

    @property
    def retries(self) -> int:
        """Retries made by every send so far (``ddmq produce`` reports it)."""
        return self._core.retries

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owned:
            self._redis.close()

    def _run(self, steps: Steps[T]) -> T:
        stepper = Stepper(steps)
        while (step := stepper.next()) is not None:
            if not isinstance(step, Execute):
                time.sleep(step)
                continue
            try:
                stepper.value = step.pipe.execute(raise_on_error=step.raise_on_error)
            except REDIS_ERRORS as exc:
                stepper.error = exc
        return stepper.result

    def queue_count(self, topic: str) -> int:
        """The topic's number of queues; creates the topic with ``default_queues`` if it is missing."""
        return self._run(self._core.queue_count(topic))

    def ensure_topic(self, topic: str, queues: int) -> int:
        """Create the topic with ``queues`` queues, or check that it has that many.

        Raises :class:`TopicMismatchError` when it exists with a different number.
        """
        return self._run(self._core.ensure_topic(topic, queues))

    def find_topic(self, topic: str) -> tuple[int | None, list[str]]:
        """The topic's number of queues, None when it does not exist, and the topics that do; writes
        nothing. Redis failures are retried until ``delivery_timeout_ms`` (then :class:`DeliveryError`)."""
        return self._run(self._core.find_topic(topic))

    def check_message(self, message: OutgoingMessage) -> None:
        """What ``send_batch`` would refuse this message for (TypeError, ValueError, MessageTooLargeError)."""
        self._core.planner.encode(message, 0)

    def send(
        self,
        topic: str,
        value: bytes | str,
        key: str | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        qid: int | None = None,
        dedup_id: str | None = None,
    ) -> SendResult:
        """Send one message; returns where it landed."""
        return self.send_batch(topic, [OutgoingMessage(value, key, tag, properties, qid, dedup_id)])[0]

    def send_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> list[SendResult]:
        """Send messages in one round trip (one script call per queue); results keep the input order."""
        batch = [as_message(m) for m in messages]
        if not batch:
            return []
        if tracing.ACTIVE:
            with tracing.sending(topic, len(batch)) as span:
                results = self._send(topic, span.stamp(batch))
                span.sent(results)
                return results
        return self._send(topic, batch)

    def _send(self, topic: str, batch: list[OutgoingMessage]) -> list[SendResult]:
        queues = self.queue_count(topic)
        with self._lock:
            return self._run(self._core.send_batch(topic, batch, queues))


class AsyncProducer:
    __doc__ = (
        "The asyncio twin of :class:`Producer`, on ``redis.asyncio``; same arguments and results.\n\n"
        '    >>> async with AsyncProducer("redis://127.0.0.1:6379/0") as producer:\n'
        '    ...     await producer.send("rides", b"hello", key="rider-42")\n' + _SETTINGS_DOC
    )

    def __init__(
        self,
        url_or_client: str | AsyncRedis,
        /,
        *,
        default_queues: int = 8,
        maxlen: int | None = None,
        delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        retry_backoff_ms: int = 50,
        retry_backoff_max_ms: int = 1000,
        dedup_window_s: float = DEFAULT_DEDUP_WINDOW_S,
        max_message_bytes: int | None = None,
    ) -> None:
        settings = _Settings(
            default_queues, maxlen, delivery_timeout_ms, request_timeout_ms, retry_backoff_ms,
            retry_backoff_max_ms, dedup_window_s, max_message_bytes,
        )
        planner = settings.planner()  # checks the settings before a client is built
        self._lock = asyncio.Lock()
        if isinstance(url_or_client, str):
            self._redis: AsyncRedis = async_redis(
                url_or_client, **_client_options(url_or_client, request_timeout_ms, asynchronous=True)
            )
            self._owned = True
        else:
            self._redis = url_or_client
            self._owned = False
        script: AsyncScript = self._redis.register_script(IDEMPOTENT_PRODUCE_LUA)
        self._core = ProducerCore(planner, settings.policy(), self._redis, script.sha)

    @property
    def retries(self) -> int:
        """Retries made by every send so far."""
        return self._core.retries

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owned:
            await self._redis.aclose()

    async def _run(self, steps: Steps[T]) -> T:
        stepper = Stepper(steps)
        while (step := stepper.next()) is not None:
            if not isinstance(step, Execute):
                await asyncio.sleep(step)
                continue
            try:
                stepper.value = await step.pipe.execute(raise_on_error=step.raise_on_error)
            except REDIS_ERRORS as exc:
                stepper.error = exc
        return stepper.result

    async def queue_count(self, topic: str) -> int:
        """The topic's number of queues; creates the topic with ``default_queues`` if it is missing."""
        return await self._run(self._core.queue_count(topic))

    async def ensure_topic(self, topic: str, queues: int) -> int:
        """See :func:`ensure_topic`."""
        return await self._run(self._core.ensure_topic(topic, queues))

    async def find_topic(self, topic: str) -> tuple[int | None, list[str]]:
        """See :meth:`Producer.find_topic`."""
        return await self._run(self._core.find_topic(topic))

    def check_message(self, message: OutgoingMessage) -> None:
        """What ``send_batch`` would refuse this message for (TypeError, ValueError, MessageTooLargeError)."""
        self._core.planner.encode(message, 0)

    async def send(
        self,
        topic: str,
        value: bytes | str,
        key: str | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        qid: int | None = None,
        dedup_id: str | None = None,
    ) -> SendResult:
        return (await self.send_batch(topic, [OutgoingMessage(value, key, tag, properties, qid, dedup_id)]))[0]

    async def send_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> list[SendResult]:
        batch = [as_message(m) for m in messages]
        if not batch:
            return []
        if tracing.ACTIVE:
            with tracing.sending(topic, len(batch)) as span:
                results = await self._send(topic, span.stamp(batch))
                span.sent(results)
                return results
        return await self._send(topic, batch)

    async def _send(self, topic: str, batch: list[OutgoingMessage]) -> list[SendResult]:
        queues = await self.queue_count(topic)
        async with self._lock:
            return await self._run(self._core.send_batch(topic, batch, queues))
