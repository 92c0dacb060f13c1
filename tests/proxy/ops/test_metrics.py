"""/metrics: the Prometheus series move as messages are read, pulled, acked, failed, timed out,
retried and dead-lettered. Scraped over real HTTP and parsed with prometheus-client's parser."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ddmq.protocol.producer import AsyncProducer
from ddmq.proxy.ops.metrics import LatencyHistogram

from ...http_support import ApiClient
from ..servers.test_http_api import eventually, http_proxy, pull

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

QUEUE = {"group": "g", "topic": "t", "qid": "0"}


async def scrape(api: ApiClient) -> Samples:
    status, text = await api.call("GET", "/metrics")
    assert status == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def until(api: ApiClient, name: str, expected: float, **labels: str) -> Samples:
    """Scrape until ``name{labels}`` equals ``expected``; returns that scrape."""
    found: list[Samples] = []

    async def reached() -> bool:
        found[:] = [await scrape(api)]
        return value(found[0], name, **labels) == expected

    await eventually(reached)
    return found[0]


async def ack(api: ApiClient, success: list[int] = [], fail: list[int] = [], qid: Any = 0) -> None:  # noqa: B006
    status, _ = await api.call(
        "POST",
        "/v1/ack",
        json={"group": "g", "results": [{"topic": "t", "qid": qid, "success": success, "fail": fail}]},
    )
    assert status == 200


async def test_counters_and_gauges_follow_a_messages_life(redis_url: str) -> None:
    config = {"order_key": "NONE", "timeout_ms": 300, "max_retry": 1, "retry_intervals_ms": [10]}
    async with http_proxy(redis_url, config, queues=1) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"value": f"v{i}"} for i in range(10)])

        samples = await until(api, "ddmq_messages_ready", 10, **QUEUE)
        assert value(samples, "ddmq_messages_unfinished", **QUEUE) == 10
        assert value(samples, "ddmq_queue_owned", **QUEUE) == 1
        assert value(samples, "ddmq_produce_offset", **QUEUE) == 11
        assert value(samples, "ddmq_consume_offset", **QUEUE) == 1
        assert value(samples, "ddmq_lag_messages", **QUEUE) == 10
        for action in ("Json", "Order", "PullServer"):
            count = value(samples, "ddmq_action_duration_seconds_count", group="g", topic="t", action=action)
            assert count == 10, action
        assert value(samples, "ddmq_consumer_events_total", group="g", topic="t", event="read") == 10

        batch = await pull(api, max_batch=10)
        offsets = [m["offset"] for m in batch["messages"]]
        assert len(offsets) == 10
        samples = await scrape(api)
        assert value(samples, "ddmq_messages_delivered_total", **QUEUE) == 10
        assert value(samples, "ddmq_messages_in_flight", **QUEUE) == 10
        assert value(samples, "ddmq_messages_ready", **QUEUE) == 0
        assert value(samples, "ddmq_pull_duration_seconds_count", group="g", result="messages") == 1

        # 4 acked, 3 failed (retried after 10 ms), 3 left to time out (300 ms) and be retried too.
        await ack(api, success=offsets[:4], fail=offsets[4:7])
        samples = await until(api, "ddmq_messages_retried_total", 6, **QUEUE)
        assert value(samples, "ddmq_messages_acked_total", **QUEUE) == 4
        assert value(samples, "ddmq_messages_failed_total", **QUEUE) == 3
        assert value(samples, "ddmq_messages_timed_out_total", **QUEUE) == 3
        assert value(samples, "ddmq_messages_ready", **QUEUE) == 6
        assert value(samples, "ddmq_messages_in_flight", **QUEUE) == 0
        assert value(samples, "ddmq_messages_unfinished", **QUEUE) == 6

        # Second attempt of the 6 fails: max_retry 1 is used up, so they are dead-lettered.
        batch = await pull(api, max_batch=10)
        assert sorted(m["offset"] for m in batch["messages"]) == sorted(offsets[4:])
        await ack(api, fail=[m["offset"] for m in batch["messages"]])
        samples = await until(api, "ddmq_messages_dead_lettered_total", 6, **QUEUE)
        assert value(samples, "ddmq_messages_delivered_total", **QUEUE) == 16
        assert value(samples, "ddmq_messages_failed_total", **QUEUE) == 9
        samples = await until(api, "ddmq_consume_offset", 11, **QUEUE)
        assert value(samples, "ddmq_lag_messages", **QUEUE) == 0
        assert value(samples, "ddmq_messages_unfinished", **QUEUE) == 0

        # Acks nobody can match are counted, never an error.
        await ack(api, success=[offsets[0]])
        await ack(api, fail=[offsets[0]], qid=99)
        samples = await scrape(api)
        assert value(samples, "ddmq_acks_unknown_total", **QUEUE) == 1
        assert value(samples, "ddmq_proxy_events_total", event="unknown_results") == 1


async def test_order_chains_and_parked_pulls(redis_url: str) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY", "timeout_ms": 60_000}, queues=1) as (_, api):
        parked = asyncio.create_task(pull(api, linger_ms=10_000))
        samples = await until(api, "ddmq_parked_pulls", 1, group="g")
        assert value(samples, "ddmq_order_keys", group="g", topic="t") == 0
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch(
                "t", [{"key": key, "value": f"{key}{i}"} for key, i in [("a", 0), ("a", 1), ("b", 0), ("a", 2)]]
            )
        first = await parked
        got = [m["value_text"] for m in first["messages"]]
        while len(got) < 2:  # the heads of a and b
            got += [m["value_text"] for m in (await pull(api))["messages"]]
        assert sorted(got) == ["a0", "b0"]

        samples = await scrape(api)
        topic = {"group": "g", "topic": "t"}
        assert value(samples, "ddmq_parked_pulls", group="g") == 0
        assert value(samples, "ddmq_order_keys", **topic) == 2
        assert value(samples, "ddmq_order_waiting_messages", **topic) == 2
        assert value(samples, "ddmq_order_chain_length_max", **topic) == 3
        assert value(samples, "ddmq_order_chain_length_bucket", **topic, le="1.0") == 1
        assert value(samples, "ddmq_order_chain_length_bucket", **topic, le="2.0") == 1
        assert value(samples, "ddmq_order_chain_length_bucket", **topic, le="4.0") == 2
        assert value(samples, "ddmq_order_chain_length_gcount", **topic) == 2
        assert value(samples, "ddmq_topic_unfinished_messages", **topic) == 4


def test_latency_histogram_buckets_are_cumulative_and_inclusive() -> None:
    histogram = LatencyHistogram([0.001, 0.01])
    for seconds in (0.0005, 0.001, 0.002, 0.5):
        histogram.observe(seconds)
    assert histogram.buckets() == [("0.001", 2.0), ("0.01", 3.0), ("+Inf", 4.0)]
    assert histogram.total == 0.0005 + 0.001 + 0.002 + 0.5


_EXPANSION = re.compile(r"(ddmq_[a-z_]*_)\{([a-z_,]+)\}([a-z_]*)")  # ddmq_x_{a,b}_total
_NAME = re.compile(r"ddmq_[a-z_]*[a-z]")  # a brace after a letter holds labels: not part of the name


def _documented_metrics() -> set[str]:
    """Metric names the docs name, with ``ddmq_x_{a,b}_total`` expanded."""
    text = "\n".join(page.read_text() for page in sorted((Path(__file__).parents[3] / "docs").glob("*.md")))
    names: set[str] = set()
    for head, choices, tail in _EXPANSION.findall(text):
        names.update(f"{head}{choice}{tail}" for choice in choices.split(","))
    names.update(_NAME.findall(_EXPANSION.sub("", text)))
    return names


async def test_the_docs_name_every_exported_metric_and_no_other(redis_url: str) -> None:
    async with http_proxy(redis_url, queues=1) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t", "x", key="k")
        await pull(api)
        assert (await api.call("GET", "/metrics"))[0] == 200
        exported = {family.name for family in service.metrics.registry.collect()}
    documented = {name.removesuffix("_total") for name in _documented_metrics()}
    ours = {name for name in exported if name.startswith("ddmq_")}
    assert ours == documented, (sorted(ours - documented), sorted(documented - ours))
    # prometheus-client's process and platform collectors, on the service's own registry
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_start_time_seconds"} <= exported
    assert exported - ours <= {name for name in exported if name.startswith(("process_", "python_"))}


async def test_time_lag_dead_letter_length_and_unowned_queues(redis_url: str) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 0}
    async with http_proxy(redis_url, config, queues=2) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": "k", "value": f"v{i}", "qid": 0} for i in range(3)])
        produced_at = int(time.time() * 1000)
        samples = await until(api, "ddmq_lag_messages", 3, **QUEUE)
        assert value(samples, "ddmq_lag_seconds", group="g", topic="t", qid="1") == 0  # nothing produced there
        await asyncio.sleep(0.3)
        samples = await scrape(api)
        age = value(samples, "ddmq_lag_seconds", **QUEUE)
        assert 0.3 <= age <= (time.time() * 1000 - produced_at) / 1000 + 1, age
        assert value(samples, "ddmq_queues_without_owner", group="g", topic="t") == 0
        assert value(samples, "ddmq_dead_letters", group="g", topic="t") == 0

        head = await pull(api, max_batch=10)
        assert [m["value_text"] for m in head["messages"]] == ["v0"]
        await ack(api, fail=[head["messages"][0]["offset"]])  # max_retry 0: dead-lettered at once
        await until(api, "ddmq_dead_letters", 1, group="g", topic="t")
        second = await pull(api, max_batch=10)
        assert [m["value_text"] for m in second["messages"]] == ["v1"]
        await ack(api, success=[second["messages"][0]["offset"]])
        await ack(api, success=[(await pull(api, max_batch=10))["messages"][0]["offset"]])
        samples = await until(api, "ddmq_lag_seconds", 0, **QUEUE)
        assert value(samples, "ddmq_lag_messages", **QUEUE) == 0
        # The counter keeps counting; the gauge follows the stream, also after a purge.
        status, _ = await api.call("POST", "/admin/groups/g/topics/t/dead-letters/purge", json={"all": True})
        assert status == 200
        samples = await until(api, "ddmq_dead_letters", 0, group="g", topic="t")
        assert value(samples, "ddmq_messages_dead_lettered_total", **QUEUE) == 1

        await service.groups["g"].stop_reading()  # as on shutdown: no claim loop takes the queues back
        await service.groups["g"].release_leases()
        samples = await until(api, "ddmq_queues_without_owner", 2, group="g", topic="t")
