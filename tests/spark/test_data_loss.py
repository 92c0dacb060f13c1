"""``failOnDataLoss`` in queue mode on real Spark, proxy and Redis: offsets trimmed from a queue before
the query read them (here by a producer-side XTRIM, as ``maxlen`` does) fail the query naming the range,
or, with ``failOnDataLoss=false``, are skipped while every remaining message is read."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from ddmq.protocol import keys

from ..support import ProxyProcess
from .helpers import produce


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
