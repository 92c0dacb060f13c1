"""A span per message a consumer handles, in the producer's trace, with OpenTelemetry where installed.

Active where ``opentelemetry-api`` is installed and ``DDMQ_TRACING`` is not ``off``, as on the producer's
side (:mod:`ddmq.protocol.produce.tracing`, whose switch, tracer and attribute names this module
shares); where the API is absent nothing of it is imported and a message pays one boolean check
(:data:`ACTIVE`). With the API but no SDK set up, a message pays a look at the tracer provider and no
span is made (:func:`~ddmq.protocol.produce.tracing.recording_possible`).

Each message handled runs its processor inside a ``process <topic>`` span (kind CONSUMER) whose parent
is the context the producer put in the message's properties (``traceparent``): the consumers hand a
processor one message at a time, so the producer's span is the parent and no link is needed (a
link stands for a message among several handled at once). Its attributes are the
messaging conventions' (system ``ddmq``, destination, partition = qid, operation ``process``, consumer
group, message id ``topic/qid/offset``, body size) and the time the message waited:
``ddmq.message.queue_wait_ms``, from its produce time to the start of its handling. The system, the
destination and the operation are given when the span starts (a sampler sees them); the rest is set
only on a span that records, so an unsampled message costs less. A failed message's span has status
ERROR with the reason the proxy keeps, and ``error.type``; an exception is recorded on it. Every
delivery is its own span, so a failed attempt and its retry are two spans of the producer's trace.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any, Final

from ddmq.client.pull_parts import ConsumedMessage
from ddmq.protocol.produce import tracing as shared

__all__ = ["ACTIVE", "QUEUE_WAIT", "ProcessSpan", "processing", "record_exception", "recording"]

_OTEL: Final = shared.load() if shared.ACTIVE else None
#: True where the API is installed and ``DDMQ_TRACING`` does not turn it off.
ACTIVE: Final = _OTEL is not None
#: Milliseconds from the message's produce time to the start of its handling.
QUEUE_WAIT: Final = "ddmq.message.queue_wait_ms"
OUTCOME: Final = "ddmq.message.outcome"
KEY: Final = "ddmq.message.key"
BODY_SIZE: Final = "messaging.message.body.size"


class ProcessSpan:
    """The span of one message's handling, current from ``__enter__`` to ``__exit__`` (a plain class,
    not a generator: this runs once per message); :meth:`finish` says how it ended."""

    __slots__ = ("group", "message", "span", "token")

    def __init__(self, group: str, message: ConsumedMessage) -> None:
        self.group = group
        self.message = message
        self.span: Any = None
        self.token: Any = None

    def __enter__(self) -> ProcessSpan:
        assert _OTEL is not None
        trace, propagate, context = _OTEL
        message = self.message
        started_ms = time.time() * 1000
        parent = propagate.extract(message.properties) if message.properties else None
        span = shared.TRACER.start_span(
            f"process {message.topic}", context=parent, kind=trace.SpanKind.CONSUMER,
            attributes={shared.SYSTEM_ATTR: shared.SYSTEM, shared.DESTINATION: message.topic,
                        shared.OPERATION_TYPE: "process"},
        )
        if span.is_recording():
            span.set_attributes(self._attributes(started_ms))
        self.span = span
        self.token = context.attach(trace.set_span_in_context(span))
        return self

    def _attributes(self, started_ms: float) -> dict[str, Any]:
        message = self.message
        attributes: dict[str, Any] = {
            shared.OPERATION_NAME: "process",
            shared.PARTITION: message.qid,
            shared.GROUP: self.group,
            shared.MESSAGE_ID: shared.message_id(message.topic, message.qid, message.offset),
            BODY_SIZE: len(message.value),
        }
        if message.key:
            attributes[KEY] = message.key
        if message.produce_ms > 0:
            attributes[QUEUE_WAIT] = max(0, round(started_ms - message.produce_ms))
        return attributes

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # The processor's exceptions never reach here (the consumer turns them into outcomes, and
        # record_exception puts them on the span); what does is the consumer's own stop.
        if self.span is None:
            return
        assert _OTEL is not None
        _OTEL[2].detach(self.token)
        self.span.end()

    def finish(self, verdict: str, reason: str | None) -> None:
        """``verdict`` ack, fail or release; a fail sets the span's status to ERROR with ``reason`` (None:
        the processor returned False, ``error.type`` "rejected"; an exception set its own type)."""
        span = self.span
        if span is None or not span.is_recording():
            return
        span.set_attribute(OUTCOME, verdict)
        if verdict == "fail":
            assert _OTEL is not None
            trace = _OTEL[0]
            if reason is None:
                span.set_attribute(shared.ERROR_TYPE, "rejected")
            span.set_status(trace.Status(trace.StatusCode.ERROR, reason or "the processor returned False"))


def recording() -> bool:
    """Whether a message's span can record (an SDK is set up); ask only where :data:`ACTIVE`."""
    return shared.recording_possible()


def processing(group: str, message: ConsumedMessage) -> ProcessSpan:
    """The ``process <topic>`` span of ``message``, current while the processor runs (``with``); only
    where :func:`recording`."""
    return ProcessSpan(group, message)


def record_exception(exc: BaseException) -> None:
    """Put a processor's exception on the current message's span, its class as ``error.type``."""
    assert _OTEL is not None
    span = _OTEL[0].get_current_span()
    if span.is_recording():
        span.set_attribute(shared.ERROR_TYPE, type(exc).__name__)
        span.record_exception(exc)
