"""The producer's side of tracing on a real Redis: the switch, the send span and the context each message
carries, a user's own ``traceparent`` kept, a failed send's span, ``TRACEPARENT`` for ``ddmq produce``.

Whatever sets a tracer provider runs in a child process (this file run as a script), so no other test
of the session sees one; what needs none (the API installed, no SDK set up) runs here.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

TOPIC = "t"
OWN_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _child(redis_url: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    from ddmq.client import AsyncProducer, DeliveryError, Producer
    from ddmq.protocol.produce import tracing

    report: dict[str, Any] = {}
    with Producer(redis_url) as producer:
        own = {"value": "b", "properties": {"traceparent": OWN_PARENT}}
        producer.send_batch(TOPIC, [{"value": "a", "key": "k"}, own])
        os.environ["TRACEPARENT"] = "00-11111111111111111111111111111111-2222222222222222-01"
        with tracing.from_environment():
            producer.send(TOPIC, "c")
        del os.environ["TRACEPARENT"]

    async def send_async() -> list[Any]:
        async with AsyncProducer(redis_url) as producer:
            return list(await producer.send(TOPIC, "d", key="k"))

    report["async_result"] = asyncio.run(send_async())
    with Producer("redis://127.0.0.1:1/0", delivery_timeout_ms=300, request_timeout_ms=100) as broken:
        try:
            broken.send(TOPIC, "lost")
        except DeliveryError:
            report["failed"] = True
    report["spans"] = [
        {
            "name": span.name, "kind": span.kind.name, "attributes": dict(span.attributes),
            "trace_id": f"{span.context.trace_id:032x}", "span_id": f"{span.context.span_id:016x}",
            "parent": None if span.parent is None else f"{span.parent.span_id:016x}",
            "status": span.status.status_code.name, "events": [event.name for event in span.events],
        }
        for span in exporter.get_finished_spans()
    ]
    print(json.dumps(report))


def _entries(redis_url: str) -> list[dict[str, str]]:
    """The properties of every entry of the topic's queues, in no particular order."""
    import redis

    from ddmq.protocol.redis import keys
    from ddmq.protocol.redis.stream_entry import decode_properties

    found = []
    with redis.Redis.from_url(redis_url) as client:
        for qid in range(8):
            for _, fields in client.xrange(keys.stream(TOPIC, qid)):
                found.append(decode_properties(fields.get(b"p")))
    return found


def test_send_span_and_context_on_every_message(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, __file__, redis_url], capture_output=True, text=True, timeout=60, check=False,
        env={k: v for k, v in os.environ.items() if k not in ("DDMQ_TRACING", "TRACEPARENT")},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failed"]
    sends = [span for span in report["spans"] if span["kind"] == "PRODUCER"]
    assert [span["name"] for span in sends] == [f"send {TOPIC}"] * 4
    batch, from_env, single, failed = sends
    assert batch["attributes"] == {
        "messaging.system": "ddmq", "messaging.destination.name": TOPIC, "messaging.operation.type": "send",
        "messaging.operation.name": "send", "messaging.batch.message_count": 2,
    }
    assert from_env["parent"] == "2222222222222222" and from_env["trace_id"] == "1" * 32
    qid, offset = report["async_result"][1:]
    assert single["attributes"]["messaging.message.id"] == f"{TOPIC}/{qid}/{offset}"
    assert single["attributes"]["messaging.destination.partition.id"] == str(qid)
    assert failed["status"] == "ERROR" and failed["attributes"]["error.type"] == "DeliveryError"
    assert "exception" in failed["events"]
    # version-trace-span-flags; the flags say sampled (and, from newer SDKs, a random trace id)
    parents = sorted(properties["traceparent"].split("-")[1:3] for properties in _entries(redis_url))
    assert parents == sorted([
        [batch["trace_id"], batch["span_id"]], OWN_PARENT.split("-")[1:3],
        [from_env["trace_id"], from_env["span_id"]], [single["trace_id"], single["span_id"]],
    ])


def test_api_without_sdk_sends_messages_as_they_came(redis_url: str) -> None:
    from ddmq.client import Producer
    from ddmq.protocol.produce import tracing

    assert tracing.ACTIVE, "the test extra installs opentelemetry-api"
    with Producer(redis_url) as producer:
        producer.send(TOPIC, "plain")
        producer.send(TOPIC, "with", properties={"app": "demo"})
    assert sorted(_entries(redis_url), key=len) == [{}, {"app": "demo"}]


def _off_child(redis_url: str) -> None:
    """With ``DDMQ_TRACING`` off and an SDK set up: no span, no context on the message."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    from ddmq.client import Producer, tracing
    from ddmq.protocol.produce import tracing as produce_tracing

    with Producer(redis_url) as producer:
        producer.send(TOPIC, "plain")
    print(json.dumps([tracing.ACTIVE, produce_tracing.ACTIVE, len(exporter.get_finished_spans())]))


def test_off_switch(redis_url: str) -> None:
    for value in ("off", "OFF", "0", "false"):
        done = subprocess.run(
            [sys.executable, __file__, redis_url, "off"], capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "DDMQ_TRACING": value},
        )
        assert done.returncode == 0, done.stderr[-4000:]
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [False, False, 0]
    assert _entries(redis_url) == [{}] * 4


def test_ddmq_produce_joins_the_callers_trace(redis_url: str) -> None:
    ddmq = Path(sys.executable).with_name("ddmq")
    parent = "00-33333333333333333333333333333333-4444444444444444-01"
    env = {k: v for k, v in os.environ.items() if k != "DDMQ_TRACING"}
    done = subprocess.run(
        [str(ddmq), "produce", "--redis", redis_url, "--create", "--topic", TOPIC], input='{"value": "x"}\n',
        capture_output=True, text=True, timeout=60, check=False, env={**env, "TRACEPARENT": parent},
    )
    assert done.returncode == 0, done.stderr
    # no SDK in that process: the caller's span context travels as it came
    assert _entries(redis_url) == [{"traceparent": parent}]


if __name__ == "__main__":
    (_off_child if sys.argv[2:] == ["off"] else _child)(sys.argv[1])
