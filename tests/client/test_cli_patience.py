"""``ddmq status``, ``ddmq topics`` and ``ddmq groups`` started while Redis does not answer (every
connection reset, as a Cluster master's kill -9 or a restart looks to a client) wait for it, say so on
one line, and answer once it is back; past ``--timeout`` they fail with the error. Real CLI processes,
a real Redis behind the project's fault relay."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import redis

from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys
from tests.harness.relay import Relay

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
READS = (["status", "--group", "g"], ["topics", "list"], ["groups", "list"], ["groups", "describe", "g"])


def _wait(what: str, check: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(0.05)


def _seed(client: redis.Redis) -> None:
    client.hset(keys.topic_meta("rides"), "queues", 1)
    client.sadd(keys.topics(), "rides")
    client.sadd(keys.groups(), "g")
    client.hset(keys.group_topics("g"), "rides", int(time.time() * 1000))
    client.set(keys.committed("g", "rides", 0), 1)


def test_reads_started_while_redis_refuses_wait_for_it_and_answer(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        _seed(client)
    port = urlsplit(redis_url).port
    assert port is not None
    with Relay(port) as relay:
        relay.mode("reset")
        procs = [subprocess.Popen([*DDMQ, *read, "--redis", relay.url(redis_url)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for read in READS]
        try:
            _wait("every command reset twice, or one of them exited",
                  lambda: relay.stats()["resets"] >= 2 * len(procs) or any(p.poll() is not None for p in procs))
            assert [p.poll() for p in procs] == [None] * len(procs)  # waiting, not failed
            relay.mode("pass")
            outputs = [p.communicate(timeout=60) for p in procs]
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    for read, proc, (out, err) in zip(READS, procs, outputs, strict=True):
        assert proc.returncode == 0, (read, err)
        prog = "ddmq " + " ".join(read[:1] if read[0] == "status" else read[:2])
        waited = [line for line in err.splitlines() if "does not answer" in line]
        assert len(waited) == 1 and waited[0].startswith(f"{prog}: ") and "retrying for up to 30s" in waited[0], err
        assert "rides" in out, (read, out)


def test_a_read_gives_up_at_its_timeout_and_at_once_with_zero() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    late = subprocess.run([*DDMQ, "status", "--group", "g", "--redis", dead, "--timeout", "1.5"],
                          capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    assert late.returncode == 1 and took >= 1.5, (late, took)
    lines = late.stderr.splitlines()
    assert len(lines) == 2 and "retrying for up to 1.5s" in lines[0], late.stderr
    assert lines[1].startswith("ddmq status: redis://127.0.0.1:") and "Connection refused" in lines[1], late.stderr
    at_once = subprocess.run([*DDMQ, "topics", "list", "--redis", dead, "--timeout", "0"],
                             capture_output=True, text=True, timeout=60)
    assert at_once.returncode == 1 and len(at_once.stderr.splitlines()) == 1, at_once.stderr
    bad = subprocess.run([*DDMQ, "groups", "list", "--redis", dead, "--timeout", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--timeout must not be negative" in bad.stderr, bad.stderr
