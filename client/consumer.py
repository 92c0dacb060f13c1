"""Pull consumers: a pool of pullers that long-poll the proxies and report results on their next pull.

Like DDMQ's Carrera consumer pool, each puller (a thread in :class:`PullConsumer`, a task in
:class:`AsyncPullConsumer`) owns one connection to one proxy, the servers being dealt out round-robin.
A puller loops: pull (carrying the results of its previous batch), hand the messages to the processor
in order, remember which offsets succeeded and which failed, pull again. When it stops, it sends what
it still holds with a final ``submit``. Results always go back to the proxy that handed the messages
out, so a puller never switches servers; after a connection error it reconnects with backoff (doubling,
with jitter so that many clients do not retry in step) and keeps its results for the next successful call.

Errors that retrying cannot cure (:attr:`ProxyClientError.retriable` is False: an unknown group or
topic, a server that speaks HTTP) stop the whole consumer: :attr:`PullConsumer.error` holds the first
one, ``on_error`` is called with it, and :meth:`~PullConsumer.wait`, :meth:`~PullConsumer.run` and the
end of a ``with`` block raise it.

>>> def process(message: ConsumedMessage) -> bool:
...     print(message.topic, message.qid, message.offset, message.value)
...     return True  # False (or an exception) fails the message: it is retried later
>>> consumer = PullConsumer("proxy-1:9713,proxy-2:9713", "rides", process, threads=4)
>>> consumer.run()  # until consumer.stop() (from a processor, another thread) or Ctrl-C; raises a fatal error

With ``max_per_key=N`` (N > 1) a pull may carry *ordered runs*: up to N successive messages of one order
key (with QID order, of one queue). The consumer processes a run in order and stops it at its first
failure: the processed prefix is acked, the failed message failed, and the rest of the run is left
unreported; the proxy delivers it again, in order, once the failed message is finished. Different runs
are different keys: :class:`AsyncPullConsumer` processes the runs of one pull concurrently,
:class:`PullConsumer` one after another in the puller thread (other pullers serve other keys).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import random
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final

from ddmq.client import clitools
from ddmq.client.thrift_client import AsyncProxyClient, ProxyClient, ProxyClientError
from ddmq.client.wire import DEFAULT_PORT, ConsumeResult, Context, PullRequest, PullResponse, link_results

__all__ = [
    "AsyncPullConsumer",
    "ConsumedMessage",
    "ConsumerStats",
    "NotProcessed",
    "PullConsumer",
    "add_cli",
    "parse_servers",
]

log = logging.getLogger(__name__)

DEFAULT_RETRY_SLEEP_MS: Final = 100
DEFAULT_MAX_BACKOFF_MS: Final = 5000


class NotProcessed(Exception):
    """Raised by a processor to leave a message neither acked nor failed: it is not reported, and the
    proxy delivers it again once the group's ``timeout_ms`` has passed, as it does for the messages of a
    consumer that went away (its timeout rule counts that as an attempt). ``ddmq consume`` does this
    with messages it could not print."""


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
    """Left unreported: :class:`NotProcessed`, or the rest of an ordered run after its first failure."""


def parse_servers(servers: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"h1:9713,h2"`` or ``["h1:9713", "[::1]:9713"]`` → ``[(host, port), ...]`` (port defaults to 9713)."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses = []
    for item in (part.strip() for part in items):
        if not item:
            continue
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


class _Counters:
    """Thread-safe counters behind :class:`ConsumerStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pulled = self._acked = self._failed = self._errors = self._unreported = 0

    def add(self, *, pulled: int = 0, acked: int = 0, failed: int = 0, errors: int = 0, unreported: int = 0) -> None:
        with self._lock:
            self._pulled += pulled
            self._acked += acked
            self._failed += failed
            self._errors += errors
            self._unreported += unreported

    def snapshot(self) -> ConsumerStats:
        with self._lock:
            return ConsumerStats(self._pulled, self._acked, self._failed, self._errors, self._unreported)


class _FatalError:
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


class _PendingResults:
    """Offsets a puller has processed but not yet reported, per (topic, qid) in first-seen order."""

    def __init__(self, group: str) -> None:
        self._group = group
        self._queues: dict[tuple[str, str], tuple[list[int], list[int]]] = {}

    def __len__(self) -> int:
        return sum(len(success) + len(fail) for success, fail in self._queues.values())

    def record(self, message: ConsumedMessage, ok: bool) -> None:
        success, fail = self._queues.setdefault((message.topic, message.qid), ([], []))
        (success if ok else fail).append(message.offset)

    def to_wire(self) -> ConsumeResult | None:
        """A fresh ``ConsumeResult`` list, one node per queue (None when nothing is pending)."""
        return link_results(
            ConsumeResult(
                context=Context(groupId=self._group, topic=topic, qid=qid),
                successOffsets=list(success),
                failOffsets=list(fail),
            )
            for (topic, qid), (success, fail) in self._queues.items()
        )

    def clear(self) -> None:
        self._queues.clear()


class _Backoff:
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


def _runs(response: PullResponse, messages: list[ConsumedMessage]) -> list[list[ConsumedMessage]]:
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


def _consumed_messages(response: PullResponse) -> list[ConsumedMessage]:
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


class _PullerSettings:
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
        self.pullers = pullers
        self.batch_size = batch_size
        self.linger_ms = linger_ms
        self.retry_sleep_ms = retry_sleep_ms
        self.max_backoff_ms = max_backoff_ms
        self.timeout_s = timeout_s
        self.max_per_key = max_per_key

    def server_for(self, index: int) -> tuple[str, int]:
        return self.servers[index % len(self.servers)]

    def request(self, pending: _PendingResults) -> PullRequest:
        return PullRequest(
            groupId=self.group,
            topic=self.topic,
            maxBatchSize=self.batch_size,
            maxLingerTime=self.linger_ms,
            result=pending.to_wire(),
            maxPerKey=self.max_per_key if self.max_per_key > 1 else None,
        )

    def returned_early(self, elapsed_s: float) -> bool:
        """An empty pull that came back well before the linger time did not long-poll: pause a little."""
        return self.linger_ms == 0 or elapsed_s * 1000 < self.linger_ms / 2


class PullConsumer:
    """Consume a group with ``threads`` puller threads spread round-robin over ``servers``.

    ``processor(message)`` runs in the puller threads (so it must be thread-safe) and returns True to
    ack, False to fail (an exception counts as False; :class:`NotProcessed` leaves the message
    unreported). ``topic=None`` pulls every topic of the group. :meth:`close` stops pulling, waits for
    the current batches (at most a long-poll of ``linger_ms`` plus processing) and submits their results.

    Lifecycle: :meth:`run` starts, blocks until :meth:`stop` or a fatal error, and closes. Or
    ``with PullConsumer(...) as consumer: consumer.wait()``. A fatal (non-retriable) error stops every
    puller, is kept in :attr:`error`, is passed to ``on_error(error)`` (called once, from a puller
    thread; without it the error is also logged), and is raised by :meth:`wait`, :meth:`run` or the
    ``with`` block's exit.
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        group: str,
        processor: Callable[[ConsumedMessage], bool],
        topic: str | None = None,
        threads: int = 4,
        batch_size: int = 32,
        linger_ms: int = 1000,
        retry_sleep_ms: int = DEFAULT_RETRY_SLEEP_MS,
        max_backoff_ms: int = DEFAULT_MAX_BACKOFF_MS,
        timeout_s: float = 10.0,
        on_error: Callable[[ProxyClientError], None] | None = None,
        max_per_key: int = 1,
    ) -> None:
        self._settings = _PullerSettings(
            servers, group, topic, threads, batch_size, linger_ms, retry_sleep_ms, max_backoff_ms, timeout_s,
            max_per_key,
        )
        self._processor = processor
        self._counters = _Counters()
        self._fatal = _FatalError(on_error)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started = False

    @property
    def stats(self) -> ConsumerStats:
        return self._counters.snapshot()

    @property
    def error(self) -> ProxyClientError | None:
        """The non-retriable error that stopped the consumer, if one did."""
        return self._fatal.error

    @property
    def running(self) -> bool:
        """True from :meth:`start` until every puller has ended (after :meth:`stop` or a fatal error)."""
        return any(thread.is_alive() for thread in self._threads)

    def start(self) -> None:
        if self._started:
            raise RuntimeError("PullConsumer.start() called twice")
        self._started = True
        for index in range(self._settings.pullers):
            host, port = self._settings.server_for(index)
            thread = threading.Thread(
                target=self._run_puller, args=(host, port), name=f"ddmq-puller-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        """Ask the pullers to stop after their current batch; returns at once (safe from a processor)."""
        self._stopping.set()

    def close(self, timeout: float | None = None) -> None:
        """Stop, wait up to ``timeout`` seconds (None: as long as it takes) for the pullers' final submits."""
        self.stop()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread is threading.current_thread():
                raise RuntimeError("PullConsumer.close() called from a processor; use stop()")
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        if alive:
            log.warning("pullers still busy after %s s: %s", timeout, ", ".join(alive))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every puller has ended (after :meth:`stop` or a fatal error): True, or False when
        ``timeout`` seconds passed first. Raises the fatal error that stopped the consumer."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            # Short joins keep Ctrl-C (KeyboardInterrupt) deliverable to the waiting thread.
            while thread.is_alive():
                left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if left <= 0:
                    return False
                thread.join(left)
        self._fatal.raise_once()
        return True

    def run(self) -> None:
        """Start (unless started), block until :meth:`stop` or a fatal error (raised), then close."""
        with self:
            self.wait()

    def __enter__(self) -> PullConsumer:
        if not self._started:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        if exc_type is None:
            self._fatal.raise_once()

    def _run_puller(self, host: str, port: int) -> None:
        settings = self._settings
        pending = _PendingResults(settings.group)
        backoff = _Backoff(settings.retry_sleep_ms, settings.max_backoff_ms)
        with ProxyClient(host, port, settings.timeout_s) as client:
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    response = client.pull(settings.request(pending))
                except ProxyClientError as exc:
                    self._counters.add(errors=1)
                    if not exc.retriable:
                        self._fatal.record(exc, host, port)
                        self.stop()
                        break
                    delay_s = backoff.next_s()
                    log.warning("pull from %s:%d failed: %s; retrying in %.1f s", host, port, exc, delay_s)
                    self._stopping.wait(delay_s)
                    continue
                pending.clear()
                backoff.reset()
                messages = _consumed_messages(response)
                if not messages:
                    if settings.returned_early(time.monotonic() - started):
                        self._stopping.wait(settings.retry_sleep_ms / 1000)
                    continue
                self._counters.add(pulled=len(messages))
                for run in _runs(response, messages):
                    self._process_run(run, pending)
            if pending:
                try:
                    client.submit(pending.to_wire())
                except ProxyClientError as exc:
                    self._counters.add(errors=1)
                    log.warning(
                        "final submit of %d results to %s:%d failed: %s (they will be redelivered)",
                        len(pending),
                        host,
                        port,
                        exc,
                    )

    def _process_run(self, run: list[ConsumedMessage], pending: _PendingResults) -> None:
        """A key's run, in order, up to its first message not acked (the rest is left unreported)."""
        for index, message in enumerate(run):
            ok = self._process(message)
            if ok is not None:
                pending.record(message, ok)
            if not ok:
                self._counters.add(unreported=len(run) - index - 1)
                return

    def _process(self, message: ConsumedMessage) -> bool | None:
        try:
            ok = bool(self._processor(message))
        except NotProcessed:
            self._counters.add(unreported=1)
            return None
        except Exception:
            log.exception("processor failed on %s#%s offset %d", message.topic, message.qid, message.offset)
            ok = False
        self._counters.add(acked=int(ok), failed=int(not ok))
        return ok


class AsyncPullConsumer:
    """The asyncio twin of :class:`PullConsumer`: ``concurrency`` puller tasks, an async processor.

    >>> async with AsyncPullConsumer("127.0.0.1:9713", "rides", handle, concurrency=8) as consumer:
    ...     await consumer.wait()  # until consumer.stop() or a fatal error (raised)

    Fatal errors work as in :class:`PullConsumer` (``on_error`` is called in the event loop).
    """

    def __init__(
        self,
        servers: str | Sequence[str],
        group: str,
        processor: Callable[[ConsumedMessage], Awaitable[bool]],
        topic: str | None = None,
        concurrency: int = 4,
        batch_size: int = 32,
        linger_ms: int = 1000,
        retry_sleep_ms: int = DEFAULT_RETRY_SLEEP_MS,
        max_backoff_ms: int = DEFAULT_MAX_BACKOFF_MS,
        timeout_s: float = 10.0,
        on_error: Callable[[ProxyClientError], None] | None = None,
        max_per_key: int = 1,
    ) -> None:
        self._settings = _PullerSettings(
            servers, group, topic, concurrency, batch_size, linger_ms, retry_sleep_ms, max_backoff_ms, timeout_s,
            max_per_key,
        )
        self._processor = processor
        self._counters = _Counters()
        self._fatal = _FatalError(on_error)
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    @property
    def stats(self) -> ConsumerStats:
        return self._counters.snapshot()

    @property
    def error(self) -> ProxyClientError | None:
        """The non-retriable error that stopped the consumer, if one did."""
        return self._fatal.error

    @property
    def running(self) -> bool:
        """True from :meth:`start` until every puller has ended (after :meth:`stop` or a fatal error)."""
        return any(not task.done() for task in self._tasks)

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("AsyncPullConsumer.start() called twice")
        self._started = True
        for index in range(self._settings.pullers):
            host, port = self._settings.server_for(index)
            self._tasks.append(asyncio.create_task(self._run_puller(host, port), name=f"ddmq-puller-{index}"))

    def stop(self) -> None:
        """Ask the pullers to stop after their current batch; returns at once."""
        self._stopping.set()

    async def close(self, grace_s: float | None = None) -> None:
        """Stop and wait up to ``grace_s`` seconds (None: as long as it takes) for the final submits;
        then cancel the pullers still busy (their unreported messages are redelivered by the proxy)."""
        self.stop()
        if not self._tasks:
            return
        _, busy = await asyncio.wait(self._tasks, timeout=grace_s)
        for task in busy:
            task.cancel()
        if busy:
            log.warning("cancelled %d pullers still busy after %s s", len(busy), grace_s)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait(self) -> None:
        """Wait until every puller has ended (after :meth:`stop` or a fatal error); raises the fatal error
        that stopped the consumer. Bound it with ``asyncio.timeout`` if need be."""
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._fatal.raise_once()

    async def run(self) -> None:
        """Start (unless started), wait until :meth:`stop` or a fatal error (raised), then close."""
        async with self:
            await self.wait()

    async def __aenter__(self) -> AsyncPullConsumer:
        if not self._started:
            await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
        if exc_type is None:
            self._fatal.raise_once()

    async def _pause(self, seconds: float) -> None:
        """Sleep, waking early when the consumer stops."""
        try:
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
        except TimeoutError:
            pass

    async def _run_puller(self, host: str, port: int) -> None:
        settings = self._settings
        pending = _PendingResults(settings.group)
        backoff = _Backoff(settings.retry_sleep_ms, settings.max_backoff_ms)
        async with AsyncProxyClient(host, port, settings.timeout_s) as client:
            while not self._stopping.is_set():
                started = time.monotonic()
                try:
                    response = await client.pull(settings.request(pending))
                except ProxyClientError as exc:
                    self._counters.add(errors=1)
                    if not exc.retriable:
                        self._fatal.record(exc, host, port)
                        self.stop()
                        break
                    delay_s = backoff.next_s()
                    log.warning("pull from %s:%d failed: %s; retrying in %.1f s", host, port, exc, delay_s)
                    await self._pause(delay_s)
                    continue
                pending.clear()
                backoff.reset()
                messages = _consumed_messages(response)
                if not messages:
                    if settings.returned_early(time.monotonic() - started):
                        await self._pause(settings.retry_sleep_ms / 1000)
                    continue
                self._counters.add(pulled=len(messages))
                runs = _runs(response, messages)
                if len(runs) == len(messages):  # one message per key: no task per run needed
                    for message in messages:
                        ok = await self._process(message)
                        if ok is not None:
                            pending.record(message, ok)
                else:
                    await asyncio.gather(*(self._process_run(run, pending) for run in runs))
            if pending:
                try:
                    await client.submit(pending.to_wire())
                except ProxyClientError as exc:
                    self._counters.add(errors=1)
                    log.warning(
                        "final submit of %d results to %s:%d failed: %s (they will be redelivered)",
                        len(pending),
                        host,
                        port,
                        exc,
                    )

    async def _process_run(self, run: list[ConsumedMessage], pending: _PendingResults) -> None:
        """A key's run, in order, up to its first message not acked (the rest is left unreported)."""
        for index, message in enumerate(run):
            ok = await self._process(message)
            if ok is not None:
                pending.record(message, ok)
            if not ok:
                self._counters.add(unreported=len(run) - index - 1)
                return

    async def _process(self, message: ConsumedMessage) -> bool | None:
        try:
            ok = bool(await self._processor(message))
        except NotProcessed:
            self._counters.add(unreported=1)
            return None
        except Exception:
            log.exception("processor failed on %s#%s offset %d", message.topic, message.qid, message.offset)
            ok = False
        self._counters.add(acked=int(ok), failed=int(not ok))
        return ok


# -- ddmq consume ---------------------------------------------------------------------------------


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``ddmq consume``: print messages as JSON lines and ack them."""
    parser = sub.add_parser(
        "consume",
        help="pull messages from proxies and print them as JSON lines",
        description=(
            "Pull a consumer group's messages from one or more proxies, print each as a JSON line "
            "(value as text, or base64 under value_b64 when it is not UTF-8) and ack it. Messages pulled "
            "but not printed (beyond --count, or after the reader of a pipe went away) are never acked nor "
            "failed: the proxy delivers them again after the group's timeout_ms. "
            "An error that retrying cannot cure (unknown group or topic, an HTTP port) ends the command "
            "with status 1; a closed pipe ends it with status 1 too, quietly."
        ),
    )
    clitools.env_option(
        parser, "--servers", clitools.ENV_SERVERS, "proxy address(es): host:port[,host:port...]", "--server"
    )
    parser.add_argument("--group", required=True, help="consumer group")
    parser.add_argument("--topic", default=None, help="only this topic (default: every topic of the group)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many messages")
    parser.add_argument("--threads", type=int, default=1, help="puller threads (default 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="max messages per pull (default 32)")
    parser.add_argument("--linger-ms", type=int, default=1000, help="long-poll wait per pull (default 1000)")
    parser.add_argument(
        "--max-per-key",
        type=int,
        default=1,
        help="ordered runs: up to this many successive messages of one key per pull, printed in order (default 1)",
    )
    parser.set_defaults(func=_consume_command)


def message_json(message: ConsumedMessage) -> str:
    """One output line of ``ddmq consume``."""
    record: dict[str, Any] = {
        "topic": message.topic,
        "qid": message.qid,
        "offset": message.offset,
        "key": message.key,
        "tag": message.tag,
        "properties": message.properties,
    }
    try:
        record["value"] = message.value.decode("utf-8")
    except UnicodeDecodeError:
        record["value_b64"] = base64.b64encode(message.value).decode("ascii")
    return json.dumps(record, ensure_ascii=False)


class _Printer:
    """The CLI's processor: prints and acks up to ``limit`` messages, then stops the consumer. A message
    it does not print (past the limit, or stdout closed) raises :class:`NotProcessed`: never failed."""

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._lock = threading.RLock()  # close_pipe() runs under it from __call__, or alone from the CLI
        self.printed = 0
        self.pipe_closed = False
        self.on_done: Callable[[], None] = lambda: None

    def __call__(self, message: ConsumedMessage) -> bool:
        with self._lock:
            if self.pipe_closed or (self._limit is not None and self.printed >= self._limit):
                raise NotProcessed
            try:
                sys.stdout.write(message_json(message) + "\n")
                sys.stdout.flush()
            except BrokenPipeError:
                self.close_pipe()
                raise NotProcessed from None
            self.printed += 1
            if self._limit is not None and self.printed >= self._limit:
                self.on_done()
            return True

    def close_pipe(self) -> None:
        with self._lock:
            if self.pipe_closed:
                return
            self.pipe_closed = True
            clitools.detach_stdout()
        self.on_done()


def _consume_command(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise clitools.CliError("--count must be positive", clitools.USAGE_ERROR)
    batch_size = args.batch_size if args.count is None else min(args.batch_size, args.count)
    printer = _Printer(args.count)
    try:
        consumer = PullConsumer(
            args.servers,
            args.group,
            printer,
            topic=args.topic,
            threads=args.threads,
            batch_size=batch_size,
            linger_ms=args.linger_ms,
            on_error=lambda exc: None,  # the command reports it once, raised from wait() below
            max_per_key=args.max_per_key,
        )
    except ValueError as exc:
        raise clitools.CliError(str(exc), clitools.USAGE_ERROR) from exc
    printer.on_done = consumer.stop
    try:
        with consumer:
            while not consumer.wait(0.2):
                if clitools.stdout_closed():
                    printer.close_pipe()
    except ProxyClientError as exc:
        raise clitools.CliError(str(exc)) from exc
    stats = consumer.stats
    log.info("consumed %d messages (%d pulled, %d errors)", printer.printed, stats.pulled, stats.errors)
    return clitools.FAILURE if printer.pipe_closed else 0
