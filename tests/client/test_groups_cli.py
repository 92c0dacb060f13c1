"""``ddmq groups list|describe|delete`` through the real CLI, against the group registry real proxy
processes keep in a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from ddmq.client.thrift_client import ProxyClient
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.wire import ConsumeResult, PullRequest

from ..support import ProxyProcess

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC = "cg_del", "t"


def ddmq(redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DDMQ, *args, "--redis", redis_url], capture_output=True, text=True, timeout=60)


def listed(redis_url: str) -> list[dict[str, Any]]:
    result = ddmq(redis_url, "groups", "list", "--json")
    assert result.returncode == 0, result.stderr
    groups: list[dict[str, Any]] = json.loads(result.stdout)
    return groups


def group_keys_left(redis_url: str) -> list[bytes]:
    with redis.Redis.from_url(redis_url) as client:
        found = [key for key in client.scan_iter(match=f"*{GROUP}*", count=1000)]
        if client.sismember(keys.groups(), GROUP):
            found.append(keys.groups().encode())
        return found


def test_groups_list_describe_and_delete(tmp_path: Path, redis_url: str) -> None:
    config = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 0, "timeout_ms": 30_000}}
    proxy = ProxyProcess(tmp_path, redis_url, {GROUP: config}, {TOPIC: {"queues": 2}}).start()
    try:
        deadline = time.monotonic() + 30
        while not any(g["group"] == GROUP and g["members"] for g in listed(redis_url)):
            assert time.monotonic() < deadline, "the proxy never registered its group"
            time.sleep(0.2)
        (entry,) = [g for g in listed(redis_url) if g["group"] == GROUP]
        assert list(entry["topics"]) == [TOPIC] and list(entry["members"]) == ["e2e-proxy"]
        assert abs(entry["last_seen_ms"] - time.time() * 1000) < 30_000
        table = ddmq(redis_url, "groups", "list").stdout
        assert GROUP in table and "members alive" in table and "1 group(s)" in table

        with Producer(redis_url) as producer:
            producer.send_batch(TOPIC, [{"key": f"k{i}", "value": f"v{i}", "qid": 0} for i in range(5)])
        with ProxyClient("127.0.0.1", proxy.port) as client:
            response = client.pull(PullRequest(groupId=GROUP, topic=TOPIC, maxBatchSize=1, maxLingerTime=10_000))
            (message,) = response.messages  # max_retry 0: failing it dead-letters it
            assert client.submit(ConsumeResult(context=response.context, failOffsets=[message.offset]))
        with redis.Redis.from_url(redis_url) as client:
            deadline = time.monotonic() + 30
            while client.xlen(keys.dead_letters(GROUP, TOPIC)) < 1:
                assert time.monotonic() < deadline, "the failed message was not dead-lettered"
                time.sleep(0.1)

        described = json.loads(ddmq(redis_url, "groups", "describe", GROUP, "--json").stdout)
        (topic,) = described["topics"]
        assert (topic["topic"], topic["queues"], topic["produced"], topic["owners"]) == (TOPIC, 2, 5, ["e2e-proxy"])
        assert topic["lag"] == 5 - topic["committed"] and topic["lag"] >= 4
        text = ddmq(redis_url, "groups", "describe", GROUP).stdout
        assert "consumed" in text and "e2e-proxy" in text and "members alive: e2e-proxy" in text

        refused = ddmq(redis_url, "groups", "delete", GROUP)
        assert refused.returncode == 1 and "being consumed" in refused.stderr and "--force" in refused.stderr
        assert "e2e-proxy" in refused.stderr
        assert group_keys_left(redis_url)  # nothing deleted
    finally:
        proxy.stop()  # leaves the group and releases its leases

    deleted = ddmq(redis_url, "groups", "delete", GROUP)
    assert deleted.returncode == 0, deleted.stderr
    assert f"deleted group {GROUP}" in deleted.stdout and "1 dead letter(s)" in deleted.stdout, deleted.stdout
    assert group_keys_left(redis_url) == []
    assert all(g["group"] != GROUP for g in listed(redis_url))
    with redis.Redis.from_url(redis_url) as client:
        # the topic's messages are not the group's (consumed ones may be trimmed: its offsets stay)
        assert client.get(keys.sequence(TOPIC, 0)) == b"5" and client.exists(keys.stream(TOPIC, 0))
    unknown = ddmq(redis_url, "groups", "describe", GROUP)
    assert unknown.returncode == 1 and "unknown" in unknown.stderr


def test_groups_delete_force_breaks_the_leases_of_a_running_proxy(tmp_path: Path, redis_url: str) -> None:
    config = {TOPIC: {"actions": ["PullServer"], "timeout_ms": 30_000}}
    proxy = ProxyProcess(tmp_path, redis_url, {GROUP: config}, {TOPIC: {"queues": 2}}).start()
    try:
        with redis.Redis.from_url(redis_url) as client:
            deadline = time.monotonic() + 30
            while not (client.exists(keys.lease(GROUP, TOPIC, 0)) and client.exists(keys.lease(GROUP, TOPIC, 1))):
                assert time.monotonic() < deadline, "the proxy never claimed its queues"
                time.sleep(0.1)
        forced = ddmq(redis_url, "groups", "delete", GROUP, "--force", "--json")
        assert forced.returncode == 0, forced.stderr
        report = json.loads(forced.stdout)
        assert report["leases_broken"] == [f"{TOPIC}#0", f"{TOPIC}#1"] and report["keys_deleted"] > 0
        with redis.Redis.from_url(redis_url) as client:
            assert client.exists(keys.lease_term(GROUP, TOPIC, 0))  # fencing tokens keep growing
    finally:
        proxy.stop()
