"""``format("ddmq")`` in pull mode on a real local Spark, a real proxy process and a real Redis.

20,000 messages over 2,000 keys (10 per key), unless a test says otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..support import ProxyProcess
from .helpers import Collector, drained, owners, produce, wait_until

KEYS, PER_KEY = 2000, 10
TOTAL = KEYS * PER_KEY


def stream(spark: Any, proxy: ProxyProcess, **options: str) -> Any:
    reader = spark.readStream.format("ddmq").option("servers", f"127.0.0.1:{proxy.port}").option("group", "g")
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def assert_exactly_once_in_order(collector: Collector, produced: dict[str, int]) -> None:
    checker = collector.check()
    assert checker.violations == []
    assert checker.missing(produced) == {}
    assert checker.duplicates == 0
    assert collector.count == sum(produced.values())


@pytest.mark.timeout(300)
def test_available_now_delivers_everything_in_key_order_and_acks_it(
    spark: Any, proxy: ProxyProcess, redis_url: str, tmp_path: Path
) -> None:
    produced = produce(redis_url, KEYS, PER_KEY)
    collector = Collector()
    query = (
        stream(spark, proxy, numPartitions="3")
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert not query.isActive
    assert_exactly_once_in_order(collector, produced)
    # The last data batch was acked before the query ended: nothing left in flight or unacked.
    assert drained(proxy)


@pytest.mark.timeout(300)
def test_a_keys_backlog_moves_in_one_micro_batch_across_the_pulls_of_its_partition(
    spark: Any, proxy: ProxyProcess, redis_url: str, tmp_path: Path
) -> None:
    # 1,000 messages, 10 per key; a pull carries 50. A partition's first pulls fill up with heads and
    # short runs; its later pulls continue the runs of the keys it holds. Were a key's run limited to
    # the pull that carried its head, the backlog would take three or more micro-batches.
    produced = produce(redis_url, 100, 10)
    collector = Collector()
    query = (
        stream(spark, proxy, numPartitions="2", maxBatchSize="50", pullsPerPartition="40")
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert not query.isActive
    assert_exactly_once_in_order(collector, produced)
    assert [batch_id for batch_id, rows in collector.batches if rows] == [0], [
        (batch_id, len(rows)) for batch_id, rows in collector.batches
    ]
    assert drained(proxy)


@pytest.mark.timeout(300)
def test_processing_time_trigger_with_a_read_limit(
    spark: Any, proxy: ProxyProcess, redis_url: str, tmp_path: Path
) -> None:
    produced = produce(redis_url, KEYS, PER_KEY)
    collector = Collector()
    query = (
        stream(spark, proxy, maxMessagesPerTrigger="1500")
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: collector.count >= TOTAL and drained(proxy), 240, "every message in the sink and acked")
    finally:
        query.stop()
    assert_exactly_once_in_order(collector, produced)
    assert max(len(rows) for _, rows in collector.batches) <= 1500


@pytest.mark.timeout(300)
def test_a_failed_batch_is_replayed_from_the_checkpoint_with_the_same_rows(
    spark: Any, proxy: ProxyProcess, redis_url: str, tmp_path: Path
) -> None:
    produced = produce(redis_url, KEYS, PER_KEY)
    collector = Collector(fail_batches={3})
    checkpoint = str(tmp_path / "checkpoint")

    def run() -> Any:
        return (
            stream(spark, proxy)
            .writeStream.foreachBatch(collector)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    query = run()
    with pytest.raises(Exception, match="sink fails batch 3 once"):
        query.awaitTermination(240)
    assert not drained(proxy)  # the failed batch's messages are still leased, unacked
    query = run()  # restart from the checkpoint: batch 3 runs again
    query.awaitTermination(240)
    assert_exactly_once_in_order(collector, produced)
    rerun = dict(collector.batches)[3]
    assert rerun and sorted(rerun) == sorted(collector.failed[3])  # the lease replayed the very same messages
    assert drained(proxy)


@pytest.mark.timeout(300)
def test_two_proxies_each_partition_replays_from_its_own_server(spark: Any, redis_url: str, tmp_path: Path) -> None:
    """The group's queues are split between two proxies; leases live on the proxy that served them."""
    leases = {"ttl_ms": 2000, "renew_ms": 500, "claim_interval_ms": 100}
    groups = {"g": {"t": {"order_key": "KEY", "max_pull_batch_size": 1000}}}
    proxies = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        proxies.append(
            ProxyProcess(
                tmp_path / name,
                redis_url,
                groups=groups,
                topics={"t": {"queues": 8}},
                instance_id=name,
                leases=leases,
                commit_interval_ms=100,
                shutdown_grace_ms=0,
            ).start()
        )
    try:
        wait_until(lambda: set(owners(proxies[0]).values()) == {"a", "b"}, 30, "both proxies to own queues")
        produced = produce(redis_url, 1000, 5)
        collector = Collector(fail_batches={2})
        checkpoint = str(tmp_path / "checkpoint")

        def run() -> Any:
            return (
                spark.readStream.format("ddmq")
                .option("servers", ",".join(f"127.0.0.1:{p.port}" for p in proxies))
                .option("group", "g")
                .option("numPartitions", "4")
                .load()
                .writeStream.foreachBatch(collector)
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )

        query = run()
        with pytest.raises(Exception, match="sink fails batch 2 once"):
            query.awaitTermination(240)
        query = run()
        query.awaitTermination(240)
        assert_exactly_once_in_order(collector, produced)
        assert {qid for _, _, qid, _ in collector.failed[2]} and sorted(dict(collector.batches)[2]) == sorted(
            collector.failed[2]
        )
        wait_until(lambda: all(drained(p) for p in proxies), 30, "every message acked on both proxies")
    finally:
        for process in proxies:
            process.stop()
