"""``ddmq dead-letters``, ``ddmq in-flight`` and ``ddmq blocked-keys`` through the real CLI against a
real proxy process's HTTP admin API (with a bearer token from ``DDMQ_ADMIN_TOKEN``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ddmq.client.consumer import PullConsumer
from ddmq.client.thrift_client import ProxyClient
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.wire import ConsumeResult, PullRequest

from ..support import ProxyProcess

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC = "g", "t"
TOKEN = "a-token-of-sixteen-chars"


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    group = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 0, "timeout_ms": 30_000}}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port(), "admin_token": TOKEN}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 2}}, http=http).start()
    process.http_url = f"http://127.0.0.1:{http['port']}"  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.stop()


def ddmq(proxy: ProxyProcess, *args: str, token: str | None = TOKEN) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDMQ_HTTP": proxy.http_url}  # type: ignore[attr-defined]
    env.pop("DDMQ_ADMIN_TOKEN", None)
    if token is not None:
        env["DDMQ_ADMIN_TOKEN"] = token
    return subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60, env=env)


def test_dead_letters_list_replay_purge(proxy: ProxyProcess, redis_url: str) -> None:
    with Producer(redis_url) as producer:
        for i in range(3):
            producer.send(TOPIC, f"poison-{i}", key=f"k{i}", qid=0)
    failed = 0

    def fail(message: object) -> bool:
        nonlocal failed
        failed += 1
        if failed >= 3:
            consumer.stop()
        return False

    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, fail, threads=1)
    consumer.run()
    with redis.Redis.from_url(redis_url) as client:
        deadline = time.monotonic() + 10
        while client.xlen(keys.dead_letters(GROUP, TOPIC)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)

    listed = ddmq(proxy, "dead-letters", "list", "--group", GROUP, "--topic", TOPIC)
    assert listed.returncode == 0, listed.stderr
    assert "poison-0" in listed.stdout and "3 of 3 dead letters of g/t" in listed.stdout
    page = json.loads(ddmq(proxy, "dead-letters", "list", "--group", GROUP, "--topic", TOPIC, "--json").stdout)
    ids = [entry["id"] for entry in page["entries"]]
    assert len(ids) == 3 and page["total"] == 3

    refused = ddmq(proxy, "dead-letters", "list", "--group", GROUP, "--topic", TOPIC, token=None)
    assert refused.returncode == 1 and refused.stderr.startswith("ddmq dead-letters list: ")
    assert "Bearer" in refused.stderr and "HTTP 401" in refused.stderr

    replayed = ddmq(proxy, "dead-letters", "replay", "--group", GROUP, "--topic", TOPIC, "--id", ids[0])
    assert replayed.returncode == 0 and "replayed 1 dead letter(s) into t" in replayed.stdout, replayed.stderr
    again = ddmq(proxy, "dead-letters", "replay", "--group", GROUP, "--topic", TOPIC, "--id", ids[0])
    assert again.returncode == 1 and f"not found: {ids[0]}" in again.stdout
    purged = ddmq(proxy, "dead-letters", "purge", "--group", GROUP, "--topic", TOPIC, "--all")
    assert purged.returncode == 0 and "purged 2 dead letter(s)" in purged.stdout
    with redis.Redis.from_url(redis_url) as client:
        assert client.xlen(keys.dead_letters(GROUP, TOPIC)) == 0
        # three produced, one replayed (the consumed ones may already be trimmed: count offsets)
        assert client.get(keys.sequence(TOPIC, 0)) == b"4"


def test_in_flight_and_blocked_keys(proxy: ProxyProcess, redis_url: str) -> None:
    with Producer(redis_url) as producer:
        for i in range(4):
            producer.send(TOPIC, f"ride-{i}", key="rider-1", qid=1)
    with ProxyClient("127.0.0.1", proxy.port) as client:
        # a long linger: on a loaded machine the proxy may still be claiming the queue
        response = client.pull(PullRequest(groupId=GROUP, topic=TOPIC, maxBatchSize=10, maxLingerTime=10_000))
    assert [m.offset for m in response.messages] == [1]  # the key's head; the rest wait behind it

    flight = ddmq(proxy, "in-flight", "--group", GROUP)
    assert flight.returncode == 0, flight.stderr
    assert "rider-1" in flight.stdout and "in_flight" in flight.stdout
    jobs = json.loads(ddmq(proxy, "in-flight", "--group", GROUP, "--topic", TOPIC, "--json").stdout)["jobs"]
    assert (jobs[0]["qid"], jobs[0]["offset"], jobs[0]["state"]) == (1, 1, "in_flight")

    # The head is in flight, not failing: the default (stuck keys) lists nothing, --all lists it.
    blocked = ddmq(proxy, "blocked-keys", "--group", GROUP)
    assert blocked.returncode == 0 and "rider-1" not in blocked.stdout, blocked.stderr
    assert "0 of 0 stuck keys" in blocked.stdout and "--all" in blocked.stdout, blocked.stdout
    every = ddmq(proxy, "blocked-keys", "--group", GROUP, "--all")
    assert "rider-1" in every.stdout and "in flight" in every.stdout and "1 of 1 keys" in every.stdout, every.stdout
    keys_ = json.loads(ddmq(proxy, "blocked-keys", "--group", GROUP, "--all", "--json").stdout)["keys"]
    assert keys_[0]["order_key"] == "rider-1" and keys_[0]["chain_length"] == 4 and keys_[0]["state"] == "in_flight"

    unknown = ddmq(proxy, "in-flight", "--group", "nosuch")
    assert unknown.returncode == 1 and "unknown group 'nosuch'" in unknown.stderr


def test_admin_commands_pointed_at_the_thrift_port_say_so(proxy: ProxyProcess) -> None:
    result = subprocess.run([*DDMQ, "in-flight", "--group", GROUP, "--http", f"127.0.0.1:{proxy.port}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Thrift port" in result.stderr, result.stderr


@pytest.fixture
def retrying_proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    """A group whose failed messages wait a minute before their retry: a failed head stays failing."""
    group = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 3,
                     "retry_intervals_ms": [60_000], "timeout_ms": 30_000}}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port(), "admin_token": TOKEN}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 1}}, http=http).start()
    process.http_url = f"http://127.0.0.1:{http['port']}"  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.stop()


def test_blocked_keys_defaults_to_stuck_keys_pages_and_says_n_of_total(retrying_proxy: ProxyProcess,
                                                                        redis_url: str) -> None:
    proxy = retrying_proxy
    with Producer(redis_url) as producer:
        for key in ("k0", "k1", "k2"):
            producer.send_batch(TOPIC, [{"key": key, "value": f"{key}-{i}", "qid": 0} for i in range(2)])
    with ProxyClient("127.0.0.1", proxy.port) as client:
        # One head per key; the proxy may not have read all three keys when the first pull answers.
        heads: dict[str, tuple[int, Any]] = {}
        deadline = time.monotonic() + 30
        while len(heads) < 3:
            assert time.monotonic() < deadline, heads
            batch = client.pull(PullRequest(groupId=GROUP, topic=TOPIC, maxBatchSize=10, maxLingerTime=2_000))
            for m in batch.messages:
                assert m.key not in heads, m.key  # a key's successor waits for its head
                heads[m.key] = (m.offset, batch.context)
        assert sorted(heads) == ["k0", "k1", "k2"]
        k0, context = heads["k0"]
        assert client.submit(ConsumeResult(context=context, failOffsets=[k0]))
        with Producer(redis_url) as producer:
            producer.send(TOPIC, "k3-0", key="k3", qid=0)  # read, never pulled: waiting

        def listed(*extra: str) -> dict[str, Any]:
            result = ddmq(proxy, "blocked-keys", "--group", GROUP, "--json", *extra)
            assert result.returncode == 0, result.stderr
            answer: dict[str, Any] = json.loads(result.stdout)
            return answer

        deadline = time.monotonic() + 30
        while listed("--all")["total"] < 4:
            assert time.monotonic() < deadline, "the proxy did not read k3"
            time.sleep(0.1)

        stuck = ddmq(proxy, "blocked-keys", "--group", GROUP)
        assert stuck.returncode == 0, stuck.stderr
        assert "1 of 1 stuck keys" in stuck.stdout and "failing" in stuck.stdout and "k0" in stuck.stdout
        assert all(key not in stuck.stdout for key in ("k1", "k2", "k3")), stuck.stdout

        first = ddmq(proxy, "blocked-keys", "--group", GROUP, "--all", "--limit", "2")
        assert "2 of 4 keys" in first.stdout and "next page: --offset 2" in first.stdout, first.stdout
        pages = listed("--all", "--limit", "2")["keys"] + listed("--all", "--limit", "2", "--offset", "2")["keys"]
        states = {key["order_key"]: key["state"] for key in pages}
        assert states == {"k0": "failing", "k1": "in_flight", "k2": "in_flight", "k3": "waiting"}
        last = ddmq(proxy, "blocked-keys", "--group", GROUP, "--all", "--limit", "2", "--offset", "2")
        assert "2 of 4 keys" in last.stdout and "next page" not in last.stdout, last.stdout
        text = ddmq(proxy, "blocked-keys", "--group", GROUP, "--all").stdout
        assert "in flight" in text and "waiting" in text
