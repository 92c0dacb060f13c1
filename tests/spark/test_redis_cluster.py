"""``format("ddmq")`` in both modes against proxies on a real Redis Cluster (conftest ``redis_cluster``).

The source talks to the proxies only; what changes underneath is the proxy's ``fetch`` (one read per
slot, gathered), its positions and offsets spread over three masters. Small on purpose: the other
Spark tests cover the modes themselves."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support import ProxyProcess
from .helpers import Collector, drained, positions, produce

KEYS, PER_KEY = 300, 4


@pytest.fixture
def cluster_proxy(tmp_path: Path, cluster_url: str) -> Iterator[ProxyProcess]:
    process = ProxyProcess(
        tmp_path, cluster_url,
        groups={"g": {"t": {"order_key": "KEY", "max_pull_batch_size": 1000, "timeout_ms": 30000}}},
        topics={"t": {"queues": 8}}, commit_interval_ms=100, shutdown_grace_ms=0,
    ).start()
    try:
        yield process
    finally:
        process.stop()


def run_available_now(spark: Any, proxy: ProxyProcess, checkpoint: Path, collector: Collector, **options: str) -> None:
    reader = spark.readStream.format("ddmq").option("servers", f"127.0.0.1:{proxy.port}").option("group", "g")
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (reader.load().writeStream.foreachBatch(collector).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert not query.isActive


def assert_in_order_exactly_once(collector: Collector, produced: dict[str, int]) -> None:
    checker = collector.check()
    assert checker.violations == [] and checker.duplicates == 0
    assert checker.missing(produced) == {}
    assert collector.count == sum(produced.values())


@pytest.mark.timeout(240)
def test_queue_mode_on_a_cluster(spark: Any, cluster_proxy: ProxyProcess, cluster_url: str, tmp_path: Path) -> None:
    produced = produce(cluster_url, KEYS, PER_KEY)
    collector = Collector()
    run_available_now(spark, cluster_proxy, tmp_path / "checkpoint", collector, mode="queue",
                      maxMessagesPerTrigger="500")
    assert len(collector.batches) >= 2
    # no per-key gate in this mode: a batch may hold several messages of a key, in queue order
    by_qid: dict[int, list[int]] = defaultdict(list)
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, rows in sorted(collector.batches, key=lambda item: item[0]):
        for key, seq, qid, offset in rows:
            by_qid[qid].append(offset)
            by_key[key].append(seq)
    assert by_key == {key: list(range(count)) for key, count in produced.items()}
    produced_offsets = {int(qid): end - 1 for (_, qid), (_, end) in positions(cluster_proxy).items()}
    assert dict(by_qid) == {qid: list(range(1, last + 1)) for qid, last in produced_offsets.items() if last}


@pytest.mark.timeout(240)
def test_pull_mode_on_a_cluster(spark: Any, cluster_proxy: ProxyProcess, cluster_url: str, tmp_path: Path) -> None:
    produced = produce(cluster_url, KEYS, PER_KEY)
    collector = Collector()
    run_available_now(spark, cluster_proxy, tmp_path / "checkpoint", collector, numPartitions="2")
    assert_in_order_exactly_once(collector, produced)
    assert drained(cluster_proxy)
