"""``ddmq status`` against a real proxy: owner, term, committed and produced offsets, lag."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import redis

from ddmq.client.producer import AsyncProducer
from ddmq.client.status import group_status
from ddmq.proxy.types import QueueResult

from ..proxy.conftest import running_proxy


async def test_status_shows_owner_offsets_and_lag(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "KEY"}, queues=2, instance_id="proxy-x") as service:
        producer = AsyncProducer(redis_url)
        for i in range(5):
            await producer.send("t", f"m{i}", qid=0)
        await producer.close()
        batch = await service.pull("g", "t", 2, 2000, [])  # two delivered, not acked yet
        await service.submit([QueueResult("g", "t", "0", [batch.messages[0].offset], [])])
        await asyncio.sleep(0.2)  # a commit interval
        with redis.Redis.from_url(redis_url) as client:
            status = await asyncio.to_thread(group_status, client, "g")
        assert list(status.members) == ["proxy-x"]
        q0, q1 = status.queues
        assert (q0.owner, q0.committed, q0.produced, q0.lag) == ("proxy-x", 2, 6, 4)
        assert q0.term is not None and 0 < (q0.lease_expires_in_ms or 0) <= 30_000
        assert (q1.owner, q1.committed, q1.produced, q1.lag) == ("proxy-x", 1, 1, 0)
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "ddmq.client.cli", "status", "--redis", redis_url, "--group", "g"],
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert "proxy-x" in proc.stdout and "group g" in proc.stdout
    with redis.Redis.from_url(redis_url) as client:
        after = group_status(client, "g")
    assert after.members == {} and all(q.owner is None for q in after.queues)  # left and released
