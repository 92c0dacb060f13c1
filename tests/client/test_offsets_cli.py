"""``ddmq offsets reset`` through the real CLI against a real proxy process: dry run by default, refused
while a proxy holds the group's leases, and a reset group gets its messages again, in order."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from ddmq.client.cli.offsets import Target, plan
from ddmq.client.consumer import ConsumedMessage, PullConsumer
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys

from ..support import ProxyProcess, produce_keyed

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC, QUEUES = "g", "t", 4


def ddmq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60)


def committed(redis_url: str) -> list[int | None]:
    with redis.Redis.from_url(redis_url) as client:
        values = [client.get(keys.committed(GROUP, TOPIC, qid)) for qid in range(QUEUES)]
    return [int(v) if v is not None else None for v in values]


def consume_all(proxy: ProxyProcess, total: int) -> dict[str, list[int]]:
    """Every message's (key → seqs in delivery order), acking each; one puller keeps per-key order visible."""
    seqs: dict[str, list[int]] = defaultdict(list)
    count = 0

    def process(message: ConsumedMessage) -> bool:
        nonlocal count
        seqs[message.key].append(json.loads(message.value)["seq"])
        count += 1
        if count >= total:
            consumer.stop()
        return True

    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, process, threads=1, linger_ms=200)
    consumer.start()
    assert consumer.wait(60), f"only {count} of {total} delivered"
    consumer.close()
    return seqs


def test_reset_to_earliest_delivers_the_group_again_in_order(tmp_path: Path, redis_url: str) -> None:
    group = {TOPIC: {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k"}}
    # Consumed messages are kept (retention.consumed: false), so the group can read them again.
    topics = {TOPIC: {"queues": QUEUES, "retention": {"consumed": False}}}
    proxy = ProxyProcess(tmp_path, redis_url, {GROUP: group}, topics).start()
    produced: dict[str, int] = {}
    try:
        produce_keyed(redis_url, 400, produced, random.Random(7), keys=40, topic=TOPIC)
        first = consume_all(proxy, 400)
        assert {k: v for k, v in first.items()} == {k: list(range(n)) for k, n in produced.items()}
        deadline = time.monotonic() + 10
        while sum(c or 0 for c in committed(redis_url)) != 400 + QUEUES and time.monotonic() < deadline:
            time.sleep(0.1)
        before = committed(redis_url)
        assert sum(c or 0 for c in before) == 400 + QUEUES  # every queue committed past its last message

        # While the proxy holds the leases: the dry run shows the plan, --execute refuses, naming it.
        dry = ddmq("offsets", "reset", "--redis", redis_url, "--group", GROUP, "--to-earliest")
        assert dry.returncode == 0, dry.stderr
        assert "e2e-proxy" in dry.stdout and "--execute would be refused" in dry.stdout
        assert f"{before[0]:>10} ->          1" in dry.stdout
        refused = ddmq("offsets", "reset", "--redis", redis_url, "--group", GROUP, "--to-earliest", "--execute")
        assert refused.returncode == 1 and "refused, nothing changed" in refused.stderr
        assert "e2e-proxy" in refused.stderr and committed(redis_url) == before
    finally:
        proxy.stop()  # a graceful stop releases the leases at once

    dry = ddmq("offsets", "reset", "--redis", redis_url, "--group", GROUP, "--to-earliest", "--json")
    assert dry.returncode == 0 and committed(redis_url) == before  # a dry run changes nothing
    assert [row["new"] for row in json.loads(dry.stdout)["queues"]] == [1] * QUEUES
    done = ddmq("offsets", "reset", "--redis", redis_url, "--group", GROUP, "--to-earliest", "--execute")
    assert done.returncode == 0, done.stderr
    assert committed(redis_url) == [1] * QUEUES

    proxy.start()
    try:
        again = consume_all(proxy, 400)
    finally:
        proxy.stop()
    assert dict(again) == {k: list(range(n)) for k, n in produced.items()}


def test_reset_by_time_offset_and_latest(redis_url: str) -> None:
    with Producer(redis_url) as producer:
        producer.ensure_topic(TOPIC, 2)
        for i in range(10):
            producer.send(TOPIC, f"old-{i}", qid=i % 2)
        time.sleep(0.05)
        boundary = datetime.now(UTC)
        time.sleep(0.05)
        for i in range(6):
            producer.send(TOPIC, f"new-{i}", qid=i % 2)
    with redis.Redis.from_url(redis_url) as client:
        client.set(keys.committed(GROUP, TOPIC, 0), 9)
        by_time = plan(client, GROUP, Target("time", int(boundary.timestamp() * 1000)))
        assert [(row.qid, row.old, row.new, row.earliest, row.latest) for row in by_time] == [
            (0, 9, 6, 1, 9), (1, None, 6, 1, 9)]
        assert [row.new for row in plan(client, GROUP, Target("latest"), [TOPIC])] == [9, 9]
        assert [row.new for row in plan(client, GROUP, Target("offset", 100), [TOPIC])] == [9, 9]  # clamped
        client.xtrim(keys.stream(TOPIC, 1), maxlen=3, approximate=False)  # offsets 1..5 of queue 1 are gone
        assert [row.new for row in plan(client, GROUP, Target("earliest"), [TOPIC])] == [1, 6]
    iso = boundary.isoformat()
    result = ddmq("offsets", "reset", "--redis", redis_url, "--group", GROUP, "--to-time", iso, "--execute")
    assert result.returncode == 0, result.stderr
    assert committed(redis_url)[:2] == [6, 6]


def test_reset_by_time_and_offset_steps_over_offset_holes(redis_url: str) -> None:
    """Offsets without an entry (deleted with XDEL, or never written: the sequence raised past the
    stream, as a Redis rollback or a foreign entry leaves it) are stepped over, never an error."""
    with Producer(redis_url) as producer:
        producer.ensure_topic(TOPIC, 1)
        for i in range(60):
            producer.send(TOPIC, f"m-{i}", qid=0)
            time.sleep(0.002)  # produce times that grow along the queue
        with redis.Redis.from_url(redis_url) as client:
            stream = keys.stream(TOPIC, 0)
            client.xdel(stream, *[keys.stream_id(o) for o in [1, 2, *range(5, 10), 20, *range(28, 45)]])
            client.set(keys.sequence(TOPIC, 0), 70)  # offsets 61..70 never exist
        for i in range(60, 70):
            producer.send(TOPIC, f"m-{i}", qid=0)
            time.sleep(0.002)
    with redis.Redis.from_url(redis_url) as client:
        entries = [(keys.offset_of(i), int(f[b"ts"])) for i, f in client.xrange(keys.stream(TOPIC, 0))]
        assert entries[0][0] == 3 and entries[-1][0] == 80 and len(entries) == 70 - 25
        stamps = sorted({ts for _, ts in entries})
        for at in [stamps[0] - 1, *stamps, *(ts + 1 for ts in stamps)]:
            expected = next((offset for offset, ts in entries if ts >= at), 81)
            (row,) = plan(client, GROUP, Target("time", at), [TOPIC])
            assert (row.new, row.earliest, row.latest) == (expected, 3, 81), at
        for asked, expected in [(1, 3), (5, 10), (30, 45), (44, 45), (45, 45), (61, 71), (70, 71), (80, 80), (99, 81)]:
            (row,) = plan(client, GROUP, Target("offset", asked), [TOPIC])
            assert row.new == expected, asked
        middle = entries[len(entries) // 2]
    at = datetime.fromtimestamp(middle[1] / 1000, UTC).isoformat()
    result = ddmq("offsets", "reset", "--redis", redis_url, "--group", GROUP, "--topic", TOPIC, "--to-time", at,
                  "--execute")
    assert result.returncode == 0, result.stderr
    first_at_time = next(offset for offset, ts in entries if ts >= middle[1])
    assert committed(redis_url)[0] == first_at_time
    result = ddmq("offsets", "reset", "--redis", redis_url, "--group", GROUP, "--topic", TOPIC, "--to-offset", "33",
                  "--execute")
    assert result.returncode == 0, result.stderr
    assert committed(redis_url)[0] == 45


@pytest.mark.parametrize(("args", "status", "message"), [
    (["--group", "nosuch", "--to-latest"], 1, "group 'nosuch' has no committed offset in any topic"),
    (["--group", GROUP, "--topic", "nope", "--to-latest"], 1, "topic 'nope' does not exist"),
    (["--group", GROUP, "--to-time", "yesterday"], 2, "is not an ISO 8601 time"),
    (["--group", GROUP], 2, "one of the arguments --to-earliest --to-latest --to-offset --to-time is required"),
])
def test_reset_errors(redis_url: str, args: list[str], status: int, message: str) -> None:
    result = ddmq("offsets", "reset", "--redis", redis_url, *args)
    assert result.returncode == status and result.stderr.startswith("ddmq offsets reset: "), result.stderr
    assert message in result.stderr
