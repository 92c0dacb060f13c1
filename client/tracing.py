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

import re
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


#: A W3C ``traceparent`` of version 00 whose trace is not sampled: trace id and parent span id (neither all
#: zeros), flags with the sampled bit clear (lower-case hex, as the standard writes it).
_UNSAMPLED: Final = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f][02468ace]")
#: The properties that name a context beside ``traceparent``: a message with one takes the propagator's way.
_MORE_CONTEXT: Final = ("tracestate", "baggage")
#: Whether an unsampled producer's message may skip its span (:func:`_drops_unsampled`), and until when.
_DROPS: list[Any] = [False, float("-inf")]


def _drops_unsampled() -> bool:
    """True when the SDK's tracer provider would make a message whose producer did not sample its trace a
    non-recording span, with nothing else to show for it: its sampler is the SDK's ``ParentBased`` (the
    default) with ``remote_parent_not_sampled`` left at ``ALWAYS_OFF``, and the propagator reads W3C trace
    context. Such a message then pays a match of its ``traceparent``, not the propagator, the sampler and
    a span (more than its handling's own cost in ``bench/tracing.py``). Renewed as
    :func:`~ddmq.protocol.produce.tracing.recording_possible` is; any other set-up takes the general way."""
    now = time.monotonic()
    if now >= _DROPS[1]:
        _DROPS[:] = [_parent_decides(), now + shared.PROVIDER_CHECK_S]
    return bool(_DROPS[0])


def _parent_decides() -> bool:
    assert _OTEL is not None
    trace, propagate, _ = _OTEL
    try:
        from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
    except ImportError:  # the API without the SDK: no span records anyway
        return False
    sampler = getattr(trace.get_tracer_provider(), "sampler", None)
    fields = propagate.get_global_textmap().fields
    return (isinstance(sampler, ParentBased) and getattr(sampler, "_remote_parent_not_sampled", None) is ALWAYS_OFF
            and "traceparent" in fields and fields <= {"traceparent", *_MORE_CONTEXT})


def _unsampled_parent(properties: dict[str, str]) -> str | None:
    """The ``traceparent`` of ``properties`` when it is all the context they carry and its trace is not
    sampled; None otherwise (no context, a sampled one, or one the propagator must read)."""
    parent = properties.get("traceparent")
    if parent is None or _UNSAMPLED.fullmatch(parent) is None or any(name in properties for name in _MORE_CONTEXT):
        return None
    return parent


def _parent_span_class() -> Any:
    assert _OTEL is not None
    trace = _OTEL[0]

    base: Any = trace.NonRecordingSpan

    class UnsampledParent(base):  # type: ignore[misc]  # (the API's class, loaded at run time)
        """The producer's span as the current one while its message is handled: not sampled, so nothing
        records; its context is read from the ``traceparent`` only when asked (a span the processor
        starts, a message it sends on), as most processors never ask."""

        def __init__(self, traceparent: str) -> None:
            super().__init__(None)
            self.traceparent = traceparent

        def get_span_context(self) -> Any:
            context: Any = self._context  # type: ignore[has-type]
            if context is None:
                parent = self.traceparent
                context = self._context = trace.SpanContext(
                    int(parent[3:35], 16), int(parent[36:52], 16), is_remote=True,
                    trace_flags=trace.TraceFlags(int(parent[53:55], 16)),
                )
            return context

    return UnsampledParent


#: The current span of a message whose producer did not sample its trace (None where tracing is off).
_UNSAMPLED_PARENT: Final = _parent_span_class() if _OTEL is not None else None


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
        properties = message.properties
        if properties and (unsampled := _unsampled_parent(properties)) is not None and _drops_unsampled():
            # The span would not record: the producer's span is made current as it is, so what the
            # processor sends goes on in the same (unsampled) trace.
            assert _UNSAMPLED_PARENT is not None
            self.span = _UNSAMPLED_PARENT(unsampled)
            self.token = context.attach(trace.set_span_in_context(self.span))
            return self
        started_ms = time.time() * 1000
        parent = propagate.extract(properties) if properties else None
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
