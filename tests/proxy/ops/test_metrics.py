"""/metrics: the Prometheus series move as messages are read, pulled, acked, failed, timed out,
retried and dead-lettered; by default a few families per (group, topic) and the rest per group or
per proxy, with ``metrics.per_queue`` the queue-level ones per queue and the others per (group, topic).
Scraped over real HTTP and parsed with prometheus-client's parser."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from prometheus_client.parser import text_string_to_metric_families

from ddmq.config.schema import MetricsConfig
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys
from ddmq.proxy.ops.latency import LatencyHistogram
from ddmq.proxy.ops.metrics import TOPIC_COUNTS_PER_CALL, ProxyMetrics, _topic_counts_per_key

from ...http_support import ApiClient
from ..servers.test_http_api import eventually, http_proxy, pull

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

QUEUE = {"group": "g", "topic": "t", "qid": "0"}
TOPIC = {"group": "g", "topic": "t"}
GROUP = {"group": "g"}
#: Families that only exist per queue: an offset has no sum.
PER_QUEUE_ONLY = {"ddmq_consume_offset", "ddmq_produce_offset"}
#: Exported only while a topic has tenants (``fair_key``).
TENANTS_ONLY = {"ddmq_tenants", "ddmq_tenant_messages", "ddmq_tenant_held_keys", "ddmq_tenant_share"}
#: The queue-level families: a ``qid`` label with ``per_queue``.
QUEUE_LEVEL = {
    *(f"ddmq_messages_{name}" for name in ("delivered", "acked", "failed", "timed_out", "retried", "dead_lettered",
                                           "released", "extended", "in_flight", "ready", "retry_wait", "unfinished")),
    "ddmq_acks_unknown", "ddmq_fails_unknown", "ddmq_acks_late", "ddmq_verbs_ignored", "ddmq_queue_owned",
    "ddmq_lag_messages", "ddmq_lag_seconds", "ddmq_queue_rollbacks", *PER_QUEUE_ONLY,
}
#: What keeps the ``topic`` label by default (what the dashboard and the alerts follow per topic).
DEFAULT_PER_TOPIC = {"ddmq_lag_messages", "ddmq_lag_seconds", "ddmq_messages_in_flight", "ddmq_messages_delivered",
                     "ddmq_messages_acked", "ddmq_messages_failed", "ddmq_messages_dead_lettered",
                     "ddmq_breaker_open"}  # a breaker is per topic in both modes: it judges a topic, not a queue
#: Without ``group`` and ``topic`` by default: distributions (a series per bucket), the counters of
#: client verbs the proxy ignores or takes as a hint.
DEFAULT_PER_PROXY = {"ddmq_order_chain_length", "ddmq_action_duration_seconds", "ddmq_pull_duration_seconds",
                     "ddmq_fails_unknown", "ddmq_acks_late", "ddmq_messages_released", "ddmq_messages_extended",
                     "ddmq_verbs_ignored"}
#: Per group with ``per_queue`` (and per proxy by default).
GROUP_LEVEL = {"ddmq_pull_duration_seconds"}
MODES = pytest.mark.parametrize("per_queue", [False, True], ids=["per_topic", "per_queue"])


def family_of(sample: str) -> str:
    """The family a sample line belongs to (``x_total`` -> ``x``, ``x_bucket`` -> ``x``, ...)."""
    for suffix in ("_total", "_bucket", "_gcount", "_gsum", "_count", "_sum"):
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample


def at(name: str, per_queue: bool) -> dict[str, str]:
    """The labels of (group g, topic t, queue 0)'s series of ``name`` (a sample or family name) in
    the mode, the families' extra labels (``event``, ``state``, ``le``) left out."""
    family = family_of(name)
    if per_queue:
        return QUEUE if family in QUEUE_LEVEL else GROUP if family in GROUP_LEVEL else TOPIC
    return TOPIC if family in DEFAULT_PER_TOPIC else {} if family in DEFAULT_PER_PROXY else GROUP


def of(samples: Samples, per_queue: bool, name: str, **labels: str) -> float:
    """Group g, topic t, queue 0's series of engine family ``name`` with the mode's labels."""
    return value(samples, name, **at(name, per_queue), **labels)


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


async def until_at(api: ApiClient, name: str, expected: float, **labels: str) -> Samples:
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

    async def until(api: ApiClient, name: str, expected: float) -> Samples:
        return await until_at(api, name, expected, **at(name, per_queue))

    async with http_proxy(redis_url, config, queues=1, metrics={"per_queue": per_queue}) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"value": f"v{i}"} for i in range(10)])

        samples = await until(api, "ddmq_messages_ready", 10)
        assert of(samples, per_queue, "ddmq_messages_unfinished") == 10
        assert of(samples, per_queue, "ddmq_queue_owned") == 1
        if per_queue:
            assert of(samples, per_queue, "ddmq_produce_offset") == 11
            assert of(samples, per_queue, "ddmq_consume_offset") == 1
        else:
            assert not names(samples) & PER_QUEUE_ONLY
            assert not [labels for name, labels in samples if name.startswith("ddmq_") and "qid" in dict(labels)]
        assert of(samples, per_queue, "ddmq_lag_messages") == 10
        # Action durations per action by default: the same code runs for every group and topic.
        for action in ("Json", "Order", "PullServer"):
            assert of(samples, per_queue, "ddmq_action_duration_seconds_count", action=action) == 10, action
        assert of(samples, per_queue, "ddmq_consumer_events_total", event="read") == 10

        batch = await pull(api, max_batch=10)
        offsets = [m["offset"] for m in batch["messages"]]
        assert len(offsets) == 10
        samples = await scrape(api)
        assert of(samples, per_queue, "ddmq_messages_delivered_total") == 10
        assert of(samples, per_queue, "ddmq_messages_in_flight") == 10
        assert of(samples, per_queue, "ddmq_messages_ready") == 0
        assert of(samples, per_queue, "ddmq_pull_duration_seconds_count", result="messages") == 1

        # 4 acked, 3 failed (retried after 10 ms), 3 left to time out (300 ms) and be retried too.
        await ack(api, success=offsets[:4], fail=offsets[4:7])
        samples = await until(api, "ddmq_messages_retried_total", 6)
        assert of(samples, per_queue, "ddmq_messages_acked_total") == 4
        assert of(samples, per_queue, "ddmq_messages_failed_total") == 3
        assert of(samples, per_queue, "ddmq_messages_timed_out_total") == 3
        assert of(samples, per_queue, "ddmq_messages_ready") == 6
        assert of(samples, per_queue, "ddmq_messages_in_flight") == 0
        assert of(samples, per_queue, "ddmq_messages_unfinished") == 6

        # Second attempt of the 6 fails: max_retry 1 is used up, so they are dead-lettered.
        batch = await pull(api, max_batch=10)
        assert sorted(m["offset"] for m in batch["messages"]) == sorted(offsets[4:])
        await ack(api, fail=[m["offset"] for m in batch["messages"]])
        samples = await until(api, "ddmq_messages_dead_lettered_total", 6)
        assert of(samples, per_queue, "ddmq_messages_delivered_total") == 16
        assert of(samples, per_queue, "ddmq_messages_failed_total") == 9
        samples = await until(api, "ddmq_lag_messages", 0)
        if per_queue:
            assert of(samples, per_queue, "ddmq_consume_offset") == 11
        assert of(samples, per_queue, "ddmq_messages_unfinished") == 0

        # Acks nobody can match are counted, never an error.
        await ack(api, success=[offsets[0]])
        await ack(api, fail=[offsets[0]], qid=99)
        samples = await scrape(api)
        assert of(samples, per_queue, "ddmq_acks_unknown_total") == 1
        assert value(samples, "ddmq_proxy_events_total", event="unknown_results") == 1


@MODES
async def test_order_chains_and_parked_pulls(redis_url: str, per_queue: bool) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000}
    async with http_proxy(redis_url, config, queues=1, metrics={"per_queue": per_queue}) as (_, api):
        parked = asyncio.create_task(pull(api, linger_ms=10_000))
        samples = await until_at(api, "ddmq_parked_pulls", 1, group="g")
        assert of(samples, per_queue, "ddmq_order_keys") == 0
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
        assert value(samples, "ddmq_parked_pulls", group="g") == 0
        assert of(samples, per_queue, "ddmq_order_keys") == 2
        assert of(samples, per_queue, "ddmq_order_waiting_messages") == 2
        assert of(samples, per_queue, "ddmq_order_chain_length_max") == 3
        # The distribution of chain lengths: per (group, topic) with per_queue, per proxy by default.
        assert of(samples, per_queue, "ddmq_order_chain_length_bucket", le="1.0") == 1
        assert of(samples, per_queue, "ddmq_order_chain_length_bucket", le="2.0") == 1
        assert of(samples, per_queue, "ddmq_order_chain_length_bucket", le="4.0") == 2
        assert of(samples, per_queue, "ddmq_order_chain_length_gcount") == 2
        assert of(samples, per_queue, "ddmq_topic_unfinished_messages") == 4
        assert of(samples, per_queue, "ddmq_keys", state="in_flight") == 2


@MODES
async def test_tenant_series(redis_url: str, per_queue: bool) -> None:
    # Tenants by message key, each key its own order key: "a" holds 4 messages in memory, its share of a
    # window of 10 with "b" beside it being 10 * 7/8 * 1 / 2 = 4; its fifth waits in Redis.
    config = {"order_key": "KEY", "fair_key": "KEY", "concurrency": 10, "timeout_ms": 60_000}
    async with http_proxy(redis_url, config, queues=1, metrics={"per_queue": per_queue}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": key, "value": key} for key in ["b"] + ["a"] * 5])
        samples = await until_at(api, "ddmq_held_messages", 1, **at("ddmq_held_messages", per_queue))
        assert value(samples, "ddmq_tenants", group="g", topic="t") == 2
        assert value(samples, "ddmq_tenant_messages", group="g", topic="t", tenant="a") == 4
        assert value(samples, "ddmq_tenant_held_keys", group="g", topic="t", tenant="a") == 1
        assert value(samples, "ddmq_tenant_share", group="g", topic="t", tenant="a") == 4
        assert value(samples, "ddmq_tenant_held_keys", group="g", topic="t", tenant="b") == 0
        exported = {family.name for family in service.metrics.registry.collect()}
    assert TENANTS_ONLY <= exported and TENANTS_ONLY <= _documented_metrics()


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
    # A histogram's buckets named in a query (histogram_quantile over ``<name>_bucket``) name the histogram.
    documented = {name.removesuffix("_total").removesuffix("_bucket") for name in _documented_metrics()}
    if not per_queue:
        documented -= PER_QUEUE_ONLY
    documented -= TENANTS_ONLY  # (test_tenant_series)
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
    # Read from Redis per (group, topic): per group by default.
    redis_figures = TOPIC if per_queue else GROUP
    async with http_proxy(redis_url, config, queues=2, metrics={"per_queue": per_queue}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": "k", "value": f"v{i}", "qid": 0} for i in range(3)])
        produced_at = int(time.time() * 1000)
        samples = await until_at(api, "ddmq_lag_messages", 3, **where)
        if per_queue:
            assert value(samples, "ddmq_lag_seconds", group="g", topic="t", qid="1") == 0  # nothing produced there
        await asyncio.sleep(0.3)
        samples = await scrape(api)
        age = value(samples, "ddmq_lag_seconds", **where)
        assert 0.3 <= age <= (time.time() * 1000 - produced_at) / 1000 + 1, age
        assert value(samples, "ddmq_queues_without_owner", **redis_figures) == 0
        assert value(samples, "ddmq_dead_letters", **redis_figures) == 0

        head = await pull(api, max_batch=10)
        assert [m["value_text"] for m in head["messages"]] == ["v0"]
        await ack(api, fail=[head["messages"][0]["offset"]])  # max_retry 0: dead-lettered at once
        await until_at(api, "ddmq_dead_letters", 1, **redis_figures)
        second = await pull(api, max_batch=10)
        assert [m["value_text"] for m in second["messages"]] == ["v1"]
        await ack(api, success=[second["messages"][0]["offset"]])
        await ack(api, success=[(await pull(api, max_batch=10))["messages"][0]["offset"]])
        samples = await until_at(api, "ddmq_lag_seconds", 0, **where)
        assert value(samples, "ddmq_lag_messages", **where) == 0
        # The counter keeps counting; the gauge follows the stream, also after a purge.
        status, _ = await api.call("POST", "/admin/groups/g/topics/t/dead-letters/purge", json={"all": True})
        assert status == 200
        samples = await until_at(api, "ddmq_dead_letters", 0, **redis_figures)
        assert value(samples, "ddmq_messages_dead_lettered_total", **where) == 1

        await service.groups["g"].stop_reading()  # as on shutdown: no claim loop takes the queues back
        await service.groups["g"].release_leases()
        samples = await until_at(api, "ddmq_queues_without_owner", 2, **redis_figures)


async def test_dead_letter_lengths_and_held_leases_are_counted_per_group_and_topic_across_script_calls(
    redis_client: aioredis.Redis,
) -> None:
    # More (group, topic) pairs than one script call takes, of different sizes, some with dead letters
    # and some leases held: each pair's counts, in the order asked, the same as one command per key.
    pairs = 2 * TOPIC_COUNTS_PER_CALL + 37
    topics = {(f"g{i % 7}", f"t{i}"): 1 + i % 5 for i in range(pairs)}
    expected = []
    for i, ((group, topic), queues) in enumerate(topics.items()):
        dead = i % 3
        for n in range(dead):
            await redis_client.xadd(keys.dead_letters(group, topic), {"n": str(n)})
        held = [qid for qid in range(queues) if (i + qid) % 4 == 0]
        for qid in held:
            await redis_client.set(keys.lease(group, topic, qid), "p1 1")
        expected.append((group, topic, dead, queues - len(held)))
    scripted = await ProxyMetrics._topic_figures(redis_client, topics)
    assert list(scripted) == list(topics)
    assert [(g, t, f.dead_letters, f.unowned_queues) for (g, t), f in scripted.items()] == expected
    # A Cluster's way (a command per key), run here on one Redis, agrees.
    per_key = await _topic_counts_per_key(redis_client, topics)
    counted = zip(topics.items(), per_key, strict=True)
    assert [(g, t, dead, queues - held) for ((g, t), queues), (dead, held) in counted] == expected


def folded(samples: Samples) -> Samples:
    """Per-queue samples folded to the default mode's labels: sums (the max for the age of the oldest
    message and the longest key chain), no offsets."""
    out: Samples = {}
    for (name, labels), number in samples.items():
        family = family_of(name)
        if family in PER_QUEUE_ONLY:
            continue
        keep = set(at(family, False)) | {label for label, _ in labels} - {"group", "topic", "qid"}
        key = (name, frozenset((label, text) for label, text in labels if label in keep))
        if family in ("ddmq_lag_seconds", "ddmq_order_chain_length_max"):
            out[key] = max(out.get(key, 0.0), number)
        else:
            out[key] = out.get(key, 0.0) + number
    return out


def engine_series(samples: Samples) -> Samples:
    """The engine's series: not the servers' connection counts, which a scrape itself moves, nor the
    trimmer's figures, which move with its rounds and the clock, nor the link's and the clock's."""
    return {key: number for key, number in samples.items() if key[0].startswith("ddmq_")
            and not key[0].startswith(("ddmq_server_", "ddmq_retention_", "ddmq_stream_", *LINK_FAMILIES))}


async def test_the_default_series_are_the_per_queue_ones_summed_and_a_reload_switches(redis_url: str) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000, "max_retry": 5, "retry_intervals_ms": [60_000]}
    queues = {"t": 4, "u": 2}
    topics = {topic: {"queues": count} for topic, count in queues.items()}
    groups = {"g": {topic: config for topic in queues}}
    async with http_proxy(redis_url, topics=topics, groups=groups) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            for topic, count in queues.items():
                await producer.send_batch(
                    topic, [{"key": f"k{i % 8}", "value": f"v{i}", "qid": i % count} for i in range(24)])
        await until_at(api, "ddmq_messages_unfinished", 48, **GROUP)
        # Some acked, some failed (waiting 60 s for their retry), some in flight, the rest ready or waiting.
        for topic in queues:
            for _ in range(3):
                batch = await pull(api, topic=topic, max_batch=4)
                offsets = [m["offset"] for m in batch["messages"]]
                results = [{"topic": topic, "qid": batch["qid"], "success": offsets[:1], "fail": offsets[1:2]}]
                assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": results}))[0] == 200
            await pull(api, topic=topic, max_batch=4)
        await until_at(api, "ddmq_messages_unfinished", 42, **GROUP)

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
    for topic in queues:
        for name in ("ddmq_messages_in_flight", "ddmq_messages_failed_total", "ddmq_lag_messages"):
            assert value(per_topic, name, group="g", topic=topic) > 0, (name, topic)
    for name in ("ddmq_messages_ready", "ddmq_messages_retry_wait", "ddmq_messages_timed_out_total"):
        assert (name, frozenset(GROUP.items())) in per_topic, name
    assert value(per_topic, "ddmq_messages_retry_wait", **GROUP) > 0
    assert value(per_topic, "ddmq_queue_owned", **GROUP) == 6
    assert value(per_queue, "ddmq_consume_offset", **QUEUE) >= 1

    expected, found = engine_series(folded(per_queue)), engine_series(per_topic)
    for topic in queues:
        age = ("ddmq_lag_seconds", frozenset({"group": "g", "topic": topic}.items()))
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


#: The proxy's link to Redis, its clock and its tasks (proxy/ops/link.py): per process in both modes.
LINK_FAMILIES = ("ddmq_redis_reachable", "ddmq_redis_failures", "ddmq_redis_slow_rounds", "ddmq_redis_round_seconds",
                 "ddmq_clock_", "ddmq_loop_stalls", "ddmq_task_restarts")
#: Families whose labels are the same in both modes.
SAME_IN_BOTH = ("ddmq_parked_pulls", "ddmq_proxy_events", "ddmq_server_",
                "ddmq_build_info", "ddmq_redis_", "ddmq_retention_", "ddmq_stream_", *LINK_FAMILIES)


@MODES
async def test_the_series_of_a_topic_do_not_grow_with_its_queues_by_default(redis_url: str, per_queue: bool) -> None:
    queues = {"few": 2, "many": 16}
    topics = {topic: {"queues": count} for topic, count in queues.items()}
    groups = {"g": {topic: {"order_key": "KEY"} for topic in queues}}
    metrics = {"per_queue": per_queue}
    async with http_proxy(redis_url, topics=topics, groups=groups, metrics=metrics) as (_, api):
        await _one_message_per_queue(redis_url, api, queues)
        samples = await until_at(api, "ddmq_messages_acked_total", 16 if not per_queue else 1,
                                 group="g", topic="many", **({"qid": "15"} if per_queue else {}))
    # The retention series come and go with the trimmer's rounds (a group holding a trim back): left out.
    series = {topic: sorted((name, labels) for name, labels in samples if dict(labels).get("topic") == topic
                            and "group" in dict(labels) and not name.startswith("ddmq_retention_"))
              for topic in queues}
    per_queue_names = {name for name, labels in series["few"] if "qid" in dict(labels)}
    if per_queue:
        assert len(per_queue_names) == 22  # 12 counters of the pull buffer, 10 gauges and counters of a queue
        assert len(series["many"]) - len(series["few"]) == (16 - 2) * len(per_queue_names)
    else:
        assert not per_queue_names
        # One series per family that keeps the topic by default, whatever the queues.
        assert sorted(family_of(name) for name, _ in series["few"]) == sorted(DEFAULT_PER_TOPIC)
        assert len(series["many"]) == len(series["few"])
    # Every engine family has the mode's labels (besides its own: event, state, action, le).
    wrong = {(name, tuple(sorted(found))) for name, labels in samples
             if name.startswith("ddmq_") and not name.startswith(SAME_IN_BOTH)
             and (found := {label for label, _ in labels} & {"group", "topic", "qid"}) != set(at(name, per_queue))}
    assert not wrong, sorted(wrong)
