"""LatencyHistogram and PullTimers, the accumulators the hot path observes into."""

from __future__ import annotations

from ddmq.proxy.core.types import PullBatch, QueueId, StoredMessage
from ddmq.proxy.ops.latency import LatencyHistogram, PullTimers

BATCH = PullBatch(QueueId("t", 0), [StoredMessage(1, b"", "k", "", {}, 0)])
EMPTY = PullBatch(None, [])


def test_a_histogram_counts_each_duration_in_its_bucket() -> None:
    histogram = LatencyHistogram([0.01, 0.001])
    for seconds in (0.0005, 0.001, 0.002, 5.0):
        histogram.observe(seconds)
    assert histogram.buckets() == [("0.001", 2), ("0.01", 3), ("+Inf", 4)]
    assert abs(histogram.total - 5.0035) < 1e-9


def test_pull_timers_keep_one_histogram_per_group_and_outcome() -> None:
    timers = PullTimers([0.001, 1.0])
    timers.observe("g", BATCH, 0.0005)
    timers.observe("g", BATCH, 0.5)
    timers.observe("g", EMPTY, 2.0)
    timers.observe("h", EMPTY, 0.5)
    assert sorted(timers.histograms) == [("g", "empty"), ("g", "messages"), ("h", "empty")]
    assert timers.histograms["g", "messages"].buckets() == [("0.001", 1), ("1.0", 2), ("+Inf", 2)]
    assert timers.histograms["g", "empty"].buckets() == [("0.001", 0), ("1.0", 0), ("+Inf", 1)]
    assert timers.histograms["h", "empty"].counts == [0, 1, 0]
