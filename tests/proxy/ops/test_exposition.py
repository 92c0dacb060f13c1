"""render() writes the engine's families byte for byte as prometheus-client's generate_latest writes the
same families (Family.metric()): for hand-made families with every kind and awkward labels, and for
what a real proxy exports in both label modes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.ops.exposition import COUNTER, GAUGE, GAUGE_HISTOGRAM, HISTOGRAM, Family, render

from ..servers.test_http_api import http_proxy, pull


class _Families(Collector):
    def __init__(self, families: list[Family]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return (family.metric() for family in self.families)


def reference(families: list[Family]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()


def test_every_kind_and_awkward_label_values_render_as_prometheus_client_does() -> None:
    odd = ('quote"d', "back\\slash", "new\nline", "plain")
    counter = Family("x_events", COUNTER, 'Events; a "quoted" help \\ with a\nnewline.', ["topic", "event", "group"])
    for index, value in enumerate(odd):
        counter.add_metric([value, "e", "g"], index)
    gauge = Family("x_level", GAUGE, "Levels.", ["qid"])
    for number in (0, 1, 2.5, 999_999, 1_000_000, 1_234_567, 10**7, 10**17, 1e-7, 3e20, float("inf"),
                   float("-inf"), float("nan"), -3, -(10**16), -0.5):
        gauge.add_metric([str(number)], number)
    unlabelled = Family("x_one", GAUGE, "One.")
    unlabelled.add_metric([], 42)
    empty = Family("x_none", COUNTER, "Nothing yet.", ["group"])
    buckets = [("0.001", 1.0), ("0.1", 3.0), ("+Inf", 4.0)]
    histograms = []
    for labels in (["action", "group", "topic"], ["a"], ["z"], []):  # le last, first and between
        histogram = Family(f"x_seconds_{len(labels)}{labels[0] if labels else ''}", HISTOGRAM, "Durations.", labels)
        histogram.add_histogram([f"v{i}" for i in range(len(labels))], buckets, 0.25)
        histogram.add_histogram([f'w"{i}' for i in range(len(labels))], buckets, 0.5)
        histograms.append(histogram)
    chains = Family("x_chain_length", GAUGE_HISTOGRAM, "Chains.", ["group", "topic"])
    chains.add_histogram(["g", "t1"], [("1.0", 2), ("+Inf", 3)], 7)
    chains.add_histogram(["g", "t2"], [("1.0", 0), ("+Inf", 0)], 0)
    families = [counter, gauge, unlabelled, empty, *histograms, chains]
    assert render(families) == reference(families)


def test_a_family_refuses_an_unknown_kind() -> None:
    with pytest.raises(ValueError, match="summary"):
        Family("x", "summary", "no")


@pytest.mark.parametrize("per_queue", [False, True], ids=["per_topic", "per_queue"])
async def test_a_real_proxys_families_render_as_prometheus_client_does(redis_url: str, per_queue: bool) -> None:
    config = {"order_key": "KEY", "timeout_ms": 60_000}
    async with http_proxy(redis_url, config, queues=4, metrics={"per_queue": per_queue}) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i}", "value": "x"} for i in range(20)])
        await pull(api, max_batch=5)
        await service.metrics.refresh()
        families = service.metrics.collector.families()
        text = service.metrics.render().decode()
    assert render(families) == reference(families)
    assert sum(len(family.rows) + len(family.histograms) for family in families) > 50
    # The whole body: the engine's families first (the pull histogram too), then prometheus-client's own.
    parsed = {family.name for family in text_string_to_metric_families(text)}
    assert {"ddmq_lag_messages", "ddmq_pull_duration_seconds", "process_cpu_seconds"} <= parsed
    assert text.startswith(render(families)[:200])
