"""Trace context on what a producer sends, with OpenTelemetry where its API is installed.

Like an OpenTelemetry instrumentation, this is active by itself wherever ``opentelemetry-api`` is
installed (the ``otel`` extra) and off with ``DDMQ_TRACING=off``; where the API is absent nothing of it
is imported and a send pays one boolean check (:data:`ACTIVE`). A send runs in a ``send <topic>`` span
(kind PRODUCER, a child of the current span or a new root) and every message of it carries that span's
context in its properties, ``traceparent`` (and ``tracestate``, or whatever the configured propagator
writes), so the consumer's span joins the producer's trace. A message whose properties already name a
``traceparent`` keeps it. With the API but no SDK (no tracer provider set) the span is a no-op one, no
context exists and messages go out as they came.

Attribute names are OpenTelemetry's messaging semantic conventions; both sides take them from here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

from ddmq.protocol.produce.calls import OutgoingMessage, SendResult

__all__ = [
    "ACTIVE",
    "ENV",
    "SCOPE",
    "SYSTEM",
    "TRACER",
    "from_environment",
    "load",
    "message_id",
    "recording_possible",
    "sending",
]

#: ``DDMQ_TRACING=off`` (or ``0``, ``false``, ``no``) turns tracing off where the API is installed.
ENV: Final = "DDMQ_TRACING"
_OFF: Final = frozenset({"off", "0", "false", "no"})
#: The instrumentation scope both sides' tracers are named by.
SCOPE: Final = "ddmq"
#: ``messaging.system``: the wire a consumer sees is DDMQ's, whatever stores it.
SYSTEM: Final = "ddmq"

SYSTEM_ATTR: Final = "messaging.system"
DESTINATION: Final = "messaging.destination.name"
PARTITION: Final = "messaging.destination.partition.id"
OPERATION_TYPE: Final = "messaging.operation.type"
OPERATION_NAME: Final = "messaging.operation.name"
MESSAGE_ID: Final = "messaging.message.id"
BATCH_COUNT: Final = "messaging.batch.message_count"
GROUP: Final = "messaging.consumer.group.name"
ERROR_TYPE: Final = "error.type"


def load() -> tuple[Any, Any, Any] | None:
    """OpenTelemetry's ``trace``, ``propagate`` and ``context`` modules, or None when tracing is off or
    the API is not installed (then nothing of it stays imported)."""
    if os.environ.get(ENV, "").strip().lower() in _OFF:
        return None
    try:
        from opentelemetry import context, propagate, trace
    except ImportError:
        return None
    return trace, propagate, context


_OTEL: Final = load()
#: True where the API is installed and ``DDMQ_TRACING`` does not turn it off.
ACTIVE: Final = _OTEL is not None
#: One tracer for every span of both sides: got before an SDK is set up, it is the API's proxy tracer,
#: which hands over to the SDK's once one is.
TRACER: Final[Any] = None if _OTEL is None else _OTEL[0].get_tracer(SCOPE)


#: Whether the tracer provider can record, and until when (monotonic seconds) that answer holds.
_RECORDING: list[Any] = [False, float("-inf")]
#: How often the provider is looked at again: an SDK set up late is seen within this time.
PROVIDER_CHECK_S: Final = 1.0


def recording_possible() -> bool:
    """False while no SDK is set up (the API's proxy or no-op provider): every span would be a no-op,
    so a consumer skips the message's span altogether. Asked per message, answered from a cache
    renewed every :data:`PROVIDER_CHECK_S` (the API's ``get_tracer_provider`` reads the environment
    each call, which costs more than the rest of a message's handling)."""
    now = time.monotonic()
    if now >= _RECORDING[1]:
        assert _OTEL is not None
        trace = _OTEL[0]
        noop = isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
        _RECORDING[:] = [not noop, now + PROVIDER_CHECK_S]
    return bool(_RECORDING[0])


def message_id(topic: str, qid: int | str, offset: int) -> str:
    """``messaging.message.id``: where the message is, ``topic/qid/offset`` (unique within a Redis)."""
    return f"{topic}/{qid}/{offset}"


class SendSpan:
    """The span of one send, and the context its messages carry."""

    def __init__(self, span: Any, topic: str) -> None:
        self.span = span
        self.topic = topic

    def stamp(self, batch: list[OutgoingMessage]) -> list[OutgoingMessage]:
        """``batch`` with the current context in each message's properties; the same list when there is
        no context to carry (a no-op tracer)."""
        assert _OTEL is not None
        carrier: dict[str, str] = {}
        _OTEL[1].inject(carrier)
        if not carrier:
            return batch
        return [_with_context(message, carrier) for message in batch]

    def sent(self, results: Sequence[SendResult]) -> None:
        """Name the message of a one-message send (a batch's span stands for many)."""
        if len(results) == 1 and self.span.is_recording():
            result = results[0]
            self.span.set_attribute(MESSAGE_ID, message_id(result.topic, result.qid, result.offset))
            self.span.set_attribute(PARTITION, str(result.qid))


def _with_context(message: OutgoingMessage, carrier: dict[str, str]) -> OutgoingMessage:
    properties = message.properties
    if properties and "traceparent" in properties:
        return message
    merged = {**carrier, **properties} if properties else carrier
    # built directly: dataclasses.replace costs several times more, once per message
    return OutgoingMessage(message.value, message.key, message.tag, merged, message.qid, message.dedup_id)


@contextmanager
def from_environment() -> Iterator[None]:
    """The trace context of the ``TRACEPARENT`` and ``TRACESTATE`` environment variables made current, so
    a command line's sends join the trace of whatever ran it (``ddmq produce``); nothing without them."""
    parent = os.environ.get("TRACEPARENT")
    if _OTEL is None or not parent:
        yield
        return
    _, propagate, context = _OTEL
    carrier = {"traceparent": parent, "tracestate": os.environ.get("TRACESTATE", "")}
    token = context.attach(propagate.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


@contextmanager
def sending(topic: str, count: int) -> Iterator[SendSpan]:
    """A ``send <topic>`` span around a send of ``count`` messages; a failure ends it with the error."""
    assert _OTEL is not None
    trace = _OTEL[0]
    attributes: dict[str, Any] = {
        SYSTEM_ATTR: SYSTEM, DESTINATION: topic, OPERATION_TYPE: "send", OPERATION_NAME: "send",
    }
    if count > 1:
        attributes[BATCH_COUNT] = count
    with TRACER.start_as_current_span(
        f"send {topic}", kind=trace.SpanKind.PRODUCER, attributes=attributes
    ) as span:
        try:
            yield SendSpan(span, topic)
        except Exception as exc:
            span.set_attribute(ERROR_TYPE, type(exc).__name__)
            raise
