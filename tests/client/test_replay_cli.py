"""``ddmq dead-letters replay --all`` on a ``dead_letter_key`` group does what it says: every replayed
key's mark is lifted, each key's dead letters come back in order and are delivered, nothing is
dead-lettered again; a replay that cannot be done is refused, and ``--dry-run`` touches nothing.
A real proxy process, real Redis, the real CLI."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from ddmq.client.consumer import PullConsumer
from ddmq.client.pull_parts import ConsumedMessage
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys

from ..support import ProxyProcess, until

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC = "g", "t"
RIDERS = [f"rider-{i}" for i in range(10)]
STORY = ("pickup", "pay")


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    group = {TOPIC: {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 0,
                     "on_exhausted": "dead_letter_key", "timeout_ms": 30_000}}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port()}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 2}}, http=http).start()
    process.http_url = f"http://127.0.0.1:{http['port']}"  # type: ignore[attr-defined]
    try:
        yield process
    finally:
        process.stop()


def ddmq(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DDMQ_HTTP": proxy.http_url}  # type: ignore[attr-defined]
    env.pop("DDMQ_ADMIN_TOKEN", None)
    return subprocess.run([*DDMQ, "dead-letters", *args, "--group", GROUP, "--topic", TOPIC],
                          capture_output=True, text=True, timeout=60, env=env)


class Handler:
    """Fails every message while ``failing``; records what it acks, per key."""

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


async def test_replay_all_lifts_every_mark_and_delivers_each_key_in_order(proxy: ProxyProcess,
                                                                          redis_url: str) -> None:
    with Producer(redis_url) as producer:
        for event in STORY:
            for rider in RIDERS:
                producer.send(TOPIC, event, key=rider)
    handler = Handler()
    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, handler, threads=2)
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    letters = redis.Redis.from_url(redis_url)
    try:
        total = len(RIDERS) * len(STORY)

        def dead() -> int:
            return int(letters.xlen(keys.dead_letters(GROUP, TOPIC)))

        await until("every message dead-lettered (pickup failed, pay sequenced)", lambda: dead() == total, 30)

        dry = ddmq(proxy, "replay", "--all", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert (f"dry run: would replay {total} dead letter(s) of {len(RIDERS)} key(s) into {TOPIC}, lifting the "
                f"mark of {len(RIDERS)} key(s) first; nothing changed") in dry.stdout
        purge = ddmq(proxy, "purge", "--all", "--dry-run")
        assert purge.returncode == 0 and f"would purge {total} dead letter(s)" in purge.stdout, purge
        assert dead() == total

        page = json.loads(ddmq(proxy, "list", "--json").stdout)
        one = page["entries"][0]
        refused = ddmq(proxy, "replay", "--id", one["id"])
        assert refused.returncode == 1 and "replayed 0 dead letter(s)" in refused.stdout, refused
        assert f"refused 1 dead letter(s) of key {one['key']}: " in refused.stdout
        assert f"replay --key {one['key']} or --all" in refused.stdout
        assert dead() == total

        handler.failing = False
        replayed = ddmq(proxy, "replay", "--all")
        assert replayed.returncode == 0, replayed
        assert f"replayed {total} dead letter(s) into {TOPIC} ({len(RIDERS)} key(s) resumed first)" in replayed.stdout
        await until("every replayed message delivered and acked", lambda: handler.acked() >= total, 30)
        assert handler.seen == {rider: list(STORY) for rider in RIDERS}  # each key in order, none lost
        assert dead() == 0
        again = ddmq(proxy, "replay", "--all", "--dry-run")
        assert "would replay 0 dead letter(s)" in again.stdout
    finally:
        consumer.stop()
        await asyncio.to_thread(runner.join, 30)
        letters.close()
