"""``format("ddmq")`` in queue mode (offset ranges through ``fetch``) on real Spark, proxy and Redis."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ddmq.client.thrift_client import ProxyClient
from ddmq.protocol.wire import FetchRequest

from ..support import ProxyProcess
from .helpers import Collector, positions, produce

KEYS, PER_KEY = 2000, 10


def options(proxy: ProxyProcess, **extra: str) -> dict[str, str]:
    return {"servers": f"127.0.0.1:{proxy.port}", "group": "g", "mode": "queue", **extra}


def stored_positions(proxy: ProxyProcess) -> dict[tuple[str, str], int]:
    with ProxyClient("127.0.0.1", proxy.port) as client:
        response = client.fetch(FetchRequest(consumerId="test", groupId="g", cluster="x", maxBatchSize=0))
    return {(r.topic or "", r.qid or ""): r.nextRequestOffset or 0 for r in response.results or []}


def assert_exact_queue_order(batches: list[tuple[int, list[tuple[str, int, int, int]]]], proxy: ProxyProcess) -> None:
    """Every produced offset exactly once, per qid in offset order across and within batches; every key's
    seqs in order."""
    by_qid: dict[int, list[int]] = defaultdict(list)
    by_key: dict[str, list[int]] = defaultdict(list)
    for _, rows in sorted(batches, key=lambda item: item[0]):
        for key, seq, qid, offset in rows:
            by_qid[qid].append(offset)
            by_key[key].append(seq)
    produced = {int(qid): produce - 1 for (_, qid), (_, produce) in positions(proxy).items()}
    assert {qid: offsets for qid, offsets in by_qid.items()} == {
        qid: list(range(1, last + 1)) for qid, last in produced.items() if last
    }
    assert all(seqs == list(range(PER_KEY)) for seqs in by_key.values()) and len(by_key) == KEYS


@pytest.mark.timeout(300)
def test_queue_mode_stream_is_exactly_once_in_order_across_a_restart(
    spark: Any, proxy: ProxyProcess, redis_url: str, tmp_path: Path
) -> None:
    produce(redis_url, KEYS, PER_KEY)
    collector = Collector(fail_batches={2})
    checkpoint = str(tmp_path / "checkpoint")

    def run() -> Any:
        return (
            spark.readStream.format("ddmq")
            .options(**options(proxy, maxMessagesPerTrigger="4000"))
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
    assert len(collector.batches) >= 5  # the read limit split the backlog
    assert max(len(rows) for _, rows in collector.batches) <= 4000
    assert sorted(dict(collector.batches)[2]) == sorted(collector.failed[2])  # the rerun read the same range
    assert_exact_queue_order(collector.batches, proxy)
    # Progress is stored as the group's fetch positions: a new query would start after everything.
    assert stored_positions(proxy) == {key: produce for key, (_, produce) in positions(proxy).items()}


@pytest.mark.timeout(300)
def test_batch_reads_resume_where_the_ack_writer_left_off(spark: Any, proxy: ProxyProcess, redis_url: str) -> None:
    produce(redis_url, KEYS, PER_KEY)
    batches = []
    for run in range(10):
        df = spark.read.format("ddmq").options(**options(proxy, maxMessages="6000")).load().cache()
        rows = [(r.key, int(r.value.decode().split('"seq": ')[1].rstrip("}")), r.qid, r.offset) for r in df.collect()]
        if not rows:
            break
        assert len(rows) <= 6000
        batches.append((run, sorted(rows, key=lambda row: (row[2], row[3]))))
        df.select("topic", "qid", "offset").write.format("ddmq").options(**options(proxy)).mode("append").save()
        df.unpersist()
    assert len(batches) == 4  # 20,000 messages, 6,000 per run
    assert_exact_queue_order(batches, proxy)


def test_pull_mode_refuses_batch_reads_with_a_clear_error(spark: Any, proxy: ProxyProcess) -> None:
    with pytest.raises(Exception, match="mode=queue"):
        spark.read.format("ddmq").option("servers", f"127.0.0.1:{proxy.port}").option("group", "g").load().count()
