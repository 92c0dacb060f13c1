"""Pull consumers: a pool of pullers that long-poll the proxies and report results on their next pull.

Like DDMQ's Carrera consumer pool, each puller (a thread in :class:`PullConsumer`, a task in
:class:`AsyncPullConsumer`) owns one connection to one proxy, and every server gets the same number of
pullers, at least one: ``threads`` (``concurrency``) is the total, rounded up to a multiple of the number
of servers, so ``threads=1`` over three proxies runs three pullers. A proxy only hands out the queues
it owns, so a server without a puller would leave its share of the group unread. A puller loops: pull
(carrying the results of its previous batch), hand the messages to the processor in order, remember
which offsets succeeded and which failed, pull again. When it stops, it sends what
it still holds with a final ``submit``. Results always go back to the proxy that handed the messages
out, so a puller never switches servers; after a connection error it reconnects with backoff (doubling,
with jitter so that many clients do not retry in step) and keeps its results for the next successful call.
The pullers of a proxy that is down wait and retry on their own while the others go on: once that
proxy's queue leases expire, the surviving proxies take its queues over and their pullers deliver them.

Errors that retrying cannot cure (:attr:`ProxyClientError.retriable` is False: an unknown group or
topic, a server that speaks HTTP) stop the whole consumer: :attr:`PullConsumer.error` holds the first
one, ``on_error`` is called with it, and :meth:`~PullConsumer.wait`, :meth:`~PullConsumer.run` and the
end of a ``with`` block raise it.

>>> def process(message: ConsumedMessage) -> bool:
...     print(message.topic, message.qid, message.offset, message.value)
...     return True  # False (or an exception, its text the reason) fails the message: it is retried later
>>> consumer = PullConsumer("proxy-1:9713,proxy-2:9713", "rides", process, threads=4)
>>> consumer.run()  # until consumer.stop() (from a processor, another thread) or Ctrl-C; raises a fatal error

With ``max_per_key=N`` (N > 1) a pull may carry *ordered runs*: up to N successive messages of one order
key (with QID order, of one queue). The consumer processes a run in order and stops it at its first
failure: the processed prefix is acked, the failed message failed, and the rest of the run is left
unreported; the proxy delivers it again, in order, once the failed message is finished. Different runs
are different keys: :class:`AsyncPullConsumer` processes the runs of one pull concurrently,
:class:`PullConsumer` one after another in the puller thread (other pullers serve other keys).

Both consumers drive one puller logic, :mod:`ddmq.client.puller` (each adds only its threads or tasks
and its calls); the parts it is built from live in :mod:`ddmq.client.pull_parts`, what a processor's answer
means in :mod:`ddmq.client.handling`, the extensions of held messages in :mod:`ddmq.client.keepalive`;
:class:`AsyncPullConsumer` is in :mod:`ddmq.client.async_consumer`; ``ddmq consume`` is
:mod:`ddmq.client.cli.consume`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from types import TracebackType

from ddmq.client.async_consumer import AsyncPullConsumer
from ddmq.client.handling import Retry, handled
from ddmq.client.keepalive import DEFAULT_GROUP_TIMEOUT_MS
from ddmq.client.pull_parts import (
    DEFAULT_MAX_BACKOFF_MS,
    DEFAULT_RETRY_SLEEP_MS,
    ConsumedMessage,
    ConsumerStats,
    NotProcessed,
    PullerSettings,
    parse_servers,
    split_runs,
)
from ddmq.client.puller import PullConsumerBase, Puller
from ddmq.client.thrift_client import ProxyClient, ProxyClientError

__all__ = [
    "AsyncPullConsumer",
    "ConsumedMessage",
    "ConsumerStats",
    "NotProcessed",
    "PullConsumer",
    "Retry",
    "parse_servers",
]

log = logging.getLogger(__name__)


class PullConsumer(PullConsumerBase):
    """Consume a group with puller threads over ``servers``: ``threads`` in all, rounded up so that every
    server has the same number and at least one (``threads=1`` with three servers runs three threads).

    ``processor(message)`` runs in the puller threads (so it must be thread-safe) and returns True to
    ack, False to fail. An exception fails the message with its text as the reason the proxy keeps
    (``"ValueError: bad amount"``, at most 1 KiB); :class:`Retry` fails it and asks for the next
    delivery after ``after_ms``; :class:`NotProcessed` gives it back unprocessed (released: no attempt
    counted). ``topic=None`` pulls every topic of the group. :meth:`close` stops pulling, waits for the
    message being processed (at most a long-poll of ``linger_ms`` plus processing), releases the rest of
    the batches and submits their results; so do :meth:`stop`, the end of :meth:`run`, Ctrl-C in
    :meth:`wait` and a fatal error.

    ``group_timeout_ms`` is the group's ``timeout_ms`` (the proxy's default unless told): a batch held
    for half of it is extended ("still working on it") every half of it, so a slow handler is not
    redelivered while it runs, up to the proxy's maximum of extensions per delivery. None never extends.

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
        group_timeout_ms: int | None = DEFAULT_GROUP_TIMEOUT_MS,
    ) -> None:
        settings = PullerSettings(
            servers, group, topic, threads, batch_size, linger_ms, retry_sleep_ms, max_backoff_ms, timeout_s,
            max_per_key,
        )
        super().__init__(settings, on_error, group_timeout_ms)
        self._processor = processor
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        # One per puller, set when it has ended. Liveness is read from these, not Thread.is_alive():
        # on Python < 3.13 a join() interrupted by Ctrl-C can mark a live thread as stopped, and the
        # process would then exit before the pullers release their messages.
        self._ended: list[threading.Event] = []
        self._held: list[tuple[ProxyClient, Puller, threading.Lock]] = []
        self._held_lock = threading.Lock()
        self._keeper: threading.Thread | None = None
        self._pullers_done = threading.Event()

    @property
    def answered(self) -> int:
        """Pulls a proxy has answered so far (none: no proxy reached yet)."""
        return self._counters.answered

    @property
    def running(self) -> bool:
        """True from :meth:`start` until every puller has ended (after :meth:`stop` or a fatal error)."""
        return not all(ended.is_set() for ended in self._ended)

    def start(self) -> None:
        self._start_once()
        for index in range(self._settings.pullers):
            host, port = self._settings.server_for(index)
            ended = threading.Event()
            thread = threading.Thread(
                target=self._puller, args=(host, port, ended), name=f"ddmq-puller-{index}", daemon=True
            )
            self._ended.append(ended)
            self._threads.append(thread)
            thread.start()
        if self._extend_every_s is not None:
            self._keeper = threading.Thread(target=self._keep_alive, name="ddmq-keeper", daemon=True)
            self._keeper.start()

    def stop(self) -> None:
        """Ask the pullers to stop after their current batch; returns at once (safe from a processor)."""
        self._stopping.set()

    def close(self, timeout: float | None = None) -> None:
        """Stop, wait up to ``timeout`` seconds (None: as long as it takes) for the pullers' final submits."""
        self.stop()
        deadline = None if timeout is None else time.monotonic() + timeout
        if threading.current_thread() in self._threads:
            raise RuntimeError("PullConsumer.close() called from a processor; use stop()")
        for ended in self._ended:
            # Short waits keep a second Ctrl-C deliverable; an interrupted wait leaves no false state.
            while not ended.wait(0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))):
                if deadline is not None and time.monotonic() >= deadline:
                    break
        alive = [thread.name for thread, ended in zip(self._threads, self._ended, strict=True) if not ended.is_set()]
        if alive:
            log.warning("pullers still busy after %s s: %s", timeout, ", ".join(alive))
        elif self._keeper is not None:
            self._pullers_done.set()
            self._keeper.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every puller has ended (after :meth:`stop` or a fatal error): True, or False when
        ``timeout`` seconds passed first. Raises the fatal error that stopped the consumer."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for ended in self._ended:
            # Short waits keep Ctrl-C (KeyboardInterrupt) deliverable to the waiting thread.
            while not ended.is_set():
                left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if left <= 0:
                    return False
                ended.wait(left)
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

    def _puller(self, host: str, port: int, ended: threading.Event) -> None:
        try:
            self._run_puller(host, port)
        finally:
            ended.set()

    def _run_puller(self, host: str, port: int) -> None:
        puller, held_lock = self._new_puller(host, port), threading.Lock()
        with ProxyClient(host, port, self._settings.timeout_s) as client:
            with self._held_lock:
                self._held.append((client, puller, held_lock))
            while not self._stopping.is_set():
                started = time.monotonic()
                with held_lock:
                    puller.held.let_go()  # this pull carries their results: nothing left to extend
                try:
                    response = client.pull(puller.request())
                except ProxyClientError as exc:
                    delay_s = puller.failed(exc)
                    if delay_s is None:
                        self.stop()
                        break
                    self._stopping.wait(delay_s)
                    continue
                messages, pause_s = puller.answered(response, started)
                if not messages:
                    self._stopping.wait(pause_s)
                    continue
                with held_lock:
                    puller.held.hold(messages, time.monotonic())
                for run in split_runs(response, messages):
                    self._process_run(run, puller)
            with held_lock:
                final = puller.final()
            if final is not None:
                try:
                    client.submit(final)
                except ProxyClientError as exc:
                    puller.final_failed(exc)

    def _process_run(self, run: list[ConsumedMessage], puller: Puller) -> None:
        """A key's run, in order, up to its first message not acked (the rest is left unreported). Once
        the consumer is stopping, what is not handled yet is released: given back without an attempt."""
        for index, message in enumerate(run):
            if self._stopping.is_set():
                puller.release(run[index:])
                return
            outcome = handled(partial(self._processor, message), message, self._settings.group)
            if not puller.settle(run, index, outcome):
                return

    def _keep_alive(self) -> None:
        """The keeper thread: extends the batches pullers hold too long (see :mod:`ddmq.client.keepalive`)."""
        every_s = self._extend_every_s
        assert every_s is not None
        # Until close() has seen every puller end (or, without close(), until they have all ended).
        while not self._pullers_done.wait(every_s / 4) and not (self._stopping.is_set() and not self.running):
            with self._held_lock:
                pullers = list(self._held)
            for client, puller, held_lock in pullers:
                with held_lock:
                    extension = puller.extension(every_s)
                    if extension is None:
                        continue
                    try:
                        client.submit(extension)
                    except ProxyClientError as exc:
                        puller.extended(exc)
                    else:
                        puller.extended(None)
