"""What a processor's answer means to the proxy: ack, fail (with a reason and maybe a delay), or give back.

A processor returns True (ack) or False (fail), or raises: :class:`Retry` fails the message and asks for
it again after a delay of its choosing, :class:`~ddmq.client.pull_parts.NotProcessed` gives it back
unprocessed (released: no attempt counted), any other exception fails it with the exception's text as
the reason the proxy stores and shows (dead letters, stuck keys, the console). :func:`outcome_of`
turns a call of the processor into one :class:`Outcome`; both consumers use it.

>>> def process(message):
...     if rate_limited():
...         raise Retry(30_000, "the payment API asked us to slow down")
...     return True
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final

from ddmq.client import tracing
from ddmq.client.pull_parts import ConsumedMessage, Counters, NotProcessed, PendingResults

__all__ = [
    "ACK",
    "FAIL",
    "MAX_REASON_BYTES",
    "RELEASE",
    "Outcome",
    "Retry",
    "Verdict",
    "count_outcome",
    "handled",
    "outcome_of",
    "outcome_of_exception",
    "reason_text",
    "release_unhandled",
    "report",
]

log = logging.getLogger("ddmq.client.consumer")

#: The proxy keeps at most this much of a reason; the client cuts it first so a huge message never
#: travels (cut on a character boundary, so the text stays valid UTF-8).
MAX_REASON_BYTES: Final = 1024


class Retry(Exception):
    """Raised by a processor to fail a message and have it delivered again after ``after_ms``
    milliseconds instead of the group's ``retry_intervals_ms`` (the proxy caps the delay at its
    configured maximum; None keeps the group's interval). It is still an attempt: past ``max_retry`` the
    group's ``on_exhausted`` policy applies. ``reason`` (default: "retry requested") is stored with the
    message as an exception's text would be.

    >>> raise Retry(30_000, "downstream busy")
    """

    def __init__(self, after_ms: int | None = None, reason: str | None = None) -> None:
        if after_ms is not None and after_ms < 0:
            raise ValueError(f"Retry(after_ms) must not be negative, got {after_ms}")
        self.reason = reason or "retry requested"
        super().__init__(self.reason)
        self.after_ms = None if after_ms is None else int(after_ms)


class Verdict(Enum):
    ACK = "ack"
    FAIL = "fail"
    RELEASE = "release"


@dataclass(frozen=True)
class Outcome:
    """A processor's answer for one message."""

    verdict: Verdict
    reason: str | None = None
    retry_after_ms: int | None = None

    @property
    def acked(self) -> bool:
        return self.verdict is Verdict.ACK


ACK: Final = Outcome(Verdict.ACK)
RELEASE: Final = Outcome(Verdict.RELEASE)
FAIL: Final = Outcome(Verdict.FAIL)


def reason_text(text: str) -> str:
    """``text`` cut to :data:`MAX_REASON_BYTES` of UTF-8 (ending in "…" when cut)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_REASON_BYTES:
        return text
    ellipsis = "…".encode()
    return data[: MAX_REASON_BYTES - len(ellipsis)].decode("utf-8", "ignore") + "…"


def _exception_reason(exc: BaseException) -> str:
    text = str(exc)
    return reason_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def outcome_of(call: Callable[[], object], message: ConsumedMessage) -> Outcome:
    """Run a synchronous processor call and read its answer."""
    try:
        return ACK if call() else FAIL
    except Exception as exc:
        return outcome_of_exception(exc, message)


def handled(call: Callable[[], object], message: ConsumedMessage, group: str) -> Outcome:
    """:func:`outcome_of`, in the message's span where tracing is active (:mod:`ddmq.client.tracing`)."""
    if not (tracing.ACTIVE and tracing.recording()):
        return outcome_of(call, message)
    with tracing.processing(group, message) as span:
        outcome = outcome_of(call, message)
        span.finish(outcome.verdict.value, outcome.reason)
        return outcome


def outcome_of_exception(exc: Exception, message: ConsumedMessage) -> Outcome:
    """The answer an exception from a processor gives (Ctrl-C, ``SystemExit`` and task cancellation
    are no ``Exception``: they are not the message's fault, and stop the consumer instead)."""
    if tracing.ACTIVE:
        tracing.record_exception(exc)
    if isinstance(exc, NotProcessed):
        return RELEASE
    if isinstance(exc, Retry):
        return Outcome(Verdict.FAIL, reason_text(exc.reason), exc.after_ms)
    log.error("processor failed on %s#%s offset %d", message.topic, message.qid, message.offset, exc_info=exc)
    return Outcome(Verdict.FAIL, _exception_reason(exc))


def report(pending: PendingResults, message: ConsumedMessage, outcome: Outcome) -> None:
    """Put one answer where the next pull (or the final submit) carries it to the proxy."""
    if outcome.verdict is Verdict.RELEASE:
        pending.release(message)
    else:
        pending.record(message, outcome.acked, reason=outcome.reason, retry_after_ms=outcome.retry_after_ms)


def release_unhandled(messages: list[ConsumedMessage], pending: PendingResults, counters: Counters) -> None:
    """Give back messages pulled but not handled: the proxy delivers them again first in their keys,
    without counting an attempt."""
    for message in messages:
        pending.release(message)
    counters.add(released=len(messages))


def count_outcome(outcome: Outcome, counters: Counters) -> None:
    if outcome.verdict is Verdict.RELEASE:
        counters.add(released=1)
    else:
        counters.add(acked=int(outcome.acked), failed=int(not outcome.acked))
