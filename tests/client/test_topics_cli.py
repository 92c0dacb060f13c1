"""``ddmq topics list|describe`` through the real command, against a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import redis

from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]


def _ddmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60)


def test_topics_list_and_describe_show_what_each_queue_holds(redis_url: str) -> None:
    before = int(time.time() * 1000)
    with Producer(redis_url) as producer:
        producer.ensure_topic("rides", 2)
        producer.ensure_topic("empty", 3)
        for i in range(5):
            producer.send("rides", f"m{i}", qid=0)
        producer.send("rides", "only", qid=1)
    with redis.Redis.from_url(redis_url) as client:
        client.xdel(keys.stream("rides", 0), "0-1", "0-2")  # trimmed: offsets 3..5 remain

    listed = _ddmq("topics", "list", "--redis", redis_url, "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {"topic": "empty", "queues": 3, "produced": 0, "length": 0},
        {"topic": "rides", "queues": 2, "produced": 6, "length": 4},
    ]
    described = _ddmq("topics", "describe", "rides", "--redis", redis_url, "--json")
    assert described.returncode == 0, described.stderr
    q0, q1 = json.loads(described.stdout)["queues"]
    assert (q0["produced"], q0["length"], q0["first_offset"], q0["last_offset"]) == (5, 3, 3, 5)
    assert (q1["produced"], q1["length"], q1["first_offset"], q1["last_offset"]) == (1, 1, 1, 1)
    assert before <= q0["first_ms"] <= q0["last_ms"] <= int(time.time() * 1000)

    table = _ddmq("topics", "describe", "rides", "--redis", redis_url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["qid", "produced", "entries"]
    assert lines[1].split()[:5] == ["0", "5", "3", "3", "5"] and lines[1].split()[5].endswith("Z")
    assert lines[-1] == "topic rides: 2 queue(s), 6 produced, 4 held"


def test_describing_an_unknown_topic_fails_naming_it(redis_url: str) -> None:
    result = _ddmq("topics", "describe", "ridez", "--redis", redis_url)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("ddmq topics describe: no topic 'ridez' in "), result.stderr
