"""A span per message a consumer handles, in the producer's trace, with OpenTelemetry where installed.

Active where ``opentelemetry-api`` is installed and ``DDMQ_TRACING`` is not ``off``, as on the producer's
side (:mod:`ddmq.protocol.produce.tracing`, whose switch and attribute names this module shares); where
the API is absent nothing of it is imported and a message pays one boolean check (:data:`ACTIVE`).

Each message handled runs its processor inside a ``process <topic>`` span (kind CONSUMER) whose parent
is the context the producer put in the message's properties (``traceparent``), with a link to it as
well, so a backend that keys process spans on links finds the producer too. Its attributes are the
messaging conventions' (system ``ddmq``, destination, partition = qid, operation ``process``, consumer
group, message id ``topic/qid/offset``) and the time the message waited: ``ddmq.message.queue_wait_ms``,
from its produce time to the start of its handling. A failed message's span has status ERROR with the
reason the proxy keeps, and ``error.type``; an exception is recorded on it. Every delivery is its own
span, so a failed attempt and its retry are two spans of the producer's trace.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from ddmq.client.pull_parts import ConsumedMessage
from ddmq.protocol.produce import tracing as shared

__all__ = ["ACTIVE", "QUEUE_WAIT", "ProcessSpan", "processing", "record_exception"]

_OTEL: Final = shared.load() if shared.ACTIVE else None
#: True where the API is installed and ``DDMQ_TRACING`` does not turn it off.
ACTIVE: Final = _OTEL is not None
#: Milliseconds from the message's produce time to the start of its handling.
QUEUE_WAIT: Final = "ddmq.message.queue_wait_ms"
OUTCOME: Final = "ddmq.message.outcome"
KEY: Final = "ddmq.message.key"
BODY_SIZE: Final = "messaging.message.body.size"


class ProcessSpan:
    """The span of one message's handling; :meth:`finish` says how it ended."""

    def __init__(self, span: Any) -> None:
        self.span = span

    def finish(self, verdict: str, reason: str | None) -> None:
        """``verdict`` ack, fail or release; a fail sets the span's status to ERROR with ``reason`` (None:
        the processor returned False, ``error.type`` "rejected"; an exception set its own type)."""
        span = self.span
        if not span.is_recording():
            return
        span.set_attribute(OUTCOME, verdict)
        if verdict == "fail":
            assert _OTEL is not None
            trace = _OTEL[0]
            if reason is None:
                span.set_attribute(shared.ERROR_TYPE, "rejected")
            span.set_status(trace.Status(trace.StatusCode.ERROR, reason or "the processor returned False"))


@contextmanager
def processing(group: str, message: ConsumedMessage) -> Iterator[ProcessSpan]:
    """The ``process <topic>`` span of ``message``, current while the processor runs."""
    assert _OTEL is not None
    trace, propagate = _OTEL
    started_ms = time.time() * 1000
    parent = propagate.extract(message.properties) if message.properties else None
    links = []
    if parent is not None:
        origin = trace.get_current_span(parent).get_span_context()
        if origin.is_valid:
            links.append(trace.Link(origin))
    attributes: dict[str, Any] = {
        shared.SYSTEM_ATTR: shared.SYSTEM,
        shared.DESTINATION: message.topic,
        shared.PARTITION: message.qid,
        shared.OPERATION_TYPE: "process",
        shared.OPERATION_NAME: "process",
        shared.GROUP: group,
        shared.MESSAGE_ID: shared.message_id(message.topic, message.qid, message.offset),
        BODY_SIZE: len(message.value),
    }
    if message.key:
        attributes[KEY] = message.key
    if message.produce_ms > 0:
        attributes[QUEUE_WAIT] = max(0, round(started_ms - message.produce_ms))
    tracer = trace.get_tracer(shared.SCOPE)
    # The processor's exceptions never reach here (the consumer turns them into outcomes, and
    # record_exception puts them on the span); what does is the consumer's own stop.
    with tracer.start_as_current_span(
        f"process {message.topic}", context=parent, kind=trace.SpanKind.CONSUMER, links=links,
        attributes=attributes, record_exception=False, set_status_on_exception=False,
    ) as span:
        yield ProcessSpan(span)


def record_exception(exc: BaseException) -> None:
    """Put a processor's exception on the current message's span, its class as ``error.type``."""
    assert _OTEL is not None
    span = _OTEL[0].get_current_span()
    if span.is_recording():
        span.set_attribute(shared.ERROR_TYPE, type(exc).__name__)
        span.record_exception(exc)
