"""``ddmq keys`` and ``ddmq consume --fail-reason`` through the real CLI against a real proxy process
whose group parks a key when its head fails for good: the reason shows in ``keys list``, ``retry``
delivers the head again with its attempts reset, ``skip`` dead-letters it and the key moves on in
order, and ``dead-letters replay --key`` puts the key's dead letters back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddmq.client.cli.keys import stuck_first
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer

from ..support import ProxyProcess

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC = "g", "t"
TOKEN = "a-token-of-sixteen-chars"


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    group = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 0, "timeout_ms": 30_000,
                     "on_exhausted": "park"}}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port(), "admin_token": TOKEN}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 2}}, http=http).start()
    process.http_url = f"http://127.0.0.1:{http['port']}"  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.stop()


def ddmq(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDMQ_HTTP": proxy.http_url, "DDMQ_ADMIN_TOKEN": TOKEN,  # type: ignore[attr-defined]
           "DDMQ_SERVERS": f"127.0.0.1:{proxy.port}", "LOGNAME": "ops-alice", "USER": "ops-alice"}
    return subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60, env=env)


def consume_one(proxy: ProxyProcess, *extra: str) -> dict[str, Any]:
    result = ddmq(proxy, "consume", "--group", GROUP, "--topic", TOPIC, "--count", "1", "--timeout", "20", *extra)
    assert result.returncode == 0, result.stderr
    line: dict[str, Any] = json.loads(result.stdout)
    return line


def keys_json(proxy: ProxyProcess, *extra: str) -> dict[str, Any]:
    result = ddmq(proxy, "keys", "list", "--group", GROUP, "--topic", TOPIC, "--json", *extra)
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout)
    return answer


def test_keys_retry_and_skip_from_the_cli(proxy: ProxyProcess, redis_url: str) -> None:
    with Producer(redis_url) as producer:
        for event in ("call", "pickup", "pay"):
            producer.send(TOPIC, f"r1 {event}", key="r1", qid=0)
    common = ["--group", GROUP, "--topic", TOPIC]

    # The head fails for good (max_retry 0) with the reason given: the key parks on it.
    call = consume_one(proxy, "--fail-reason", "card declined")
    assert call["value"] == "r1 call"
    listing = ddmq(proxy, "keys", "list", *common)
    assert listing.returncode == 0, listing.stderr
    assert "card declined" in listing.stdout and "parked" in listing.stdout
    assert listing.stdout.rstrip().endswith("keys of g/t: 1 parked, 0 failing, 0 in flight, 0 waiting"), listing.stdout
    parked = keys_json(proxy, "--state", "parked")["keys"]
    assert [(k["key"], k["head_offset"], k["reason"]) for k in parked] == [("r1", call["offset"], "card declined")]

    # retry: the same head comes again, attempts reset, and is acked this time.
    retried = ddmq(proxy, "keys", "retry", *common, "--key", "r1")
    assert retried.returncode == 0 and "retry 'r1' on g/t" in retried.stdout, retried.stderr
    again = consume_one(proxy)
    assert (again["offset"], again["value"]) == (call["offset"], "r1 call")

    # skip: the next head parks, skip dead-letters it (by who asked) and the key goes on with pay.
    pickup = consume_one(proxy, "--fail-reason", "no driver")
    assert pickup["value"] == "r1 pickup"
    assert keys_json(proxy, "--key", "r1")["keys"][0]["state"] == "parked"
    skipped = ddmq(proxy, "keys", "skip", *common, "--key", "r1")
    assert skipped.returncode == 0, skipped.stderr
    assert consume_one(proxy)["value"] == "r1 pay"
    letters = ddmq(proxy, "dead-letters", "list", *common, "--json")
    entries = json.loads(letters.stdout)["entries"]
    assert [(e["key"], e["offset"]) for e in entries] == [("r1", pickup["offset"])], letters.stdout

    # A key that is not there: nothing applied, status 1.
    assert ddmq(proxy, "keys", "resume", *common, "--key", "nobody").returncode == 1

    # park holds a key by hand (recording who asked); resume lets it go on.
    with Producer(redis_url) as producer:
        producer.send(TOPIC, "r2 call", key="r2", qid=1)
    parked_by_hand = ddmq(proxy, "keys", "park", *common, "--key", "r2")
    assert parked_by_hand.returncode == 0, parked_by_hand.stdout + parked_by_hand.stderr
    (r2,) = keys_json(proxy, "--key", "r2")["keys"]
    assert (r2["state"], r2["parked_by"]) == ("parked", "ops-alice"), r2
    assert ddmq(proxy, "keys", "resume", *common, "--key", "r2").returncode == 0
    assert consume_one(proxy)["value"] == "r2 call"

    # Its dead letters go back in order, by key.
    replayed = ddmq(proxy, "dead-letters", "replay", *common, "--key", "r1")
    assert replayed.returncode == 0 and "replayed 1" in replayed.stdout, replayed.stdout + replayed.stderr
    assert consume_one(proxy)["value"] == "r1 pickup"


def test_list_puts_stuck_keys_first() -> None:
    keys = [{"key": "a", "state": "waiting"}, {"key": "b", "state": "parked"}, {"key": "c", "state": "in_flight"},
            {"key": "d", "state": "failing"}, {"key": "e", "state": "parked"}, {"key": "f", "state": "new-state"}]
    assert [k["key"] for k in stuck_first(keys)] == ["b", "e", "d", "c", "a", "f"]
