"""A dead-letter replay reaches only its group (docs/failures.md, "What a replay reaches").

Two groups consume one topic: ``cg_a`` dead-letters the pickups of some riders, ``cg_b`` finishes every
message. ``cg_a``'s dead letters are replayed with the real CLI (one id, ``--key``, ``--all``); each comes
back to ``cg_a`` once more (after its successors under ``dead_letter``, in its key's order under
``dead_letter_key``) and ``cg_b`` gets nothing more, while its committed offsets still reach the end of
every queue. Also on a Redis Cluster, and through a kill -9 of the proxy in the middle of a paced replay.
A real proxy process, real Redis, the SDK's consumers over Thrift.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ddmq.client.consumer import PullConsumer
from ddmq.client.pull_parts import ConsumedMessage
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import sync_redis

from ..support import ProxyProcess, until

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
TOPIC, QUEUES = "rides", 4
A, B = "cg_a", "cg_b"
STORY = ("call", "pickup", "pay")
#: Long enough that nothing times out by itself: every redelivery here is a fail or a proxy's death.
TIMEOUT_MS = 30_000


class Recorder:
    """A group's handler: fails the pickups of ``broken`` riders while ``failing``, acks the rest, and
    records every acked value per rider in the order acked."""

    def __init__(self, broken: set[str] = frozenset()) -> None:  # type: ignore[assignment]
        self.broken = broken
        self.failing = bool(broken)
        self.seen: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def __call__(self, message: ConsumedMessage) -> bool:
        value = message.value.decode()
        if self.failing and message.key in self.broken and value == "pickup":
            return False
        with self.lock:
            self.seen.setdefault(message.key, []).append(value)
        return True

    def acked(self) -> int:
        with self.lock:
            return sum(map(len, self.seen.values()))

    def story(self) -> dict[str, list[str]]:
        with self.lock:
            return {rider: list(values) for rider, values in self.seen.items()}


def start_proxy(tmp_path: Path, redis_url: str, policy: str) -> ProxyProcess:
    failing = {"order_key": "KEY", "max_retry": 0, "on_exhausted": policy, "timeout_ms": TIMEOUT_MS}
    groups = {A: {TOPIC: failing}, B: {TOPIC: {"order_key": "KEY", "timeout_ms": TIMEOUT_MS}}}
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port()}
    process = ProxyProcess(tmp_path, redis_url, groups, {TOPIC: {"queues": QUEUES}}, http=http).start()
    process.http_url = f"http://127.0.0.1:{http['port']}"  # type: ignore[attr-defined]
    return process


def ddmq(proxy: ProxyProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DDMQ, "dead-letters", *args, "--group", A, "--topic", TOPIC],
                          capture_output=True, text=True, timeout=120, env=_cli_env(proxy))


def _cli_env(proxy: ProxyProcess) -> dict[str, str]:
    env = {**os.environ, "DDMQ_HTTP": proxy.http_url}  # type: ignore[attr-defined]
    env.pop("DDMQ_ADMIN_TOKEN", None)
    return env


@contextmanager
def consuming(proxy: ProxyProcess, group: str, handler: Recorder) -> Iterator[None]:
    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", group, handler, topic=TOPIC, threads=2)
    runner = threading.Thread(target=consumer.run, daemon=True)
    runner.start()
    try:
        yield
    finally:
        consumer.stop()
        runner.join(30)


class Topic:
    """What Redis holds: produced and committed offsets, dead letters, replayed entries."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url

    def committed_everything(self, group: str) -> bool:
        with sync_redis(self.redis_url) as client:
            for qid in range(QUEUES):
                produced = int(client.get(keys.sequence(TOPIC, qid)) or 0) + 1
                if int(client.get(keys.committed(group, TOPIC, qid)) or 0) != produced:
                    return False
        return True

    def dead(self, group: str = A) -> int:
        with sync_redis(self.redis_url) as client:
            return int(client.xlen(keys.dead_letters(group, TOPIC)))

    def claims(self) -> int:
        with sync_redis(self.redis_url) as client:
            return int(client.xlen(keys.dead_letter_claims(A, TOPIC)))

    def produced(self) -> int:
        """Messages produced into the topic so far (its queues' sequence numbers: retention trims
        the entries every group finished, so counting entries would miss replayed ones)."""
        with sync_redis(self.redis_url) as client:
            return sum(int(client.get(keys.sequence(TOPIC, qid)) or 0) for qid in range(QUEUES))


def other_groups_replays(proxy: ProxyProcess, group: str) -> float:
    """``group``'s count of other groups' replays it took as finished, from the proxy's /metrics."""
    with urllib.request.urlopen(proxy.http_url + "/metrics", timeout=10) as answer:  # type: ignore[attr-defined]
        text = answer.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "ddmq_consumer_events_total"
        and sample.labels.get("group") == group and sample.labels.get("event") == "other_groups_replays"
    )


def produce(redis_url: str, riders: list[str]) -> None:
    with Producer(redis_url) as producer:
        producer.send_batch(TOPIC, [{"key": rider, "value": event} for event in STORY for rider in riders])


async def produce_and_settle(url: str, riders: list[str], topic: Topic, a: Recorder, b: Recorder,
                             letters: int) -> None:
    """Each rider's story produced; then, before any replay: cg_b acked and committed everything, cg_a
    dead-lettered ``letters`` messages, acked the rest and committed everything."""
    produce(url, riders)
    everything = len(riders) * len(STORY)
    await until("cg_b finished and committed every message",
                lambda: b.acked() == everything and topic.committed_everything(B), 60)
    await until(f"cg_a dead-lettered {letters} messages", lambda: topic.dead() == letters, 60)
    await until("cg_a acked the rest", lambda: a.acked() == everything - letters, 60)
    await until("cg_a committed every message", lambda: topic.committed_everything(A), 60)


@pytest.fixture(params=["redis", "cluster"])
def broker_url(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("redis_url" if request.param == "redis" else "cluster_url"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("policy", ["dead_letter", "dead_letter_key"])
async def test_a_replay_reaches_its_group_once_and_no_other_group(
    tmp_path: Path, broker_url: str, policy: str
) -> None:
    riders = [f"r{i}" for i in range(30)]
    broken = set(riders[::5])
    sequenced = policy == "dead_letter_key"  # a broken rider's pay is dead-lettered behind its pickup
    letters = len(broken) * (2 if sequenced else 1)
    topic = Topic(broker_url)
    proxy = start_proxy(tmp_path, broker_url, policy)
    a, b = Recorder(broken), Recorder()
    try:
        with consuming(proxy, A, a), consuming(proxy, B, b):
            everything = len(riders) * len(STORY)
            await produce_and_settle(broker_url, riders, topic, a, b, letters)
            a.failing = False
            before = topic.produced()

            first, second, *_ = sorted(broken)
            if sequenced:  # one id of a sequenced key is refused (its successors would overtake it)
                by_id = ddmq(proxy, "replay", "--id", _ids_of(proxy, first)[0])
                assert by_id.returncode == 1 and "replayed 0 dead letter(s)" in by_id.stdout, by_id
                assert f"replay --key {first} or --all" in by_id.stdout, by_id
            else:
                (one,) = _ids_of(proxy, first)
                by_id = ddmq(proxy, "replay", "--id", one)
                assert by_id.returncode == 0 and "replayed 1 dead letter(s)" in by_id.stdout, by_id
            by_key = ddmq(proxy, "replay", "--key", second)
            assert by_key.returncode == 0, by_key
            assert f"replayed {2 if sequenced else 1} dead letter(s)" in by_key.stdout, by_key
            rest = ddmq(proxy, "replay", "--all")
            assert rest.returncode == 0, rest
            left = letters - (0 if sequenced else 1) - (2 if sequenced else 1)
            assert f"replayed {left} dead letter(s)" in rest.stdout, rest

            await until("every replayed message acked by cg_a", lambda: a.acked() == everything, 60)
            await until("cg_b read past every replay", lambda: topic.committed_everything(B), 60)
            await until("cg_a committed every message", lambda: topic.committed_everything(A), 60)
            assert topic.produced() == before + letters  # each dead letter produced once
            assert topic.dead() == 0
            assert b.acked() == everything, "cg_b received a replay of cg_a's dead letters"
            assert b.story() == {rider: list(STORY) for rider in riders}
            assert other_groups_replays(proxy, B) == letters
            assert other_groups_replays(proxy, A) == 0
        expected = {rider: (["call", "pay", "pickup"] if rider in broken and not sequenced else list(STORY))
                    for rider in riders}
        assert a.story() == expected  # each replayed message once, where the policy puts it
    finally:
        proxy.stop()


@pytest.mark.timeout(240)
async def test_a_proxy_killed_mid_replay_loses_and_doubles_nothing_and_other_groups_see_nothing(
    tmp_path: Path, redis_url: str
) -> None:
    riders = [f"r{i}" for i in range(200)]
    topic = Topic(redis_url)
    proxy = start_proxy(tmp_path, redis_url, "dead_letter")
    a, b = Recorder(set(riders)), Recorder()
    try:
        with consuming(proxy, A, a), consuming(proxy, B, b):
            everything = len(riders) * len(STORY)
            await produce_and_settle(redis_url, riders, topic, a, b, len(riders))
            a.failing = False
            before = topic.produced()
            # 200 at 40 a second: five seconds, in steps of four
            paced = await asyncio.create_subprocess_exec(
                *DDMQ, "dead-letters", "replay", "--all", "--rate", "40", "--group", A, "--topic", TOPIC,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_cli_env(proxy))
            try:
                await until("the paced replay under way", lambda: topic.produced() >= before + 20, 60)
                proxy.kill()
                async with asyncio.timeout(60):
                    _, stderr = await paced.communicate()
            finally:
                if paced.returncode is None:
                    paced.kill()
                    await paced.wait()
            assert paced.returncode == 1, stderr
            midway = topic.produced() - before
            assert 20 <= midway < len(riders), midway
            proxy.start()
            rest = ddmq(proxy, "replay", "--all")
            assert rest.returncode == 0, rest
            await until("every replayed pickup acked by cg_a", lambda: _acked_pickups(a) >= set(riders), 60)
            await until("cg_b read past every replay", lambda: topic.committed_everything(B), 60)
            assert topic.produced() == before + len(riders)  # each dead letter produced once, whatever was claimed
            assert topic.dead() == 0 and topic.claims() == 0
            assert b.acked() == everything, "cg_b received a replay of cg_a's dead letters"
            assert b.story() == {rider: list(STORY) for rider in riders}
    finally:
        proxy.stop()
    # The kill may deliver again a replayed pickup that cg_a had not committed yet (at least once): a
    # rider's events as cg_a acked them, repeats removed, are call, pay, pickup.
    for rider, values in a.story().items():
        assert [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]] == ["call", "pay", "pickup"], (
            rider, values)


def _acked_pickups(recorder: Recorder) -> set[str]:
    return {rider for rider, values in recorder.story().items() if "pickup" in values}


def _ids_of(proxy: ProxyProcess, rider: str) -> list[str]:
    listed = ddmq(proxy, "list", "--json")
    assert listed.returncode == 0, listed
    return [entry["id"] for entry in json.loads(listed.stdout)["entries"] if entry["key"] == rider]

