"""/metrics: the Prometheus series move as messages are read, pulled, acked, failed, timed out,
retried and dead-lettered, per (group, topic) by default and per queue with ``metrics.per_queue``.
Scraped over real HTTP and parsed with prometheus-client's parser."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddmq.config.schema import MetricsConfig
from ddmq.protocol.producer import AsyncProducer
from ddmq.proxy.ops.collector import LatencyHistogram

from ...http_support import ApiClient
from ..servers.test_http_api import eventually, http_proxy, pull

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

QUEUE = {"group": "g", "topic": "t", "qid": "0"}
TOPIC = {"group": "g", "topic": "t"}
#: Families that only exist per queue: an offset has no sum.
PER_QUEUE_ONLY = {"ddmq_consume_offset", "ddmq_produce_offset"}
MODES = pytest.mark.parametrize("per_queue", [False, True], ids=["per_topic", "per_queue"])


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


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


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


@MODES
async def test_counters_and_gauges_follow_a_messages_life(redis_url: str, per_queue: bool) -> None:
    # One queue: the (group, topic) series and the queue's carry the same figures.
    config = {"order_key": "NONE", "timeout_ms": 300, "max_retry": 1, "retry_intervals_ms": [10]}
    where = QUEUE if per_queue else TOPIC
    async with http_proxy(redis_url, config, queues=1, metrics={"per_queue": per_queue}) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"value": f"v{i}"} for i in range(10)])

        samples = await until(api, "ddmq_messages_ready", 10, **where)
        assert value(samples, "ddmq_messages_unfinished", **where) == 10
        assert value(samples, "ddmq_queue_owned", **where) == 1
        if per_queue:
            assert value(samples, "ddmq_produce_offset", **where) == 11
            assert value(samples, "ddmq_consume_offset", **where) == 1
        else:
            assert not names(samples) & PER_QUEUE_ONLY
            assert not [labels for name, labels in samples if name.startswith("ddmq_") and "qid" in dict(labels)]
        assert value(samples, "ddmq_lag_messages", **where) == 10
        # Action durations per (group, action) by default: the same code runs for every topic.
        for action in ("Json", "Order", "PullServer"):
            count = value(samples, "ddmq_action_duration_seconds_count", **(TOPIC if per_queue else {"group": "g"}),
                          action=action)
            assert count == 10, action
        assert value(samples, "ddmq_consumer_events_total", group="g", topic="t", event="read") == 10

        batch = await pull(api, max_batch=10)
        offsets = [m["offset"] for m in batch["messages"]]
        assert len(offsets) == 10
        samples = await scrape(api)
        assert value(samples, "ddmq_messages_delivered_total", **where) == 10
        assert value(samples, "ddmq_messages_in_flight", **where) == 10
        assert value(samples, "ddmq_messages_ready", **where) == 0
        assert value(samples, "ddmq_pull_duration_seconds_count", group="g", result="messages") == 1

        # 4 acked, 3 failed (retried after 10 ms), 3 left to time out (300 ms) and be retried too.
        await ack(api, success=offsets[:4], fail=offsets[4:7])
        samples = await until(api, "ddmq_messages_retried_total", 6, **where)
        assert value(samples, "ddmq_messages_acked_total", **where) == 4
        assert value(samples, "ddmq_messages_failed_total", **where) == 3
        assert value(samples, "ddmq_messages_timed_out_total", **where) == 3
        assert value(samples, "ddmq_messages_ready", **where) == 6
        assert value(samples, "ddmq_messages_in_flight", **where) == 0
        assert value(samples, "ddmq_messages_unfinished", **where) == 6

        # Second attempt of the 6 fails: max_retry 1 is used up, so they are dead-lettered.
        batch = await pull(api, max_batch=10)
        assert sorted(m["offset"] for m in batch["messages"]) == sorted(offsets[4:])
        await ack(api, fail=[m["offset"] for m in batch["messages"]])
        samples = await until(api, "ddmq_messages_dead_lettered_total", 6, **where)
        assert value(samples, "ddmq_messages_delivered_total", **where) == 16
        assert value(samples, "ddmq_messages_failed_total", **where) == 9
        samples = await until(api, "ddmq_lag_messages", 0, **where)
        if per_queue:
            assert value(samples, "ddmq_consume_offset", **where) == 11
        assert value(samples, "ddmq_messages_unfinished", **where) == 0

        # Acks nobody can match are counted, never an error.
        await ack(api, success=[offsets[0]])
        await ack(api, fail=[offsets[0]], qid=99)
        samples = await scrape(api)
        assert value(samples, "ddmq_acks_unknown_total", **where) == 1
        assert value(samples, "ddmq_proxy_events_total", event="unknown_results") == 1


async def test_order_chains_and_parked_pulls(redis_url: str) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY", "timeout_ms": 60_000}, queues=1) as (_, api):
        parked = asyncio.create_task(pull(api, linger_ms=10_000))
        samples = await until(api, "ddmq_parked_pulls", 1, group="g")
        assert value(samples, "ddmq_order_keys", group="g", topic="t") == 0
        assert "ddmq_action_duration_seconds_count" not in names(samples)  # no action ran yet: no series
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


@MODES
async def test_the_docs_name_every_exported_metric_and_no_other(redis_url: str, per_queue: bool) -> None:
    async with http_proxy(redis_url, queues=1, metrics={"per_queue": per_queue}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t", "x", key="k")
        await pull(api)
        assert (await api.call("GET", "/metrics"))[0] == 200
        exported = {family.name for family in service.metrics.registry.collect()}
    documented = {name.removesuffix("_total") for name in _documented_metrics()}
    if not per_queue:
        documented -= PER_QUEUE_ONLY
    ours = {name for name in exported if name.startswith("ddmq_")}
    assert ours == documented, (sorted(ours - documented), sorted(documented - ours))
    # prometheus-client's process and platform collectors, on the service's own registry
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_start_time_seconds"} <= exported
    assert exported - ours <= {name for name in exported if name.startswith(("process_", "python_"))}


@MODES
async def test_time_lag_dead_letter_length_and_unowned_queues(redis_url: str, per_queue: bool) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 0}
    # Queue 1 stays empty: per (group, topic) the lag is queue 0's, the age the older of the two.
    where = QUEUE if per_queue else TOPIC
    async with http_proxy(redis_url, config, queues=2, metrics={"per_queue": per_queue}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": "k", "value": f"v{i}", "qid": 0} for i in range(3)])
        produced_at = int(time.time() * 1000)
        samples = await until(api, "ddmq_lag_messages", 3, **where)
        if per_queue:
            assert value(samples, "ddmq_lag_seconds", group="g", topic="t", qid="1") == 0  # nothing produced there
        await asyncio.sleep(0.3)
        samples = await scrape(api)
        age = value(samples, "ddmq_lag_seconds", **where)
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
        samples = await until(api, "ddmq_lag_seconds", 0, **where)
        assert value(samples, "ddmq_lag_messages", **where) == 0
        # The counter keeps counting; the gauge follows the stream, also after a purge.
        status, _ = await api.call("POST", "/admin/groups/g/topics/t/dead-letters/purge", json={"all": True})
        assert status == 200
        samples = await until(api, "ddmq_dead_letters", 0, group="g", topic="t")
        assert value(samples, "ddmq_messages_dead_lettered_total", **where) == 1

        await service.groups["g"].stop_reading()  # as on shutdown: no claim loop takes the queues back
        await service.groups["g"].release_leases()
        samples = await until(api, "ddmq_queues_without_owner", 2, group="g", topic="t")


def folded(samples: Samples) -> Samples:
    """Per-queue samples folded to (group, topic) as the default mode exports them: sums, the max for
    the age of the oldest message, no offsets; action durations summed per (group, action)."""
    out: Samples = {}
    for (name, labels), number in samples.items():
        keyed = dict(labels)
        fine = "topic" if name.startswith("ddmq_action_duration_seconds") else "qid"
        if fine not in keyed:
            out[name, labels] = number
            continue
        if name in PER_QUEUE_ONLY:
            continue
        del keyed[fine]
        key = (name, frozenset(keyed.items()))
        out[key] = max(out.get(key, 0.0), number) if name == "ddmq_lag_seconds" else out.get(key, 0.0) + number
    return out


def engine_series(samples: Samples) -> Samples:
    """The engine's series: not the servers' connection counts, which a scrape itself moves, nor the
    trimmer's figures, which move with its rounds and the clock."""
    return {key: number for key, number in samples.items() if key[0].startswith("ddmq_")
            and not key[0].startswith(("ddmq_server_", "ddmq_retention_", "ddmq_stream_"))}


async def test_the_default_series_are_the_per_queue_ones_summed_and_a_reload_switches(redis_url: str) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 5, "retry_intervals_ms": [60_000]}
    async with http_proxy(redis_url, config, queues=4) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i % 8}", "value": f"v{i}", "qid": i % 4} for i in range(24)])
        await until(api, "ddmq_messages_unfinished", 24, **TOPIC)
        # Some acked, some failed (waiting 60 s for their retry), some in flight, the rest ready or waiting.
        for _ in range(3):
            batch = await pull(api, max_batch=4)
            offsets = [m["offset"] for m in batch["messages"]]
            await ack(api, success=offsets[:1], fail=offsets[1:2], qid=batch["qid"])
        await pull(api, max_batch=4)
        await until(api, "ddmq_messages_unfinished", 21, **TOPIC)

        per_topic = await scrape(api)
        began = time.time()
        change = await service.reload(service.config.model_copy(update={"metrics": MetricsConfig(per_queue=True)}))
        assert change.metrics and not change.needs_restart
        per_queue = await scrape(api)
        elapsed = time.time() - began
        await service.reload(service.config.model_copy(update={"metrics": MetricsConfig()}))
        back = await scrape(api)

    qids = {dict(labels).get("qid") for name, labels in per_queue if name == "ddmq_messages_delivered_total"}
    assert len(qids) >= 2, qids  # several queues were summed
    for name in ("ddmq_messages_in_flight", "ddmq_messages_ready", "ddmq_messages_retry_wait",
                 "ddmq_messages_failed_total", "ddmq_lag_messages"):
        assert value(per_topic, name, **TOPIC) > 0, name
    assert value(per_topic, "ddmq_queue_owned", **TOPIC) == 4
    assert value(per_queue, "ddmq_consume_offset", **QUEUE) >= 1

    expected, found = engine_series(folded(per_queue)), engine_series(per_topic)
    age = ("ddmq_lag_seconds", frozenset(TOPIC.items()))
    assert found[age] <= expected.pop(age) <= found.pop(age) + elapsed + 0.01
    assert found == expected
    assert not [labels for name, labels in back if "qid" in dict(labels)]


async def _one_message_per_queue(redis_url: str, api: ApiClient, queues: dict[str, int]) -> None:
    async with AsyncProducer(redis_url) as producer:
        for topic, count in queues.items():
            await producer.send_batch(topic, [{"key": f"k{q}", "value": "x", "qid": q} for q in range(count)])
    for topic, count in queues.items():
        received = 0
        while received < count:
            batch = await pull(api, topic=topic, max_batch=64)
            received += len(batch["messages"])
            results = [{"topic": topic, "qid": batch["qid"], "success": [m["offset"] for m in batch["messages"]]}]
            assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": results}))[0] == 200


@MODES
async def test_the_series_of_a_topic_do_not_grow_with_its_queues_by_default(redis_url: str, per_queue: bool) -> None:
    queues = {"few": 2, "many": 16}
    topics = {topic: {"queues": count} for topic, count in queues.items()}
    groups = {"g": {topic: {"order_key": "KEY"} for topic in queues}}
    metrics = {"per_queue": per_queue}
    async with http_proxy(redis_url, topics=topics, groups=groups, metrics=metrics) as (_, api):
        await _one_message_per_queue(redis_url, api, queues)
        samples = await until(api, "ddmq_messages_acked_total", 16 if not per_queue else 1,
                              group="g", topic="many", **({"qid": "15"} if per_queue else {}))
    # The retention series come and go with the trimmer's rounds (a group holding a trim back): left out.
    series = {topic: [(name, labels) for name, labels in samples if dict(labels).get("topic") == topic
                      and not name.startswith("ddmq_retention_")] for topic in queues}
    per_queue_names = {name for name, labels in series["few"] if "qid" in dict(labels)}
    if per_queue:
        assert len(per_queue_names) == 22  # 12 counters of the pull buffer, 10 gauges and counters of a queue
        assert len(series["many"]) - len(series["few"]) == (16 - 2) * len(per_queue_names)
    else:
        assert not per_queue_names
        assert len(series["many"]) == len(series["few"]) > 40
