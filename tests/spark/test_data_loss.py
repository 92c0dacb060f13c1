"""``failOnDataLoss`` on real Spark, proxy and Redis: offsets trimmed from a queue before the query read
them (here by a producer-side XTRIM, as ``maxlen`` does) fail the query naming the range, or, with
``failOnDataLoss=false``, are skipped while every remaining message is read. Queue mode sees the gap
itself; in pull mode the proxy counts what its group lost and the driver reads the count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from ddmq.client.thrift_client import ProxyClient
from ddmq.protocol.redis import keys
from ddmq.protocol.wire import ConsumeStatsRequest

from ..support import ProxyProcess
from .helpers import Collector, drained, produce, wait_until


def options(proxy: ProxyProcess, **extra: str) -> dict[str, str]:
    return {"servers": f"127.0.0.1:{proxy.port}", "group": "g", "mode": "queue", **extra}


@pytest.mark.timeout(240)
def test_fail_on_data_loss_both_ways(spark: Any, proxy: ProxyProcess, redis_url: str) -> None:
    produce(redis_url, 50, 20)  # 1,000 messages over 8 queues
    with redis.Redis.from_url(redis_url) as client:
        end = int(client.get(keys.sequence("t", 3)) or 0)
        assert end > 20
        client.xtrim(keys.stream("t", 3), minid=keys.stream_id(11), approximate=False)  # offsets 1..10 of t#3 are gone
        left = sum(client.xlen(keys.stream("t", qid)) for qid in range(8))
    assert left == 990

    with pytest.raises(Exception, match=r"offsets 1\.\.10 of t#3 \(10 message\(s\)\) are gone from Redis"):
        spark.read.format("ddmq").options(**options(proxy)).load().count()

    rows = spark.read.format("ddmq").options(**options(proxy, failOnDataLoss="false")).load().collect()
    assert len(rows) == 990
    assert sorted(r.offset for r in rows if r.qid == 3) == list(range(11, end + 1))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail", [True, False], ids=["fail", "go-on"])
def test_pull_mode_fails_or_counts_what_the_group_lost(
    spark: Any, redis_url: str, tmp_path: Path, fail: bool
) -> None:
    proxy = ProxyProcess(
        tmp_path,
        redis_url,
        groups={"g": {"t": {"order_key": "KEY", "timeout_ms": 30000}}},
        topics={"t": {"queues": 8}},
        commit_interval_ms=100,
        shutdown_grace_ms=0,
    ).start()
    collector = Collector()

    def start_query() -> Any:
        reader = (spark.readStream.format("ddmq").option("servers", f"127.0.0.1:{proxy.port}")
                  .option("group", "g").option("failOnDataLoss", str(fail).lower()).load())
        return (reader.writeStream.foreachBatch(collector)
                .option("checkpointLocation", str(tmp_path / "checkpoint")).start())

    def lost() -> int:
        with ProxyClient("127.0.0.1", proxy.port) as client:
            stats = client.get_consume_stats(ConsumeStatsRequest(group="g"))
        return sum((row.expired or {}).get("3", 0) for row in stats)

    try:
        # The group reads and commits a first backlog; then, while neither the query nor the proxy
        # runs, a second one is produced and most of its part in t#3 trimmed before the group read it.
        produce(redis_url, 50, 8, seed=1)  # 400 messages
        query = start_query()
        try:
            wait_until(lambda: collector.count == 400 and drained(proxy), 120, "the first backlog acked")
        finally:
            query.stop()
        proxy.stop()
        produce(redis_url, 50, 4, seed=2)  # 200 more
        with redis.Redis.from_url(redis_url) as client:
            end = int(client.get(keys.sequence("t", 3)) or 0)
            client.xtrim(keys.stream("t", 3), minid=keys.stream_id(end - 2), approximate=False)
        proxy.start()
        query = start_query()
        try:
            if fail:
                named = r"group g lost \d+ message\(s\) of t#3 \(the latest offsets \d+\.\.\d+\)"
                with pytest.raises(Exception, match=named):
                    query.awaitTermination(180)
                assert lost() > 0
                return
            wait_until(lambda: lost() > 0 and collector.count + lost() == 600, 120, "the rest of the messages")
            assert query.isActive
            with collector.lock:
                delivered = [(qid, offset) for _, rows in collector.batches for _, _, qid, offset in rows]
            assert len(set(delivered)) == len(delivered) == 600 - lost()
            assert max(offset for qid, offset in delivered if qid == 3) == end
        finally:
            query.stop()
    finally:
        proxy.stop()
