"""Trace context through the whole path: real producers (sync and async), Redis, a proxy process, the
SDK's consumers (thread and asyncio) and an HTTP puller.

With OpenTelemetry's SDK and its in-memory exporter, every handled message's span has the producer's
send span as parent, and the messaging attributes; a failed attempt and its retry are two
spans of one trace; the HTTP puller sees ``traceparent`` among the properties like any other. With
OpenTelemetry made unimportable (as if it were not installed) the same run imports nothing of it and
the consumers see exactly the properties produced. Both runs check per-key order and that every
message produced is acked.

The producing and consuming run in a child process (this file run as a script), so the tracer provider
it sets, and the import it blocks, never reach the other tests of the session.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

TOPIC = "traced"
KEYS = 4
PER_KEY = 10
GROUPS = {"sync": "g-sync", "async": "g-async", "http": "g-http"}
#: The sync consumer's processor raises on this message's first delivery, the async one's asks a retry.
FAIL_SYNC = ("k1", 3)
FAIL_ASYNC = ("k2", 5)
APP_PROPERTIES = {"app": "demo"}


# ---- the child: produce and consume, print what was delivered and the spans ----


class _NoOpenTelemetry(importlib.abc.MetaPathFinder):
    """Makes ``import opentelemetry`` fail as if it were not installed, and counts the attempts."""

    attempts = 0

    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            _NoOpenTelemetry.attempts += 1
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _body(key: str, seq: int) -> str:
    return json.dumps({"k": key, "seq": seq})


def _produce(redis_url: str, traced: bool) -> None:
    """k0, k1 in one batch under a root span; k2 one by one with properties; k3 from the async producer."""
    from ddmq.client import AsyncProducer, OutgoingMessage, Producer

    with Producer(redis_url) as producer:
        producer.ensure_topic(TOPIC, 4)
        batch = [OutgoingMessage(_body(k, s), key=k) for s in range(PER_KEY) for k in ("k0", "k1")]
        if traced:
            from opentelemetry import trace

            with trace.get_tracer("test").start_as_current_span("checkout"):
                producer.send_batch(TOPIC, batch)
        else:
            producer.send_batch(TOPIC, batch)
        for seq in range(PER_KEY):
            producer.send(TOPIC, _body("k2", seq), key="k2", properties=APP_PROPERTIES)

    async def produce_async() -> None:
        async with AsyncProducer(redis_url) as producer:
            for seq in range(PER_KEY):
                await producer.send(TOPIC, _body("k3", seq), key="k3")

    asyncio.run(produce_async())


class _Log:
    """Deliveries of one group: (key, seq, properties, acked) in the order the processor saw them."""

    def __init__(self, fail: tuple[str, int]) -> None:
        self.fail = fail
        self.deliveries: list[tuple[str, int, dict[str, str], bool]] = []
        self.acked: set[tuple[str, int]] = set()
        self.lock = threading.Lock()

    def see(self, message: Any) -> bool:
        event = json.loads(message.value)
        item = (event["k"], event["seq"])
        with self.lock:
            first = all((k, s) != item for k, s, _, _ in self.deliveries)
            fails = first and item == self.fail
            self.deliveries.append((*item, dict(message.properties), not fails))
            if not fails:
                self.acked.add(item)
        return not fails

    def done(self) -> bool:
        with self.lock:
            return len(self.acked) == KEYS * PER_KEY


def _consume(port: int) -> dict[str, _Log]:
    from ddmq.client import AsyncPullConsumer, PullConsumer, Retry

    logs = {"sync": _Log(FAIL_SYNC), "async": _Log(FAIL_ASYNC)}

    def handle(message: Any) -> bool:
        if not logs["sync"].see(message):
            raise ValueError("boom")
        return True

    async def handle_async(message: Any) -> bool:
        if not logs["async"].see(message):
            raise Retry(10, "later, please")
        return True

    def wait(log: _Log) -> None:
        deadline = time.monotonic() + 60
        while not log.done():
            assert time.monotonic() < deadline, "every message acked within 60 s"
            time.sleep(0.05)

    server = f"127.0.0.1:{port}"
    with PullConsumer(server, GROUPS["sync"], handle, topic=TOPIC, threads=2, linger_ms=100):
        wait(logs["sync"])

    async def run_async() -> None:
        async with AsyncPullConsumer(server, GROUPS["async"], handle_async, topic=TOPIC, linger_ms=100):
            await asyncio.to_thread(wait, logs["async"])

    asyncio.run(run_async())
    return logs


def _span_record(span: Any) -> dict[str, Any]:
    parent = span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{span.context.trace_id:032x}",
        "span_id": f"{span.context.span_id:016x}",
        "parent": None if parent is None else f"{parent.span_id:016x}",
        "parent_trace": None if parent is None else f"{parent.trace_id:032x}",
        "links": [[f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}"] for link in span.links],
        "attributes": dict(span.attributes),
        "status": span.status.status_code.name,
        "description": span.status.description,
        "events": [event.name for event in span.events],
    }


def _active(module: str) -> bool:
    return bool(sys.modules[module].ACTIVE)


def _unsampled_parent(key: str, seq: int) -> str:
    """A producer's context whose trace it did not sample (flags 00), one trace per message."""
    return f"00-{int(key[1:]) + 1:016x}{seq + 1:016x}-{seq + 1:016x}-00"


def _unsampled_child(redis_url: str, port: int, sampler_name: str) -> None:
    """Messages whose producer did not sample their trace, consumed under ``sampler_name``: the SDK's
    default ``ParentBased`` (their spans would not record) or ``ALWAYS_ON`` (every span records)."""
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    exporter = InMemorySpanExporter()
    sampler = ParentBased(ALWAYS_ON) if sampler_name == "parent" else ALWAYS_ON
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    from ddmq.client import OutgoingMessage, Producer, PullConsumer

    with Producer(redis_url) as producer:
        producer.ensure_topic(TOPIC, 4)
        producer.send_batch(TOPIC, [
            OutgoingMessage(_body(k, s), key=k, properties={"traceparent": _unsampled_parent(k, s)})
            for s in range(PER_KEY) for k in (f"k{i}" for i in range(KEYS))
        ])
    log = _Log(("none", -1))
    current: list[list[Any]] = []

    def handle(message: Any) -> bool:
        context = trace.get_current_span().get_span_context()
        sent_on: dict[str, str] = {}
        propagate.inject(sent_on)  # what a message the processor sends on would carry
        event = json.loads(message.value)
        with log.lock:
            current.append([message.properties["traceparent"], f"{context.trace_id:032x}", context.trace_flags.sampled,
                            trace.get_current_span().is_recording(), event["k"], event["seq"], sent_on["traceparent"]])
        return log.see(message)

    with PullConsumer(f"127.0.0.1:{port}", GROUPS["sync"], handle, topic=TOPIC, threads=2, linger_ms=100):
        deadline = time.monotonic() + 60
        while not log.done():
            assert time.monotonic() < deadline, "every message acked within 60 s"
            time.sleep(0.05)
    print(json.dumps({"deliveries": log.deliveries, "current": current,
                      "spans": [_span_record(span) for span in exporter.get_finished_spans()]}))


def _child(redis_url: str, port: int, mode: str) -> None:
    if mode.startswith("unsampled-"):
        _unsampled_child(redis_url, port, mode.removeprefix("unsampled-"))
        return
    exporter = None
    if mode == "absent":
        sys.meta_path.insert(0, _NoOpenTelemetry())
    else:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    _produce(redis_url, traced=exporter is not None)
    logs = _consume(port)
    report = {
        "deliveries": {name: log.deliveries for name, log in logs.items()},
        "spans": [] if exporter is None else [_span_record(span) for span in exporter.get_finished_spans()],
        "imported": sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"),
        "blocked_imports": _NoOpenTelemetry.attempts,
        "active": [_active("ddmq.protocol.produce.tracing"), _active("ddmq.client.tracing")],
    }
    print(json.dumps(report))


# ---- the test ----


def _run_child(redis_url: str, port: int, mode: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "DDMQ_TRACING"}
    done = subprocess.run(
        [sys.executable, __file__, redis_url, str(port), mode], capture_output=True, text=True, timeout=100,
        env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _check_order(deliveries: list[list[Any]]) -> None:
    """Per key, deliveries in seq order (a failed one again before its successor), every seq acked."""
    seen: dict[str, list[int]] = defaultdict(list)
    acked: dict[str, list[int]] = defaultdict(list)
    for key, seq, _, ok in deliveries:
        assert not seen[key] or seq in (seen[key][-1], seen[key][-1] + 1), (key, seen[key], seq)
        seen[key].append(seq)
        if ok:
            acked[key].append(seq)
    assert {key: acked[key] for key in sorted(acked)} == {f"k{i}": list(range(PER_KEY)) for i in range(KEYS)}


def _traceparent(properties: dict[str, str]) -> tuple[str, str]:
    _, trace_id, span_id, _ = properties["traceparent"].split("-")
    return trace_id, span_id


def _proxy(tmp_path: Path, redis_url: str, http_port: int) -> Any:
    from ..support import ProxyProcess

    group = {"order_key": "KEY", "timeout_ms": 5000, "max_retry": 5, "retry_intervals_ms": [20]}
    return ProxyProcess(
        tmp_path, redis_url, {name: {TOPIC: group} for name in GROUPS.values()}, {TOPIC: {"queues": 4}},
        http={"enabled": True, "host": "127.0.0.1", "port": http_port},
    )


async def _pull_http(base: str) -> list[dict[str, Any]]:
    """Every message of the HTTP group, pulled and acked over HTTP."""
    import aiohttp

    messages: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while len(messages) < KEYS * PER_KEY:
            assert time.monotonic() < deadline, f"{len(messages)} messages over HTTP within 30 s"
            request = {"group": GROUPS["http"], "topic": TOPIC, "max_batch": 32, "linger_ms": 100, "results": results}
            async with session.post(base + "/v1/pull", json=request) as response:
                assert response.status == 200, await response.text()
                answer = await response.json()
            messages += answer["messages"]
            offsets = [message["offset"] for message in answer["messages"]]
            results = [{"topic": answer["topic"], "qid": answer["qid"], "success": offsets}] if offsets else []
        if results:
            async with session.post(base + "/v1/ack", json={"group": GROUPS["http"], "results": results}) as r:
                assert r.status == 200, await r.text()
    return messages


def _check_spans(report: dict[str, Any]) -> None:
    spans = report["spans"]
    sends = {(s["trace_id"], s["span_id"]): s for s in spans if s["kind"] == "PRODUCER"}
    assert all(s["attributes"]["messaging.operation.type"] == "send" for s in sends.values())
    assert all(s["attributes"]["messaging.destination.name"] == TOPIC for s in sends.values())
    (root,) = [s for s in spans if s["name"] == "checkout"]
    assert any(s["parent"] == root["span_id"] for s in sends.values()), "the batch's send is the root's child"
    by_message: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for group_name, consumer in (("g-sync", "sync"), ("g-async", "async")):
        process = [s for s in spans if s["kind"] == "CONSUMER"
                   and s["attributes"]["messaging.consumer.group.name"] == group_name]
        assert len(process) == len(report["deliveries"][consumer])
        for span in process:
            attributes = span["attributes"]
            assert span["name"] == f"process {TOPIC}"
            assert attributes["messaging.system"] == "ddmq"
            assert attributes["messaging.operation.type"] == "process"
            assert attributes["messaging.destination.name"] == TOPIC
            topic, qid, offset = attributes["messaging.message.id"].split("/")
            assert (topic, qid) == (TOPIC, attributes["messaging.destination.partition.id"]) and int(offset) > 0
            assert attributes["ddmq.message.queue_wait_ms"] >= 0
            origin = (span["parent_trace"], span["parent"])
            assert origin in sends, f"the parent of {attributes['messaging.message.id']} is a send span"
            assert span["links"] == [], "one message at a time: the producer's span is the parent"
            assert span["trace_id"] == span["parent_trace"]
            by_message[group_name + "/" + attributes["messaging.message.id"]].append(span)
    retried = {name: found for name, found in by_message.items() if len(found) > 1}
    assert sorted(name.split("/")[0] for name in retried) == ["g-async", "g-sync"], sorted(retried)
    for name, (first, second) in retried.items():
        assert first["trace_id"] == second["trace_id"]
        assert first["status"] == "ERROR" and second["status"] != "ERROR"
        assert second["attributes"]["ddmq.message.outcome"] == "ack"
        if name.startswith("g-sync"):
            assert first["attributes"]["error.type"] == "ValueError"
            assert "boom" in first["description"] and "exception" in first["events"]
        else:
            assert first["attributes"]["error.type"] == "Retry" and first["description"] == "later, please"


def test_trace_context_from_producer_to_consumers(redis_url: str, tmp_path: Path) -> None:
    from ddmq.protocol.net import free_port

    http_port = free_port()
    proxy = _proxy(tmp_path, redis_url, http_port).start()
    try:
        report = _run_child(redis_url, proxy.port, "traced")
        assert report["active"] == [True, True]
        for deliveries in report["deliveries"].values():
            _check_order(deliveries)
            for key, _, properties, _ in deliveries:
                assert "traceparent" in properties
                if key == "k2":
                    assert properties["app"] == "demo"
        _check_spans(report)
        by_body = {(k, s): p for k, s, p, _ in report["deliveries"]["sync"]}
        http_messages = asyncio.run(_pull_http(f"http://127.0.0.1:{http_port}"))
        for message in http_messages:
            event = json.loads(message["value_text"])
            assert message["properties"] == by_body[(event["k"], event["seq"])]
            assert _traceparent(message["properties"])[0] in {s["trace_id"] for s in report["spans"]}
    finally:
        assert proxy.stop() == 0, proxy.log()


@pytest.mark.parametrize("sampler", ["parent", "always"])
def test_a_message_whose_producer_did_not_sample_its_trace(redis_url: str, tmp_path: Path, sampler: str) -> None:
    """Under the SDK's default ``ParentBased`` sampler the message's span would not record: none is made,
    and the processor runs in the producer's (unsampled) context, so what it sends on stays in that trace.
    Under ``ALWAYS_ON`` every message still gets its recorded span, the producer's as its parent."""
    from ddmq.protocol.net import free_port

    proxy = _proxy(tmp_path, redis_url, free_port()).start()
    try:
        report = _run_child(redis_url, proxy.port, f"unsampled-{sampler}")
    finally:
        assert proxy.stop() == 0, proxy.log()
    _check_order(report["deliveries"])
    assert len(report["current"]) == KEYS * PER_KEY
    for traceparent, trace_id, sampled, recording, key, seq, sent_on in report["current"]:
        assert traceparent == _unsampled_parent(key, seq)
        assert trace_id == traceparent.split("-")[1], "the processor runs in the producer's trace"
        assert sent_on.split("-")[1] == trace_id and sent_on.endswith("-01" if sampler == "always" else "-00")
        assert sampled == recording == (sampler == "always"), "its own span only where the sampler records it"
    process = [span for span in report["spans"] if span["kind"] == "CONSUMER"]
    if sampler == "parent":
        assert process == []
        return
    assert len(process) == KEYS * PER_KEY
    parents = {(span["parent_trace"], span["parent"]) for span in process}
    assert parents == {tuple(_unsampled_parent(k, s).split("-")[1:3])
                       for k in (f"k{i}" for i in range(KEYS)) for s in range(PER_KEY)}


def test_without_opentelemetry_nothing_is_imported(redis_url: str, tmp_path: Path) -> None:
    from ddmq.protocol.net import free_port

    proxy = _proxy(tmp_path, redis_url, free_port()).start()
    try:
        report = _run_child(redis_url, proxy.port, "absent")
    finally:
        assert proxy.stop() == 0, proxy.log()
    assert report["imported"] == []
    assert report["blocked_imports"] > 0 and report["active"] == [False, False], "looked for, found none"
    for deliveries in report["deliveries"].values():
        _check_order(deliveries)
        for key, _, properties, _ in deliveries:
            assert properties == (APP_PROPERTIES if key == "k2" else {})


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]), sys.argv[3])
