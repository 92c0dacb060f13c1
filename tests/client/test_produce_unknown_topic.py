"""``ddmq produce`` refuses a topic that does not exist (a typo must not make a new topic) unless
``--create``; a topic a running proxy serves exists from the proxy's start. The check rides out a Redis
that does not answer yet, as the sends after it do. The real CLI in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import redis

from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys
from tests.harness.relay import Relay

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


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(0.05)


def test_produce_started_while_redis_refuses_waits_for_it_then_checks_and_sends(redis_url: str) -> None:
    """Started during an outage (every connection reset, as a master's kill -9 looks to a client), both
    the unknown-topic check and the send wait for Redis instead of exiting: the known topic gets its
    line once Redis answers, and a typo is still refused, by name, with nothing written."""
    with redis.Redis.from_url(redis_url) as client:
        client.hset(keys.topic_meta("rides"), "queues", 1)
        client.sadd(keys.topics(), "rides")
        port = urlsplit(redis_url).port
        assert port is not None
        with Relay(port) as relay:
            relay.mode("reset")
            known = subprocess.Popen([*DDMQ, "produce", "--redis", relay.url(redis_url), "--topic", "rides"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            typo = subprocess.Popen([*DDMQ, "produce", "--redis", relay.url(redis_url), "--topic", "ridez"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                for proc in (known, typo):
                    assert proc.stdin is not None
                    proc.stdin.write(LINE)
                    proc.stdin.close()
                # each has tried, been reset and tried again (a retry, not an exit)
                _wait("both commands reset twice, or one of them exited",
                      lambda: relay.stats()["resets"] >= 4 or known.poll() is not None or typo.poll() is not None)
                assert known.poll() is None and typo.poll() is None, (known.returncode, typo.returncode)
                relay.mode("pass")
                known.wait(timeout=60)
                typo.wait(timeout=60)
            finally:
                for proc in (known, typo):
                    proc.kill()
                    proc.wait()
            known_err, typo_err = (proc.stderr.read() if proc.stderr else "" for proc in (known, typo))
            for proc in (known, typo):
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()
        assert known.returncode == 0, known_err
        for err in (known_err, typo_err):  # each said once why it waited
            waited = [line for line in err.splitlines() if "retrying for up to 120s" in line]
            assert len(waited) == 1 and waited[0].startswith("ddmq produce: redis failed ("), err
        assert client.xlen(keys.stream("rides", 0)) == 1
        assert typo.returncode == 1, typo_err
        assert "no topic 'ridez'" in typo_err and "existing topics: rides" in typo_err, typo_err
        assert not client.exists(keys.topic_meta("ridez"))


def test_produce_gives_up_on_a_redis_that_never_answers_at_its_delivery_timeout() -> None:
    started = time.monotonic()
    result = subprocess.run(
        [*DDMQ, "produce", "--redis", f"redis://127.0.0.1:{free_port()}/0", "--topic", "rides",
         "--delivery-timeout-ms", "1500"],
        input=LINE, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1, result
    assert result.stderr.startswith("ddmq produce: "), result.stderr
    assert "delivery_timeout_ms (1500) passed" in result.stderr and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and "retrying for up to 1.5s" in lines[0], result.stderr
    assert time.monotonic() - started >= 1.5
