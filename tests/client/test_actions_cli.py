"""Every operator action is on record: pauses and resumes (HTTP and ``ddmq groups``), replays (paced
or not; a dry run is not an action), purges, key actions and offset resets, each with who and what,
read back by ``ddmq actions`` and ``GET /admin/actions``; the record stays bounded; ``--rate`` paces
a replay, and the replayed letters still come back whole and in each key's order.
A real proxy process, real Redis, the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from ddmq.client.consumer import PullConsumer
from ddmq.client.pull_parts import ConsumedMessage
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys, stream_entry
from ddmq.protocol.redis.actions import MAX_KEPT, record_action_sync

from ..support import ProxyProcess, until

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC, QUEUES = "g", "t", 2
KEYS = [f"k{i}" for i in range(6)]
PER_KEY = 10


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    group = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 0, "timeout_ms": 30_000}}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port()}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": QUEUES}}, http=http).start()
    process.http_url = f"http://127.0.0.1:{http['port']}"  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.stop()


def ddmq(proxy: ProxyProcess, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDMQ_HTTP": proxy.http_url, "DDMQ_REDIS": redis_url}  # type: ignore[attr-defined]
    env.pop("DDMQ_ADMIN_TOKEN", None)
    return subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=120, env=env)


def http(proxy: ProxyProcess, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(proxy.http_url + path, method=method,  # type: ignore[attr-defined]
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Handler:
    """Fails every message while ``failing`` (to fill the dead letters); records what it acks, per key."""

    def __init__(self) -> None:
        self.failing = True
        self.seen: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def __call__(self, message: ConsumedMessage) -> bool:
        if self.failing:
            return False
        with self.lock:
            self.seen.setdefault(message.key, []).append(message.value.decode())
        return True

    def acked(self) -> int:
        with self.lock:
            return sum(map(len, self.seen.values()))


async def _dead_lettered(proxy: ProxyProcess, redis_url: str,
                         handler: Handler) -> tuple[PullConsumer, threading.Thread]:
    """Every produced message dead-lettered (the handler fails them all): the consumer, still running."""
    with Producer(redis_url) as producer:
        for n in range(PER_KEY):
            for key in KEYS:
                producer.send(TOPIC, f"{key}:{n}", key=key)
    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, handler, threads=2)
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    client = redis.Redis.from_url(redis_url)
    total = len(KEYS) * PER_KEY
    await until("every message dead-lettered", lambda: client.xlen(keys.dead_letters(GROUP, TOPIC)) == total, 60)
    return consumer, runner


def _ends(redis_url: str) -> list[int]:
    """Each queue's last offset."""
    with redis.Redis.from_url(redis_url) as client:
        return [int(client.get(keys.sequence(TOPIC, qid)) or 0) for qid in range(QUEUES)]


def _produced_after(redis_url: str, ends: list[int]) -> list[tuple[int, str, str]]:
    """(produce time in ms, key, value) of every entry past ``ends``, queue by queue in offset order."""
    with redis.Redis.from_url(redis_url) as client:
        return [(int(f[stream_entry.PRODUCE_TIME]), f[stream_entry.KEY].decode(), f[stream_entry.VALUE].decode())
                for qid in range(QUEUES)
                for _, f in client.xrange(keys.stream(TOPIC, qid), min=keys.stream_id_after(ends[qid]))]


async def test_every_action_kind_is_recorded_with_who_and_what(proxy: ProxyProcess, redis_url: str) -> None:
    handler = Handler()
    consumer, _ = await _dead_lettered(proxy, redis_url, handler)
    await until("the HTTP API ready", lambda: _ready(proxy), 30)
    try:
        assert http(proxy, "POST", f"/admin/groups/{GROUP}/pause", {"topic": TOPIC, "by": "alice"})[0] == 200
        assert http(proxy, "POST", f"/admin/groups/{GROUP}/resume", {"topic": TOPIC})[0] == 200
        for args in (("groups", "pause", GROUP, "--for", "10m"), ("groups", "resume", GROUP)):
            done = ddmq(proxy, redis_url, *args)
            assert done.returncode == 0, done.stderr
        letters = ["dead-letters", "replay", "--group", GROUP, "--topic", TOPIC]
        page = json.loads(ddmq(proxy, redis_url, "dead-letters", "list", "--group", GROUP, "--topic", TOPIC,
                               "--json").stdout)
        one = page["entries"][0]
        assert ddmq(proxy, redis_url, *letters, "--all", "--dry-run").returncode == 0  # not an action
        assert ddmq(proxy, redis_url, *letters, "--id", one["id"]).returncode == 0
        purge = ["dead-letters", "purge", "--group", GROUP, "--topic", TOPIC, "--id", page["entries"][1]["id"]]
        assert ddmq(proxy, redis_url, *purge).returncode == 0
        for verb in ("park", "resume"):
            done = ddmq(proxy, redis_url, "keys", verb, "--group", GROUP, "--topic", TOPIC, "--key", "k-new")
            assert done.returncode == 0, done.stdout + done.stderr
        reset = ddmq(proxy, redis_url, "offsets", "reset", "--group", "idle-group", "--topic", TOPIC,
                     "--to-latest", "--execute")
        assert reset.returncode == 0, reset.stderr

        letters_path = f"/admin/groups/{GROUP}/topics/{TOPIC}/dead-letters"
        for body in ({"all": True, "rate": 0}, {"all": True, "rate": 100_001}, {"all": True, "rate": "5"}):
            assert http(proxy, "POST", letters_path + "/replay", body)[0] == 400, body  # refused: not recorded
        assert http(proxy, "POST", letters_path + "/purge", {"all": True, "rate": 5})[0] == 400
        assert http(proxy, "GET", "/admin/actions?group=" + "x" * 201)[0] == 400

        listed = ddmq(proxy, redis_url, "actions", "--json")
        assert listed.returncode == 0, listed.stderr
        found = json.loads(listed.stdout)["actions"]
        kinds = [a["action"] for a in reversed(found)]
        assert kinds == ["pause", "resume", "pause", "resume", "replay", "purge", "key park", "key resume",
                         "offsets reset"], kinds
        by_kind = {a["action"] + str(i): a for i, a in enumerate(reversed(found))}
        http_pause = by_kind["pause0"]
        assert http_pause["who"] == "loopback 127.0.0.1" and http_pause["detail"]["by"] == "alice"
        assert http_pause["group"] == GROUP and http_pause["topic"] == TOPIC
        assert by_kind["pause2"]["who"].endswith("(ddmq)") and by_kind["pause2"]["detail"]["for_ms"] == 600_000
        assert by_kind["replay4"]["detail"]["ids"] == [one["id"]] and by_kind["replay4"]["detail"]["replayed"] == 1
        assert by_kind["purge5"]["detail"]["purged"] == 1
        assert by_kind["key park6"]["detail"]["key"] == "k-new"
        assert by_kind["offsets reset8"]["group"] == "idle-group"
        assert by_kind["offsets reset8"]["detail"]["to"] == {"kind": "latest", "value": 0}
        assert all(a["at_ms"] > 0 for a in found)
        assert "operator action: pause on g/t by \"loopback 127.0.0.1\"" in proxy.log()

        table = ddmq(proxy, redis_url, "actions", "--group", GROUP, "--limit", "3")
        assert table.returncode == 0 and table.stdout.count("\n") == 4, table.stdout  # header + 3 rows
        assert "key resume" in table.stdout and "offsets reset" not in table.stdout

        status, answer = http(proxy, "GET", "/admin/actions?limit=2")
        assert status == 200 and [a["action"] for a in answer["actions"]] == ["offsets reset", "key resume"]
        assert http(proxy, "GET", "/admin/actions?limit=0")[0] == 400
        assert http(proxy, "GET", f"/admin/actions?limit={MAX_KEPT + 1}")[0] == 400
    finally:
        consumer.stop()


def _ready(proxy: ProxyProcess) -> bool:
    try:
        return http(proxy, "GET", "/readyz")[0] == 200
    except OSError:  # the HTTP server may listen a moment after the Thrift one
        return False


async def test_the_record_is_bounded(proxy: ProxyProcess, redis_url: str) -> None:
    await until("the HTTP API ready", lambda: _ready(proxy), 30)
    with redis.Redis.from_url(redis_url) as client:
        for n in range(1200):
            record_action_sync(client, "x" * 500, "pause", group=GROUP, detail={"n": n, "text": "y" * 5000})
        assert client.xlen(keys.actions()) == MAX_KEPT
    status, shown = http(proxy, "GET", f"/admin/actions?limit={MAX_KEPT}")
    assert status == 200 and 0 < len(shown["actions"]) <= MAX_KEPT
    assert len(json.dumps(shown)) <= 4 * 1024 * 1024  # http.max_answer_bytes' default
    assert shown["actions"][0]["detail"]["n"] == 1199


async def test_rate_paces_a_replay_and_keeps_each_key_whole_and_in_order(proxy: ProxyProcess,
                                                                          redis_url: str) -> None:
    handler = Handler()
    consumer, runner = await _dead_lettered(proxy, redis_url, handler)
    consumer.stop()  # the replayed entries stay in their queues until a consumer comes again
    await asyncio.to_thread(runner.join, 30)
    assert not runner.is_alive()
    total, rate = len(KEYS) * PER_KEY, 20
    ends = _ends(redis_url)
    args = ["dead-letters", "replay", "--group", GROUP, "--topic", TOPIC]
    refused = ddmq(proxy, redis_url, *args, "--all", "--rate", "0")
    assert refused.returncode != 0 and "1..100000" in refused.stderr
    done = ddmq(proxy, redis_url, *args, "--all", "--rate", str(rate))
    assert done.returncode == 0, done.stderr
    assert f"replayed {total} dead letter(s)" in done.stdout
    replayed = _produced_after(redis_url, ends)
    assert len(replayed) == total
    for key in KEYS:  # every letter back, each key's in its order
        assert [value for _, k, value in replayed if k == key] == [f"{key}:{n}" for n in range(PER_KEY)]
    times = sorted(t for t, _, _ in replayed)
    # No one-second window holds more than the rate and one step (a tenth of it), with a little slack.
    busiest = max(sum(1 for t in times if start <= t < start + 1000) for start in times)
    assert busiest <= rate + rate // 10 + 2, busiest
    assert times[-1] - times[0] >= 1000  # 60 messages at 20/s are spread over more than a second
    (replay,) = [a for a in json.loads(ddmq(proxy, redis_url, "actions", "--json").stdout)["actions"]]
    assert replay["action"] == "replay" and replay["detail"]["rate"] == rate and replay["detail"]["all"] is True

    handler.failing = False
    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, handler, threads=2)
    threading.Thread(target=consumer.run, daemon=True).start()
    try:
        await until("every replayed message delivered and acked", lambda: handler.acked() >= total, 60)
        assert handler.seen == {key: [f"{key}:{n}" for n in range(PER_KEY)] for key in KEYS}
    finally:
        consumer.stop()
