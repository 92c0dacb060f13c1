"""The commands started right after a Redis Cluster master's kill -9 (3 masters, 1 replica each;
``redis_cluster`` in conftest.py): ``ddmq produce`` to an existing topic (no ``--create``) exits 0 with
every message written once, and ``ddmq status`` answers once the replica is promoted; each says on one
line of stderr that it waits, and nothing else.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import IO

import pytest

from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import sync_redis
from ddmq.proxy.store.embedded_cluster import EmbeddedCluster

QUEUES = 8
MESSAGES = 3000
CLI = [sys.executable, "-m", "ddmq.client.cli"]


def stored_values(url: str) -> Counter[str]:
    """How many times each body is in the topic's streams."""
    found: Counter[str] = Counter()
    with sync_redis(url) as client:
        for qid in range(QUEUES):
            found.update(fields[b"v"].decode() for _, fields in client.xrange(keys.stream("t", qid)))
    return found


class Command:
    """``ddmq ARGS --redis URL`` running, ``stdin`` fed to it and its output read as it comes."""

    def __init__(self, *args: str, url: str, stdin: str | None = None) -> None:
        self.proc = subprocess.Popen([*CLI, args[0], "--redis", url, *args[1:]], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._out: list[str] = []
        self._err: list[str] = []
        self._threads = [threading.Thread(target=self._feed, args=(stdin or "",)),
                         threading.Thread(target=self._read, args=(self.proc.stdout, self._out)),
                         threading.Thread(target=self._read, args=(self.proc.stderr, self._err))]
        for thread in self._threads:
            thread.start()

    def _feed(self, text: str) -> None:
        assert self.proc.stdin is not None
        with self.proc.stdin:
            self.proc.stdin.write(text)

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        with stream:
            for line in stream:
                into.append(line)

    def stdout(self) -> str:
        return "".join(self._out)

    def stderr(self) -> str:
        return "".join(self._err)

    def wait(self, timeout_s: float) -> float:
        """Wait for it to exit; when it did (``time.monotonic()``)."""
        self.proc.wait(timeout_s)
        ended = time.monotonic()
        for thread in self._threads:
            thread.join(10)
        return ended

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def waiting_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "retrying for up to" in line]


@pytest.mark.timeout(120)
def test_produce_and_status_started_right_after_a_masters_kill_ride_out_the_failover(
    redis_cluster: EmbeddedCluster, cluster_url: str
) -> None:
    with Producer(cluster_url) as producer:
        producer.ensure_topic("t", QUEUES)
    with sync_redis(cluster_url) as client:  # group g is known: it has committed offsets
        for qid in range(QUEUES):
            client.set(keys.committed("g", "t", qid), 0)
    # the master of the topic's metadata, so the very first read of each command fails; its replica is
    # held (SIGSTOP) until both commands say they wait, so that they start before the promotion
    # whatever the time their start-up takes, then let go to take over
    victim = redis_cluster.master_of(keys.topic_meta("t"))
    replica_port = int(victim.client().role()[2][0][1])
    replica = next(node for node in redis_cluster.nodes if node.port == replica_port)
    assert replica.process is not None
    lines = "".join(json.dumps({"key": f"k{i % 97}", "value": f"m{i}"}) + "\n" for i in range(MESSAGES))
    commands: list[Command] = []
    replica.process.send_signal(signal.SIGSTOP)
    try:
        victim.kill()
        produce = Command("produce", "--topic", "t", "--batch", "50", url=cluster_url, stdin=lines)
        commands.append(produce)
        status = Command("status", "--group", "g", "--json", url=cluster_url)
        commands.append(status)
        try:
            deadline = time.monotonic() + 60
            while not (waiting_lines(produce.stderr()) and waiting_lines(status.stderr())):
                assert time.monotonic() < deadline, f"no wait said: {produce.stderr()!r} {status.stderr()!r}"
                time.sleep(0.05)
        finally:
            replica.process.send_signal(signal.SIGCONT)
        released_at = time.monotonic()
        produce_s, status_s = produce.wait(60) - released_at, status.wait(60) - released_at
    finally:
        replica.process.send_signal(signal.SIGCONT)
        for command in commands:
            command.kill()
    produce_err, status_err, status_out = produce.stderr(), status.stderr(), status.stdout()
    assert produce.proc.returncode == 0, produce_err
    assert status.proc.returncode == 0, status_err
    assert redis_cluster.master_of(keys.topic_meta("t")).port != victim.port, "no replica was promoted"

    assert len(waiting_lines(produce_err)) == 1, produce_err
    summary = produce_err.splitlines()[-1]
    assert summary.startswith(f"sent {MESSAGES} message(s) to 't' over {QUEUES} queue(s)"), produce_err
    assert produce_err.splitlines() == [*waiting_lines(produce_err), summary], produce_err
    stored = stored_values(cluster_url)
    assert stored == Counter(f"m{i}" for i in range(MESSAGES)), (
        f"{sum(stored.values())} stored, {sum(1 for n in stored.values() if n > 1)} twice, "
        f"{MESSAGES - len(stored)} missing")

    assert status_err.splitlines() == waiting_lines(status_err) and len(waiting_lines(status_err)) == 1, status_err
    rows = json.loads(status_out)["queues"]
    assert [row["qid"] for row in rows] == list(range(QUEUES))
    said = waiting_lines(produce_err + status_err)
    print(f"\ncli failover: ddmq status answered {status_s:.1f}s after the replica could take over, ddmq produce "
          f"wrote {MESSAGES} once each and exited {produce_s:.1f}s after it; waits said: {said}")
