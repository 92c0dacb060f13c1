"""``ddmq produce`` refuses a topic that does not exist (a typo must not make a new topic) unless
``--create``; a topic a running proxy serves exists from the proxy's start. The real CLI in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis

from ddmq.protocol.redis import keys

from ..support import ProxyProcess

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
LINE = '{"key": "r1", "value": "hello"}\n'


def _produce(redis_url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DDMQ, "produce", "--redis", redis_url, *extra], input=LINE, capture_output=True,
                          text=True, timeout=60)


def test_produce_refuses_an_unknown_topic_unless_create(tmp_path: Path, redis_url: str) -> None:
    group = {"rides": {"actions": ["PullServer"], "timeout_ms": 1000}}
    proxy = ProxyProcess(tmp_path, redis_url, {"cg_rides": group}, {"rides": {"queues": 8}}).start()
    try:
        ok = _produce(redis_url, "--topic", "rides")  # the proxy created it at start
        assert ok.returncode == 0, ok.stderr
        typo = _produce(redis_url, "--topic", "ridez")
        assert typo.returncode == 1, typo
        assert "no topic 'ridez'" in typo.stderr and "existing topics: rides" in typo.stderr, typo.stderr
        assert "--create" in typo.stderr
        with redis.Redis.from_url(redis_url) as client:
            assert not client.exists(keys.topic_meta("ridez"))  # refused before anything was written
            assert not client.sismember(keys.topics(), "ridez")
            created = _produce(redis_url, "--topic", "ridez", "--create", "--queues", "2")
            assert created.returncode == 0, created.stderr
            assert client.hget(keys.topic_meta("ridez"), "queues") == b"2"
            assert client.xlen(keys.stream("ridez", 0)) + client.xlen(keys.stream("ridez", 1)) == 1
        again = _produce(redis_url, "--topic", "ridez")  # exists now
        assert again.returncode == 0, again.stderr
    finally:
        proxy.stop()
