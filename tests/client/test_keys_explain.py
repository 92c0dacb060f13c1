"""``ddmq keys explain`` through the real CLI against a real proxy process, pulled over real HTTP: a
parked, a failing and an in-flight key each say their state, head, attempts, the client holding the
head, the reason, what comes next and the command to act; then every message is delivered in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer

from ..support import ProxyProcess

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC = "g", "t"
TOKEN = "a-token-of-sixteen-chars"
AGENT = "explain-cli-test/2.0"
KEYS = ("p", "f", "i")


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    group = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 1, "timeout_ms": 60_000,
                     "retry_intervals_ms": [50], "on_exhausted": "park"}}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port(), "admin_token": TOKEN}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 1}}, http=http).start()
    process.http_url = f"http://127.0.0.1:{http['port']}"  # type: ignore[attr-defined]
    try:
        deadline = time.monotonic() + 60
        while True:  # the process answers Thrift first; wait for its HTTP server too
            try:
                with urllib.request.urlopen(process.http_url + "/healthz", timeout=5):  # type: ignore[attr-defined]
                    break
            except OSError:
                assert time.monotonic() < deadline, "the proxy's HTTP server within 60 s"
                time.sleep(0.05)
        yield process
    finally:
        process.stop()


def ddmq(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDMQ_HTTP": proxy.http_url, "DDMQ_ADMIN_TOKEN": TOKEN}  # type: ignore[attr-defined]
    return subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60, env=env)


def pull(proxy: ProxyProcess, results: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    body = json.dumps({"group": GROUP, "topic": TOPIC, "linger_ms": 2000, "results": results or []}).encode()
    request = urllib.request.Request(proxy.http_url + "/v1/pull", data=body, method="POST",  # type: ignore[attr-defined]
                                     headers={"Content-Type": "application/json", "User-Agent": AGENT})
    with urllib.request.urlopen(request, timeout=30) as response:
        messages: list[dict[str, Any]] = json.loads(response.read())["messages"]
    return messages


def pull_until(proxy: ProxyProcess, wanted: set[str], results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 30
    while not wanted <= set(got):
        assert time.monotonic() < deadline, f"deliveries of {wanted - set(got)} within 30 s"
        for message in pull(proxy, results):
            got[message["key"]] = message
        results = []
    return got


def fail(message: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"topic": TOPIC, "qid": 0, "fail_details": [{"offset": message["offset"], "reason": reason}]}


def explain(proxy: ProxyProcess, key: str) -> tuple[str, dict[str, Any]]:
    common = ["keys", "explain", "--group", GROUP, "--topic", TOPIC, "--key", key]
    text = ddmq(proxy, *common)
    assert text.returncode == 0, text.stderr
    answer = ddmq(proxy, *common, "--json")
    assert answer.returncode == 0, answer.stderr
    (entry,) = json.loads(answer.stdout)["queues"]
    assert isinstance(entry, dict)
    return text.stdout, entry


def test_keys_explain_a_parked_a_failing_and_an_in_flight_key(proxy: ProxyProcess, redis_url: str) -> None:
    with Producer(redis_url) as producer:
        for n in range(3):
            for key in KEYS:
                producer.send(TOPIC, f"{key}{n}", key=key, qid=0)
    first = pull_until(proxy, set(KEYS), [])
    second = pull_until(proxy, {"p", "f"}, [fail(first["p"], "card declined"), fail(first["f"], "no driver")])
    pull(proxy, [fail(second["p"], "card declined again")])  # p's last attempt: it parks

    text, parked = explain(proxy, "p")
    assert parked["state"] == "parked" and parked["head_offset"] == first["p"]["offset"]
    assert "key 'p' of g/t, qid 0 (read by this proxy): parked since " in text, text
    assert f"head offset {first['p']['offset']}, attempt 2 of 2; 2 waiting behind it" in text
    assert "reason: card declined again" in text and "parked by proxy" in text
    assert "act: ddmq keys retry|skip|resume --group g --topic t --key p" in text

    text, failing = explain(proxy, "f")
    assert failing["state"] == "failing" and failing["attempts"] == 2
    assert "): failing" in text and "reason: no driver" in text
    assert "held by client http 127.0.0.1:" in text and f"({AGENT}) until " in text, text
    assert "if it fails or times out: the key parks on it" in text

    text, in_flight = explain(proxy, "i")
    assert in_flight["state"] == "in_flight" and in_flight["client"]["client_id"] == AGENT
    assert "): in flight" in text and f"waiting for the ack of offset {first['i']['offset']} from http client" in text
    assert "retried 50 ms after it (attempt 2 of 2)" in text and "act: ddmq keys park" in text

    text, idle = explain(proxy, "nobody")
    assert idle["state"] == "idle" and "nothing unfinished or parked" in text
    bad = ddmq(proxy, "keys", "explain", "--group", GROUP, "--topic", TOPIC, "--key", "p", "--qid", "5")
    assert bad.returncode != 0 and "qid" in bad.stderr, bad.stderr

    # Acting on what it said: retry p; every message comes, in order per key.
    assert ddmq(proxy, "keys", "retry", "--group", GROUP, "--topic", TOPIC, "--key", "p").returncode == 0
    seen: dict[str, list[str]] = {"p": [], "f": ["f0"], "i": ["i0"]}
    results = [{"topic": TOPIC, "qid": 0, "success": [second["f"]["offset"], first["i"]["offset"]]}]
    deadline = time.monotonic() + 30
    while sum(map(len, seen.values())) < 9:
        assert time.monotonic() < deadline, seen
        messages = pull(proxy, results)
        for message in messages:
            seen[message["key"]].append(message["value_text"])
        results = [{"topic": TOPIC, "qid": 0, "success": [m["offset"] for m in messages]}] if messages else []
    pull(proxy, results)
    assert seen == {k: [f"{k}{n}" for n in range(3)] for k in KEYS}
