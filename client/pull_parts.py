"""What both pull consumers share: the messages and counters a user sees, server addresses, and the
parts of a puller (its settings, the results it has not reported yet, its backoff, the fatal error
that stops every puller, and the split of a pull reply into ordered runs).

:mod:`ddmq.client.consumer` builds :class:`~ddmq.client.consumer.PullConsumer` (threads) and
:class:`~ddmq.client.consumer.AsyncPullConsumer` (tasks) from these parts and re-exports the public
names; import them from there.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ddmq.client.thrift_client import ProxyClientError
from ddmq.protocol.wire import DEFAULT_PORT, ConsumeResult, Context, FailDetail, PullRequest, PullResponse, link_results

__all__ = [
    "DEFAULT_MAX_BACKOFF_MS",
    "DEFAULT_RETRY_SLEEP_MS",
    "Backoff",
    "ConsumedMessage",
    "ConsumerStats",
    "Counters",
    "FatalError",
    "NotProcessed",
    "PendingResults",
    "PullerSettings",
    "consumed_messages",
    "parse_servers",
    "split_runs",
]

# The consumers' logger: one name covers everything a consumer logs, whichever module it comes from.
log = logging.getLogger("ddmq.client.consumer")


class NotProcessed(Exception):
    """Raised by a processor to give a message back, neither acked nor failed: it is released (the
    proxy delivers it again at once, first in its key, and counts no attempt). ``ddmq consume`` does this
    with messages it could not print. A proxy that predates releases ignores them and redelivers the
    message after the group's ``timeout_ms``, counting an attempt."""


@dataclass(frozen=True)
class ConsumedMessage:
    """One message as a processor sees it; ``qid`` is the queue number as the wire carries it (a string)."""

    topic: str
    qid: str
    offset: int
    key: str
    value: bytes
    tag: str
    properties: dict[str, str]
    produce_ms: int = 0
    """Produce time in milliseconds since the epoch; 0 when unknown."""


@dataclass(frozen=True)
class ConsumerStats:
    """Counters since start: messages pulled, acked (processor True), failed, left unreported
    (:class:`NotProcessed`), and pull/submit errors."""

    pulled: int = 0
    acked: int = 0
    failed: int = 0
    errors: int = 0
    unreported: int = 0
    """Left unreported: the rest of an ordered run after its first failure."""
    released: int = 0
    """Given back unprocessed: :class:`NotProcessed`, or pulled but not handled when the consumer stopped."""
    extended: int = 0
    """Extensions sent for messages held past half of the group's ``timeout_ms`` (one per message)."""


def parse_servers(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:9713,h2"`` or ``["h1:9713", "[::1]:9713"]`` → ``[(host, port), ...]`` (port defaults to 9713)."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses = []
    for item in (part.strip() for part in items):
        if not item:
            continue
        if "://" in item:  # a URL: read as host:port it would name host "http" or a port that is no port
            raise ValueError(f"bad server address {item!r}: give host:port, without a scheme such as http://")
        host, port = item, DEFAULT_PORT
        if item.startswith("["):  # [v6 address]:port
            end = item.find("]")
            if end < 0:
                raise ValueError(f"bad server address {item!r}")
            host, rest = item[1:end], item[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"bad server address {item!r}")
                port = _parse_port(rest[1:], item)
        elif item.count(":") == 1:
            host, port_text = item.split(":")
            port = _parse_port(port_text, item)
        if not host:
            raise ValueError(f"bad server address {item!r}")
        addresses.append((host, port))
    if not addresses:
        raise ValueError("no proxy server given")
    return addresses


def _parse_port(text: str, item: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"bad port in server address {item!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in server address {item!r}")
    return port


class Counters:
    """Thread-safe counters behind :class:`ConsumerStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pulled = self._acked = self._failed = self._errors = self._unreported = self._answered = 0
        self._released = self._extended = 0

    def add(self, *, pulled: int = 0, acked: int = 0, failed: int = 0, errors: int = 0, unreported: int = 0,
            answered: int = 0, released: int = 0, extended: int = 0) -> None:
        with self._lock:
            self._released += released
            self._extended += extended
            self._answered += answered
            self._pulled += pulled
            self._acked += acked
            self._failed += failed
            self._errors += errors
            self._unreported += unreported

    @property
    def answered(self) -> int:
        """Pulls a proxy answered, with messages or without (a timing-dependent count, so not a stat)."""
        with self._lock:
            return self._answered

    def snapshot(self) -> ConsumerStats:
        with self._lock:
            return ConsumerStats(self._pulled, self._acked, self._failed, self._errors, self._unreported,
                                 self._released, self._extended)


class FatalError:
    """The first error of any puller that retrying cannot cure; the consumer stops on it and raises it
    once, from whichever of ``wait()``, ``run()`` or the context manager's exit comes first."""

    def __init__(self, on_error: Callable[[ProxyClientError], None] | None) -> None:
        self._on_error = on_error
        self._lock = threading.Lock()
        self.error: ProxyClientError | None = None
        self._raised = False

    def record(self, error: ProxyClientError, host: str, port: int) -> None:
        with self._lock:
            if self.error is not None:
                return
            self.error = error
        # With a callback, reporting is the caller's; otherwise the log must say why pulling stopped.
        log.log(logging.INFO if self._on_error else logging.ERROR,
                "%s:%d: %s; the consumer stops (this error does not go away by retrying)", host, port, error)
        if self._on_error is not None:
            try:
                self._on_error(error)
            except Exception:
                log.exception("on_error callback failed")

    def raise_once(self) -> None:
        with self._lock:
            error, raise_it = self.error, self.error is not None and not self._raised
            self._raised = True
        if raise_it and error is not None:
            raise error


class _QueueResults:
    """One queue's pending results; the verbs' lists stay empty (and off the wire) unless used."""

    __slots__ = ("extend", "fail", "fail_details", "release", "success")

    def __init__(self) -> None:
        self.success: list[int] = []
        self.fail: list[int] = []
        self.release: list[int] = []
        self.extend: list[int] = []
        self.fail_details: list[FailDetail] = []

    def __len__(self) -> int:
        return len(self.success) + len(self.fail) + len(self.release) + len(self.extend) + len(self.fail_details)


class PendingResults:
    """Offsets a puller has processed but not yet reported, per (topic, qid) in first-seen order.

    Besides acks and fails it carries the proxy's verbs (``ConsumeResult`` fields 80-82): a failure
    with a reason or a retry delay, a release (given back unprocessed, no attempt counted) and an
    extension (still working: the delivery deadline restarts). Each is sent only when used, so a
    client that never uses them sends the bytes it always did.
    """

    def __init__(self, group: str) -> None:
        self._group = group
        self._queues: dict[tuple[str, str], _QueueResults] = {}

    def __len__(self) -> int:
        return sum(map(len, self._queues.values()))

    def _queue(self, message: ConsumedMessage) -> _QueueResults:
        queue = self._queues.get((message.topic, message.qid))
        if queue is None:
            queue = self._queues[(message.topic, message.qid)] = _QueueResults()
        return queue

    def record(
        self, message: ConsumedMessage, ok: bool, *, reason: str | None = None, retry_after_ms: int | None = None
    ) -> None:
        """Ack (``ok``) or fail ``message``; a failure with a ``reason`` or ``retry_after_ms`` goes as a
        ``FailDetail`` (the reason shown in dead letters and the keys view, the delay instead of the
        group's retry interval), a plain one in ``failOffsets``."""
        queue = self._queue(message)
        if ok:
            queue.success.append(message.offset)
        elif reason is None and retry_after_ms is None:
            queue.fail.append(message.offset)
        else:
            queue.fail_details.append(FailDetail(offset=message.offset, retryAfterMs=retry_after_ms, reason=reason))

    def release(self, message: ConsumedMessage) -> None:
        """Give ``message`` back unprocessed: delivered again first in its key, no attempt counted."""
        self._queue(message).release.append(message.offset)

    def extend(self, message: ConsumedMessage) -> None:
        """Still working on ``message``: its delivery deadline restarts at the proxy."""
        self._queue(message).extend.append(message.offset)

    def to_wire(self) -> ConsumeResult | None:
        """A fresh ``ConsumeResult`` list, one node per queue (None when nothing is pending)."""
        return link_results(
            ConsumeResult(
                context=Context(groupId=self._group, topic=topic, qid=qid),
                successOffsets=list(queue.success),
                failOffsets=list(queue.fail),
                releaseOffsets=list(queue.release) if queue.release else None,
                extendOffsets=list(queue.extend) if queue.extend else None,
                failDetails=list(queue.fail_details) if queue.fail_details else None,
            )
            for (topic, qid), queue in self._queues.items()
        )

    def to_json(self) -> list[dict[str, object]]:
        """The same results as the HTTP API's ``results`` objects (verbs only when used)."""
        out: list[dict[str, object]] = []
        for (topic, qid), queue in self._queues.items():
            node: dict[str, object] = {
                "group": self._group, "topic": topic, "qid": qid, "success": list(queue.success),
                "fail": list(queue.fail),
            }
            if queue.release:
                node["release"] = list(queue.release)
            if queue.extend:
                node["extend"] = list(queue.extend)
            if queue.fail_details:
                node["fail_details"] = [
                    {"offset": d.offset, "retry_after_ms": d.retryAfterMs, "reason": d.reason}
                    for d in queue.fail_details
                ]
            out.append(node)
        return out

    def clear(self) -> None:
        self._queues.clear()


class Backoff:
    """Doubling sleeps after consecutive errors, from ``initial_ms`` up to ``max_ms``; each sleep is
    drawn between half and all of the current step, so clients cut off together do not retry together."""

    def __init__(self, initial_ms: int, max_ms: int) -> None:
        self._initial_ms = max(initial_ms, 1)
        self._max_ms = max(max_ms, self._initial_ms)
        self._next_ms = self._initial_ms

    def next_s(self) -> float:
        delay_ms = self._next_ms * random.uniform(0.5, 1.0)
        self._next_ms = min(self._next_ms * 2, self._max_ms)
        return delay_ms / 1000

    def reset(self) -> None:
        self._next_ms = self._initial_ms


def split_runs(response: PullResponse, messages: list[ConsumedMessage]) -> list[list[ConsumedMessage]]:
    """The reply's ordered runs (``PullResponse.runs``); each message alone when it has none. A ``runs``
    list that does not match the messages makes the whole reply one run: in order is always safe."""
    sizes = response.runs
    if not sizes:
        return [[message] for message in messages]
    if sum(sizes) != len(messages) or min(sizes) < 1:
        log.warning("pull reply with runs %s for %d messages: processing them as one run", sizes, len(messages))
        return [messages]
    runs = []
    start = 0
    for size in sizes:
        runs.append(messages[start:start + size])
        start += size
    return runs


def consumed_messages(response: PullResponse) -> list[ConsumedMessage]:
    context = response.context if response.context is not None else Context()
    topic, qid = context.topic or "", context.qid or ""
    messages = []
    for message in response.messages or ():
        if message.offset is None:
            log.warning("dropping a message of %s#%s without an offset", topic, qid)
            continue
        messages.append(
            ConsumedMessage(
                topic=topic,
                qid=qid,
                offset=message.offset,
                key=message.key or "",
                value=message.value or b"",
                tag=message.tag or "",
                properties=dict(message.properties or {}),
                produce_ms=message.produceTime or 0,
            )
        )
    return messages


DEFAULT_RETRY_SLEEP_MS: Final = 100
DEFAULT_MAX_BACKOFF_MS: Final = 5000


class PullerSettings:
    """What every puller of one consumer shares (validated once)."""

    def __init__(
        self,
        servers: str | Sequence[str],
        group: str,
        topic: str | None,
        pullers: int,
        batch_size: int,
        linger_ms: int,
        retry_sleep_ms: int,
        max_backoff_ms: int,
        timeout_s: float,
        max_per_key: int = 1,
    ) -> None:
        if not group:
            raise ValueError("group is required")
        if max_per_key < 1:
            raise ValueError(f"max_per_key must be positive, got {max_per_key}")
        if pullers < 1:
            raise ValueError(f"at least one puller is needed, got {pullers}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if linger_ms < 0 or retry_sleep_ms < 0:
            raise ValueError("linger_ms and retry_sleep_ms must not be negative")
        self.servers = parse_servers(servers)
        self.group = group
        self.topic = topic or None
        # Every server gets the same number of pullers, at least one: a server without a puller is
        # never read, and the queues a rebalance gave its proxy would stall (DDMQ's Carrera pool has
        # `clientNumPerServer` for the same reason). `pullers` is the total asked for, rounded up.
        self.pullers = -(-pullers // len(self.servers)) * len(self.servers)
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.retry_sleep_ms = retry_sleep_ms
        self.max_backoff_ms = max_backoff_ms
        self.timeout_s = timeout_s
        self.max_per_key = max_per_key

    def server_for(self, index: int) -> tuple[str, int]:
        """Puller ``index``'s server: round-robin, so each server's pullers are spread over the indexes."""
        return self.servers[index % len(self.servers)]

    def request(self, pending: PendingResults, request_id: str | None = None) -> PullRequest:
        return PullRequest(
            groupId=self.group,
            topic=self.topic,
            maxBatchSize=self.batch_size,
            maxLingerTime=self.linger_ms,
            result=pending.to_wire(),
            maxPerKey=self.max_per_key if self.max_per_key > 1 else None,
            requestId=request_id,
        )

    def returned_early(self, elapsed_s: float) -> bool:
        """An empty pull that came back well before the linger time did not long-poll: pause a little."""
        return self.linger_ms == 0 or elapsed_s * 1000 < self.linger_ms / 2


