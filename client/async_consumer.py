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

from ddmq.client import tracing
from ddmq.client.handling import ACK, FAIL, Outcome, outcome_of_exception
from ddmq.client.keepalive import DEFAULT_GROUP_TIMEOUT_MS
from ddmq.client.pull_parts import (
    DEFAULT_MAX_BACKOFF_MS,
    DEFAULT_RETRY_SLEEP_MS,
    ConsumedMessage,
    PullerSettings,
    split_runs,
)
from ddmq.client.puller import PullConsumerBase, Puller
from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError

__all__ = ["AsyncPullConsumer"]

log = logging.getLogger("ddmq.client.consumer")


class AsyncPullConsumer(PullConsumerBase):
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
        settings = PullerSettings(
            servers, group, topic, concurrency, batch_size, linger_ms, retry_sleep_ms, max_backoff_ms, timeout_s,
            max_per_key,
        )
        super().__init__(settings, on_error, group_timeout_ms)
        self._processor = processor
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._held: list[tuple[AsyncProxyClient, Puller, asyncio.Lock]] = []
        self._keeper: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        """True from :meth:`start` until every puller has ended (after :meth:`stop` or a fatal error)."""
        return any(not task.done() for task in self._tasks)

    async def start(self) -> None:
        self._start_once()
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
        if seconds <= 0:
            return
        try:
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
        except TimeoutError:
            pass

    async def _run_puller(self, host: str, port: int) -> None:
        puller, held_lock = self._new_puller(host, port), asyncio.Lock()
        batch: list[ConsumedMessage] = []
        done: set[int] = set()  # ids of the batch's messages already answered
        async with AsyncProxyClient(host, port, self._settings.timeout_s) as client:
            self._held.append((client, puller, held_lock))
            try:
                while not self._stopping.is_set():
                    started = time.monotonic()
                    async with held_lock:
                        puller.held.let_go()  # this pull carries their results: nothing left to extend
                    batch, done = [], set()
                    try:
                        response = await client.pull(puller.request())
                    except ProxyClientError as exc:
                        delay_s = puller.failed(exc)
                        if delay_s is None:
                            self.stop()
                            break
                        await self._pause(delay_s)
                        continue
                    batch, pause_s = puller.answered(response, started)
                    if not batch:
                        await self._pause(pause_s)
                        continue
                    async with held_lock:
                        puller.held.hold(batch, time.monotonic())
                    await self._process_batch(split_runs(response, batch), puller, done)
                    # What stopping left unhandled is given back; the rest of a run that failed is not.
                    puller.release([m for m in batch if id(m) not in done and self._stopping.is_set()])
            except asyncio.CancelledError:
                # close() ran out of patience: give back what was not handled, report what was, and go.
                puller.release([m for m in batch if id(m) not in done])
                await asyncio.shield(self._final_submit(client, puller, held_lock, 1.0))
                raise
            await self._final_submit(client, puller, held_lock, None)

    async def _final_submit(
        self, client: AsyncProxyClient, puller: Puller, held_lock: asyncio.Lock, timeout_s: float | None
    ) -> None:
        async with held_lock:
            final = puller.final()
        if final is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await client.submit(final)
        except (ProxyClientError, TimeoutError) as exc:
            puller.final_failed(exc)

    async def _process_batch(self, runs: list[list[ConsumedMessage]], puller: Puller, done: set[int]) -> None:
        """The batch's runs: one after another when each is one message (no task per run needed), else
        concurrently (different runs are different keys)."""
        if all(len(run) == 1 for run in runs):
            for run in runs:
                if self._stopping.is_set():
                    break
                await self._process_run(run, puller, done)
        else:
            await asyncio.gather(*(self._process_run(run, puller, done) for run in runs))

    async def _process_run(self, run: list[ConsumedMessage], puller: Puller, done: set[int]) -> None:
        """A key's run, in order, up to its first message not acked (the rest is left unreported)."""
        for index, message in enumerate(run):
            if self._stopping.is_set():
                return  # the puller releases what is left
            outcome = await self._process(message)
            done.add(id(message))
            if not puller.settle(run, index, outcome):
                done.update(id(rest) for rest in run[index + 1:])
                return

    async def _process(self, message: ConsumedMessage) -> Outcome:
        if not (tracing.ACTIVE and tracing.recording()):
            return await self._outcome(message)
        with tracing.processing(self._settings.group, message) as span:
            outcome = await self._outcome(message)
            span.finish(outcome.verdict.value, outcome.reason)
            return outcome

    async def _outcome(self, message: ConsumedMessage) -> Outcome:
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
            for client, puller, held_lock in list(self._held):
                async with held_lock:
                    extension = puller.extension(every_s)
                    if extension is None:
                        continue
                    try:
                        await client.submit(extension)
                    except ProxyClientError as exc:
                        puller.extended(exc)
                    else:
                        puller.extended(None)
