"""What a puller decides, apart from how it waits: one home for the logic of both pull consumers.

:class:`~ddmq.client.consumer.PullConsumer` runs each puller in a thread (blocking calls, a processor
called in that thread), :class:`~ddmq.client.async_consumer.AsyncPullConsumer` in a task (awaited
calls, an async processor). Everything else is the same and lives here, in :class:`Puller` (one per
puller): the request a pull sends, what a failed pull means (back off, or stop the consumer on an
error retrying cannot cure), what an answer means (its messages, or a pause after an early empty
reply), how a processed message is counted and reported, the extensions of held messages and the
final submit. :class:`PullConsumerBase` holds what every puller of one consumer shares.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from ddmq.client.handling import Outcome, count_outcome, release_unhandled, report
from ddmq.client.keepalive import Held, extend_every_s
from ddmq.client.pull_parts import (
    Backoff,
    ConsumedMessage,
    ConsumerStats,
    Counters,
    FatalError,
    PendingResults,
    PullerSettings,
    consumed_messages,
)
from ddmq.client.thrift_client import ProxyClientError, ProxyConnectionError
from ddmq.protocol.wire import ConsumeResult, PullRequest, PullResponse

__all__ = ["PullConsumerBase", "Puller"]

log = logging.getLogger("ddmq.client.consumer")


class PullConsumerBase:
    """The state both consumers share across their pullers: settings (checked once), counters, the
    fatal error, and how often held messages are extended (None: never)."""

    def __init__(
        self,
        settings: PullerSettings,
        on_error: Callable[[ProxyClientError], None] | None,
        group_timeout_ms: int | None,
    ) -> None:
        self._settings = settings
        self._counters = Counters()
        self._fatal = FatalError(on_error)
        self._extend_every_s = extend_every_s(group_timeout_ms)
        self._started = False

    @property
    def stats(self) -> ConsumerStats:
        return self._counters.snapshot()

    @property
    def error(self) -> ProxyClientError | None:
        """The non-retriable error that stopped the consumer, if one did."""
        return self._fatal.error

    def _start_once(self) -> None:
        if self._started:
            raise RuntimeError(f"{type(self).__name__}.start() called twice")
        self._started = True

    def _new_puller(self, host: str, port: int) -> Puller:
        return Puller(self._settings, self._counters, self._fatal, host, port)


class Puller:
    """One puller's results not reported yet, its backoff, the messages it holds, and the meaning of
    each step; its thread or task makes the calls and holds ``held`` under its own lock."""

    def __init__(self, settings: PullerSettings, counters: Counters, fatal: FatalError, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._settings, self._counters, self._fatal = settings, counters, fatal
        self.pending = PendingResults(settings.group)
        self.held = Held(settings.group)
        self._backoff = Backoff(settings.retry_sleep_ms, settings.max_backoff_ms)
        #: The pull last sent, and whether it is a retry already (see :meth:`failed`).
        self._sent: PullRequest | None = None
        self._retry: PullRequest | None = None

    def request(self) -> PullRequest:
        """The next pull, carrying the results not reported yet, under a fresh request id; or the pull
        whose reply was lost, again with its id, so the proxy answers its messages again at once."""
        retry, self._retry = self._retry, None
        if retry is not None:
            self._sent = None  # retried once only: a second loss starts a new pull
            return retry
        self._sent = self._settings.request(self.pending, uuid.uuid4().hex)
        return self._sent

    def failed(self, exc: ProxyClientError) -> float | None:
        """A pull failed: the seconds to wait before the next one, or None when the consumer stops
        (an error retrying cannot cure, recorded as the consumer's fatal error). A pull whose reply
        was lost (the connection failed) is retried at once, once, under the same request id."""
        self._counters.add(errors=1)
        if not exc.retriable:
            self._fatal.record(exc, self.host, self.port)
            return None
        if isinstance(exc, ProxyConnectionError) and exc.sent and self._sent is not None:
            self._retry, self._sent = self._sent, None
            log.info("pull from %s:%d failed: %s; retrying it at once", self.host, self.port, exc)
            return 0.0
        delay_s = self._backoff.next_s()
        log.warning("pull from %s:%d failed: %s; retrying in %.1f s", self.host, self.port, exc, delay_s)
        return delay_s

    def answered(self, response: PullResponse, started: float) -> tuple[list[ConsumedMessage], float]:
        """A pull sent at ``started`` was answered (its results reached the proxy): its messages and,
        when there are none and the answer came back early (no long poll), the seconds to pause."""
        self.pending.clear()
        self._sent = self._retry = None
        self._backoff.reset()
        self._counters.add(answered=1)
        messages = consumed_messages(response)
        if messages:
            self._counters.add(pulled=len(messages))
            return messages, 0.0
        early = self._settings.returned_early(time.monotonic() - started)
        return messages, self._settings.retry_sleep_ms / 1000 if early else 0.0

    def settle(self, run: list[ConsumedMessage], index: int, outcome: Outcome) -> bool:
        """Count and report the answer for ``run[index]``; whether the run goes on (not after a message
        that was not acked: the rest of its run is left unreported, delivered again in order)."""
        count_outcome(outcome, self._counters)
        report(self.pending, run[index], outcome)
        if outcome.acked:
            return True
        self._counters.add(unreported=len(run) - index - 1)
        return False

    def release(self, messages: list[ConsumedMessage]) -> None:
        """Give back messages pulled but not handled (the consumer stops)."""
        release_unhandled(messages, self.pending, self._counters)

    def final(self) -> ConsumeResult | None:
        """What the final submit carries (None: nothing); the held messages are let go."""
        self.held.let_go()
        return self.pending.to_wire() if self.pending else None

    def final_failed(self, exc: BaseException) -> None:
        self._counters.add(errors=1)
        log.warning("final submit of %d results to %s:%d failed: %s (they will be redelivered)",
                    len(self.pending), self.host, self.port, exc)

    def extension(self, every_s: float) -> ConsumeResult | None:
        """The extension of the messages held for ``every_s`` or more, if any are (call with ``held``'s lock)."""
        return self.held.extension(time.monotonic(), every_s)

    def extended(self, exc: ProxyClientError | None) -> None:
        """The extension was sent (``exc`` None) or failed (the next round tries again)."""
        if exc is None:
            self._counters.add(extended=len(self.held))
        else:
            log.warning("extending %d held messages on %s:%d failed: %s", len(self.held), self.host, self.port, exc)
