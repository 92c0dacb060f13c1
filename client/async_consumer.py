"""The asyncio pull consumer: :class:`AsyncPullConsumer`, the twin of
:class:`~ddmq.client.consumer.PullConsumer` with puller tasks and an async processor.

Import it from :mod:`ddmq.client` or :mod:`ddmq.client.consumer`, whose docstring describes both.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType

from ddmq.client.handling import (
    ACK,
    FAIL,
    Outcome,
    count_outcome,
    outcome_of_exception,
    release_unhandled,
    report,
)
from ddmq.client.keepalive import DEFAULT_GROUP_TIMEOUT_MS, Held, extend_every_s
from ddmq.client.pulling import (
    DEFAULT_MAX_BACKOFF_MS,
    DEFAULT_RETRY_SLEEP_MS,
    Backoff,
    ConsumedMessage,
    ConsumerStats,
    Counters,
    FatalError,
    PendingResults,
    PullerSettings,
    consumed_messages,
    split_runs,
)
from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError

__all__ = ["AsyncPullConsumer"]

log = logging.getLogger("ddmq.client.consumer")


class AsyncPullConsumer:
    """The asyncio twin of :class:`PullConsumer`: ``concurrency`` puller tasks (rounded up to the same
    number per server, at least one each, like ``threads``), an async processor.

    >>> async with AsyncPullConsumer("127.0.0.1:9713", "rides", handle, concurrency=8) as consumer:
    ...     await consumer.wait()  # until consumer.stop() or a fatal error (raised)

    Fatal errors, answers (:class:`Retry`, reasons, :class:`NotProcessed`), releases when stopping and
    ``group_timeout_ms`` work as in :class:`PullConsumer` (``on_error`` is called in the event loop). A
    puller that :meth:`close` cancels after ``grace_s`` still releases its unhandled messages.
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
        group_timeout_ms: int | None = DEFAULT_GROUP_TIMEOUT_MS,
    ) -> None:
        self._settings = PullerSettings(
            servers, group, topic, concurrency, batch_size, linger_ms, retry_sleep_ms, max_backoff_ms, timeout_s,
            max_per_key,
        )
        self._processor = processor
        self._counters = Counters()
        self._fatal = FatalError(on_error)
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._extend_every_s = extend_every_s(group_timeout_ms)
        self._held: list[tuple[AsyncProxyClient, Held, asyncio.Lock]] = []
        self._keeper: asyncio.Task[None] | None = None

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
        if self._extend_every_s is not None:
            self._keeper = asyncio.create_task(self._keep_alive(), name="ddmq-keeper")

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
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)

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
        pending = PendingResults(settings.group)
        backoff = Backoff(settings.retry_sleep_ms, settings.max_backoff_ms)
        held, held_lock = Held(settings.group), asyncio.Lock()
        batch: list[ConsumedMessage] = []
        done: set[int] = set()  # ids of the batch's messages already answered
        async with AsyncProxyClient(host, port, settings.timeout_s) as client:
            self._held.append((client, held, held_lock))
            try:
                while not self._stopping.is_set():
                    started = time.monotonic()
                    async with held_lock:
                        held.let_go()  # this pull carries their results: nothing left to extend
                    batch, done = [], set()
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
                    self._counters.add(answered=1)
                    batch = consumed_messages(response)
                    if not batch:
                        if settings.returned_early(time.monotonic() - started):
                            await self._pause(settings.retry_sleep_ms / 1000)
                        continue
                    self._counters.add(pulled=len(batch))
                    async with held_lock:
                        held.hold(batch, time.monotonic())
                    runs = split_runs(response, batch)
                    if len(runs) == len(batch):  # one message per key: no task per run needed
                        for message in batch:
                            if self._stopping.is_set():
                                break
                            await self._process_run([message], pending, done)
                    else:
                        await asyncio.gather(*(self._process_run(run, pending, done) for run in runs))
                    # What stopping left unhandled is given back; the rest of a run that failed is not.
                    release_unhandled([m for m in batch if id(m) not in done and self._stopping.is_set()], pending,
                             self._counters)
            except asyncio.CancelledError:
                # close() ran out of patience: give back what was not handled, report what was, and go.
                release_unhandled([m for m in batch if id(m) not in done], pending, self._counters)
                await asyncio.shield(self._final_submit(client, held, held_lock, pending, 1.0))
                raise
            await self._final_submit(client, held, held_lock, pending, None)

    async def _final_submit(self, client: AsyncProxyClient, held: Held, held_lock: asyncio.Lock,
                            pending: PendingResults, timeout_s: float | None) -> None:
        async with held_lock:
            held.let_go()
        if not pending:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await client.submit(pending.to_wire())
        except (ProxyClientError, TimeoutError) as exc:
            self._counters.add(errors=1)
            log.warning("final submit of %d results to %s:%d failed: %s (they will be redelivered)",
                        len(pending), client.host, client.port, exc)

    async def _process_run(self, run: list[ConsumedMessage], pending: PendingResults, done: set[int]) -> None:
        """A key's run, in order, up to its first message not acked (the rest is left unreported)."""
        for index, message in enumerate(run):
            if self._stopping.is_set():
                return  # the puller releases what is left
            outcome = await self._process(message)
            done.add(id(message))
            count_outcome(outcome, self._counters)
            report(pending, message, outcome)
            if not outcome.acked:
                done.update(id(rest) for rest in run[index + 1:])
                self._counters.add(unreported=len(run) - index - 1)
                return

    async def _process(self, message: ConsumedMessage) -> Outcome:
        try:
            return ACK if await self._processor(message) else FAIL
        except Exception as exc:
            return outcome_of_exception(exc, message)

    async def _keep_alive(self) -> None:
        """The keeper task: extends the batches pullers hold too long (see :mod:`ddmq.client.keepalive`)."""
        every_s = self._extend_every_s
        assert every_s is not None
        while True:
            await asyncio.sleep(every_s / 4)
            for client, held, held_lock in list(self._held):
                async with held_lock:
                    extension = held.extension(time.monotonic(), every_s)
                    if extension is None:
                        continue
                    try:
                        await client.submit(extension)
                    except ProxyClientError as exc:
                        log.warning("extending %d held messages on %s:%d failed: %s",
                                    len(held), client.host, client.port, exc)
                        continue
                self._counters.add(extended=len(held))
