"""``ddmq status`` against a real proxy: owner, term, committed and produced offsets, lag."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

from ddmq.client.cli.status import group_status
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys
from ddmq.proxy.core.types import QueueResult

from ..proxy.conftest import running_proxy
from ..support import ProxyProcess


async def test_status_shows_owner_offsets_and_lag(redis_url: str) -> None:
    async with running_proxy(redis_url, {"order_key": "KEY"}, queues=2, instance_id="proxy-x") as service:
        producer = AsyncProducer(redis_url)
        for i in range(5):
            await producer.send("t", f"m{i}", qid=0)
        await producer.close()
        batch = await service.api.pull("g", "t", 2, 2000, [])  # two delivered, not acked yet
        await service.api.submit([QueueResult("g", "t", "0", [batch.messages[0].offset], [])])
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


def _ddmq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddmq.client.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_status_of_an_unknown_group_fails(redis_url: str) -> None:
    result = _ddmq("status", "--group", "nosuch", env={**os.environ, "DDMQ_REDIS": redis_url})
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("ddmq status: group 'nosuch' is unknown"), result.stderr


def test_status_marks_members_past_their_ttl_expired(tmp_path: Path, redis_url: str) -> None:
    proxy = ProxyProcess(tmp_path, redis_url, {"g": {"t": {}}}, {"t": {"queues": 2}}).start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with redis.Redis.from_url(redis_url) as client:
                if group_status(client, "g").members:
                    break
            time.sleep(0.1)
    finally:
        proxy.kill()  # no goodbye: its heartbeat stays in the member set
    time.sleep(0.5)
    with redis.Redis.from_url(redis_url) as client:
        assert group_status(client, "g", member_ttl_ms=60_000).expired == []
        status = group_status(client, "g", member_ttl_ms=300)
    assert status.expired == ["e2e-proxy"] and status.known
    result = _ddmq("status", "--redis", redis_url, "--group", "g", "--member-ttl-ms", "300")
    assert result.returncode == 0, result.stderr
    assert "e2e-proxy (EXPIRED: heartbeat" in result.stdout and "no live member" in result.stdout


def test_status_into_a_closed_pipe_ends_quietly(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        client.zadd(keys.members("g"), {"p-1": int(time.time() * 1000)})
    with subprocess.Popen([sys.executable, "-m", "ddmq.client.cli", "status", "--json", "--redis", redis_url,
                           "--group", "g"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the command prints anything
        assert proc.wait(timeout=30) == 1
        assert proc.stderr.read() == b""


def test_status_shows_the_time_lag_of_the_first_unfinished_message(redis_url: str) -> None:
    from ddmq.protocol.produce.producer import Producer

    with Producer(redis_url) as producer:
        for i in range(3):
            producer.send("t", f"m{i}", qid=0)
    with redis.Redis.from_url(redis_url) as client:
        client.set(keys.committed("g", "t", 0), 2)  # offset 1 finished, 2 and 3 not
        ((_, fields),) = client.xrange(keys.stream("t", 0), "0-2", "0-2")
        time.sleep(1.1)
        status = group_status(client, "g", ["t"])
    q0 = status.queues[0]
    assert (q0.committed, q0.lag, q0.oldest_unfinished_ms) == (2, 2, int(fields[b"ts"]))
    assert q0.lag_ms is not None and 1100 <= q0.lag_ms < 60_000
    assert all(q.lag == 0 and q.lag_ms == 0 and q.oldest_unfinished_ms is None for q in status.queues[1:])
    result = _ddmq("status", "--redis", redis_url, "--group", "g", "--topic", "t")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()[1:3]
    assert "time lag" in header and row.split()[-4].endswith("s"), result.stdout  # e.g. "1.1s"


def test_status_of_an_unknown_topic_fails_naming_it(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        client.zadd(keys.members("g"), {"p-1": int(time.time() * 1000)})
    result = _ddmq("status", "--redis", redis_url, "--group", "g", "--topic", "nosuch")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("ddmq status: no topic 'nosuch' in "), result.stderr
