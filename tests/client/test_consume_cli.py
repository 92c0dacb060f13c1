"""``ddmq consume`` and the pull consumers as users meet them: a closed pipe, errors that retrying cannot
cure (unknown group or topic, the HTTP port), retriable ones, and the blocking ``run()``/``wait()``.
Real proxy processes, real sockets, the real CLI in a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from ddmq.client.cli.status import group_status
from ddmq.client.consumer import AsyncPullConsumer, ConsumedMessage, PullConsumer
from ddmq.client.pull_parts import Backoff
from ddmq.client.thrift_client import ProxyClientError, PullError, WrongPortError
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys

from ..support import ProxyProcess, produce_keyed

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
GROUP, TOPIC = "g", "t"


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    group = {TOPIC: {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 1000,
                     "max_retry": 1, "retry_intervals_ms": [50]}}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 4}},
                           http={"enabled": True, "host": "127.0.0.1", "port": free_port()}).start()
    try:
        yield process
    finally:
        process.stop()


def server(proxy: ProxyProcess) -> str:
    return f"127.0.0.1:{proxy.port}"


def http_port(proxy: ProxyProcess) -> int:
    port: int = yaml.safe_load(proxy.config_path.read_text())["http"]["port"]
    return port


def lag(redis_url: str) -> int:
    with redis.Redis.from_url(redis_url) as client:
        return sum(q.lag for q in group_status(client, GROUP, [TOPIC]).queues)


def dead_letters(redis_url: str) -> int:
    with redis.Redis.from_url(redis_url) as client:
        count: int = client.xlen(keys.dead_letters(GROUP, TOPIC))
        return count


def test_consume_into_head_exits_at_once_and_dead_letters_nothing(proxy: ProxyProcess, redis_url: str) -> None:
    produce_keyed(redis_url, 300, {}, random.Random(1), keys=30, topic=TOPIC)
    with subprocess.Popen([*DDMQ, "consume", "--servers", server(proxy), "--group", GROUP],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as consume:
        assert consume.stdout is not None and consume.stderr is not None
        head = subprocess.run(["head", "-1"], stdin=consume.stdout, capture_output=True, timeout=30, check=True)
        consume.stdout.close()  # head held the only other reading end, and it has exited
        assert consume.wait(timeout=10) == 1  # Python's status for an end on a closed pipe
        stderr = consume.stderr.read().decode()
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
    assert head.stdout.decode().count("\n") == 1 and '"topic": "t"' in head.stdout.decode()
    # What was pulled but not printed comes back after timeout_ms; it is never failed nor dead-lettered:
    # a second consumer drains every queue (lag 0) and the dead-letter stream stays empty.
    delivered: list[ConsumedMessage] = []
    consumer = PullConsumer(server(proxy), GROUP, lambda m: delivered.append(m) is None, threads=2)
    with consumer:
        deadline = time.monotonic() + 30
        while lag(redis_url) and time.monotonic() < deadline:
            time.sleep(0.2)
        consumer.stop()
    assert lag(redis_url) == 0 and consumer.stats.failed == 0 and delivered
    assert dead_letters(redis_url) == 0


@pytest.fixture
def proxy_3s(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    """As ``proxy``, with a 3 s timeout_ms: room for a loaded machine, short enough that what a run
    leaves unanswered times out during the next runs."""
    group = {TOPIC: {"actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 3000,
                     "max_retry": 1, "retry_intervals_ms": [50]}}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": 4}},
                           http={"enabled": True, "host": "127.0.0.1", "port": free_port()}).start()
    try:
        yield process
    finally:
        process.stop()


def test_consume_into_head_ten_times_releases_what_it_did_not_print(proxy_3s: ProxyProcess, redis_url: str) -> None:
    """`ddmq consume | head -1`, again and again on the same backlog: what each run pulled but did not
    print is released, so nothing wears out (the group's timeout_ms is 3 s and max_retry 1: without
    releases, the messages of one run time out as failed attempts during the next runs, which
    dead-letter them or find them counted)."""
    proxy = proxy_3s
    produced: dict[str, int] = {}
    produce_keyed(redis_url, 300, produced, random.Random(2), keys=30, topic=TOPIC)
    command = (f"{' '.join(DDMQ)} consume --servers {server(proxy)} --group {GROUP} --batch-size 16 "
               "--group-timeout-ms 3000 | head -1")
    printed = []
    for _ in range(10):
        run = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, check=True)
        assert "Traceback" not in run.stderr, run.stderr
        printed.append(json.loads(run.stdout))
    assert len({(line["qid"], line["offset"]) for line in printed}) == 10  # each run printed a new message
    # Every key the proxy still holds has its head, the key's next message, back to waiting with no
    # attempt counted. Not every key need be listed: `ddmq consume` may write (and ack) a few lines into
    # the pipe before `head` exits, so a short key can be consumed whole without being shown.
    answer = _admin_json(proxy, f"/admin/groups/{GROUP}/blocked-keys?topic={TOPIC}&limit=100")
    heads = {key["order_key"]: (key["state"], key["head"]["attempts"]) for key in answer["keys"]}
    assert heads and set(heads) <= set(produced), heads
    assert set(heads.values()) == {("waiting", 0)}, (heads, dead_letters(redis_url))
    assert dead_letters(redis_url) == 0


def test_consume_stopped_by_ctrl_c_releases_what_it_did_not_print(proxy: ProxyProcess, redis_url: str) -> None:
    produce_keyed(redis_url, 100, {}, random.Random(3), keys=10, topic=TOPIC)
    # A slow reader: the command blocks writing into a full pipe, holding a pulled batch meanwhile.
    with subprocess.Popen([*DDMQ, "consume", "--servers", server(proxy), "--group", GROUP, "--batch-size", "16"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as consume:
        assert consume.stdout is not None and consume.stderr is not None
        first = json.loads(consume.stdout.readline())
        consume.send_signal(signal.SIGINT)
        rest = consume.stdout.read().decode().splitlines()
        assert consume.wait(timeout=10) == 130
        stderr = consume.stderr.read().decode()
    assert "Traceback" not in stderr, stderr
    printed = 1 + len(rest)
    answer = _admin_json(proxy, f"/admin/groups/{GROUP}/blocked-keys?topic={TOPIC}&limit=100")
    heads = {key["order_key"]: (key["state"], key["head"]["attempts"]) for key in answer["keys"]}
    assert heads and set(heads.values()) == {("waiting", 0)}, (heads, stderr[-3000:])
    assert sum(key["chain_length"] for key in answer["keys"]) == 100 - printed, (first, rest)


def _admin_json(proxy: ProxyProcess, path: str) -> dict[str, Any]:
    from urllib.request import urlopen

    with urlopen(f"http://127.0.0.1:{http_port(proxy)}{path}", timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def test_consume_sees_a_closed_pipe_while_idle(proxy: ProxyProcess) -> None:
    """Nothing to print: the closed pipe is noticed without writing, and the command ends."""
    with subprocess.Popen([*DDMQ, "consume", "--servers", server(proxy), "--group", GROUP],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as consume:
        assert consume.stdout is not None and consume.stderr is not None
        time.sleep(0.5)
        consume.stdout.close()
        assert consume.wait(timeout=10) == 1
        assert consume.stderr.read() == b""


@pytest.mark.parametrize(("args", "expected"), [
    (["--group", "nosuch"], "unknown group 'nosuch'"),
    (["--group", GROUP, "--topic", "nope"], "group 'g' does not consume topic 'nope'"),
])
def test_consume_of_unknown_group_or_topic_exits_non_zero_at_once(
    proxy: ProxyProcess, args: list[str], expected: str
) -> None:
    started = time.monotonic()
    result = subprocess.run([*DDMQ, "consume", "--servers", server(proxy), *args],
                            capture_output=True, text=True, timeout=10)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith(f"ddmq consume: {expected}") and result.stderr.count("\n") == 1, result.stderr
    assert time.monotonic() - started < 10


def test_consume_pointed_at_the_http_port_says_so(proxy: ProxyProcess) -> None:
    port = http_port(proxy)
    result = subprocess.run([*DDMQ, "consume", "--group", GROUP],
                            env={**os.environ, "DDMQ_SERVERS": f"127.0.0.1:{port}"},
                            capture_output=True, text=True, timeout=10)
    assert result.returncode == 1
    assert "answered in HTTP" in result.stderr and "Thrift port" in result.stderr, result.stderr


def test_pull_consumer_stops_on_a_fatal_error_and_raises_it(proxy: ProxyProcess) -> None:
    seen: list[ProxyClientError] = []
    consumer = PullConsumer(server(proxy), "nosuch", lambda m: True, threads=3, on_error=seen.append)
    with pytest.raises(PullError) as caught:
        consumer.run()
    assert caught.value.code == 1001 and not caught.value.retriable
    assert seen == [caught.value] and consumer.error is caught.value and not consumer.running
    # The context manager raises it too (once), when the block ends without an error of its own.
    other = PullConsumer(server(proxy), "nosuch", lambda m: True)
    with pytest.raises(PullError), other:
        while other.running:
            time.sleep(0.05)


def test_pull_consumer_keeps_retrying_what_may_recover(proxy: ProxyProcess) -> None:
    """A refused connection is retriable: the consumer backs off and keeps running until stopped."""
    consumer = PullConsumer(f"127.0.0.1:{free_port()}", GROUP, lambda m: True, retry_sleep_ms=10)
    consumer.start()
    assert consumer.wait(1.0) is False
    assert consumer.running and consumer.error is None and consumer.stats.errors >= 2
    consumer.stop()
    assert consumer.wait(5.0) is True


async def test_async_pull_consumer_raises_the_fatal_error(proxy: ProxyProcess) -> None:
    async def ok(message: ConsumedMessage) -> bool:
        return True

    seen: list[ProxyClientError] = []
    port = http_port(proxy)
    consumer = AsyncPullConsumer(f"127.0.0.1:{port}", GROUP, ok, concurrency=2, on_error=seen.append)
    with pytest.raises(WrongPortError):
        async with asyncio.timeout(10):
            await consumer.run()
    assert seen and consumer.error is seen[0] and not consumer.running


@pytest.mark.both_loops
async def test_async_pull_consumer_wait_returns_after_stop(proxy: ProxyProcess, redis_url: str) -> None:
    produce_keyed(redis_url, 20, {}, random.Random(2), keys=5, topic=TOPIC)
    got: list[int] = []
    policy = asyncio.get_event_loop_policy()
    consumer = AsyncPullConsumer(server(proxy), GROUP, lambda m: _record(got, m, consumer))
    async with asyncio.timeout(20):
        await consumer.run()
    assert len(got) >= 20 and consumer.error is None
    assert asyncio.get_event_loop_policy() is policy  # the SDK runs on the user's loop and sets no policy


async def _record(got: list[int], message: ConsumedMessage, consumer: AsyncPullConsumer) -> bool:
    got.append(message.offset)
    if len(got) >= 20:
        consumer.stop()
    return True


def test_backoff_doubles_with_jitter() -> None:
    backoff = Backoff(100, 1000)
    steps = [100, 200, 400, 800, 1000, 1000]
    delays = [backoff.next_s() * 1000 for _ in steps]
    assert all(step / 2 <= delay <= step for delay, step in zip(delays, steps, strict=True))
    assert len({round(d, 6) for d in (Backoff(100, 100).next_s() for _ in range(20))}) > 1  # not in step
    backoff.reset()
    assert backoff.next_s() <= 0.1


def test_a_processor_in_another_thread_can_stop_run(proxy: ProxyProcess, redis_url: str) -> None:
    produce_keyed(redis_url, 10, {}, random.Random(3), keys=3, topic=TOPIC)
    consumer = PullConsumer(server(proxy), GROUP, lambda m: True)
    threading.Timer(1.0, consumer.stop).start()
    consumer.run()  # returns once stop() is called
    assert not consumer.running and consumer.error is None


def test_consume_timeout_gives_up_when_no_proxy_answers() -> None:
    started = time.monotonic()
    run = subprocess.run([*DDMQ, "consume", "--servers", f"127.0.0.1:{free_port()}", "--group", GROUP,
                          "--timeout", "1.5"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run
    assert "no proxy answered within 1.5 s" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr
    assert time.monotonic() - started < 30  # it gives up, rather than retrying for ever


def test_consume_rejects_a_server_with_a_scheme_as_a_usage_error() -> None:
    run = subprocess.run([*DDMQ, "consume", "--servers", "http://127.0.0.1:9713", "--group", GROUP,
                          "--timeout", "5"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run
    assert "without a scheme" in run.stderr and "'http://127.0.0.1:9713'" in run.stderr, run.stderr


def test_consume_prints_integers_produce_time_and_json_values(proxy: ProxyProcess, redis_url: str) -> None:
    before_ms = int(time.time() * 1000)
    values = ['{"k": "a", "n": 1}', '{"k": "b", "n": 2}', "not json {", "[1, 2]"]
    with Producer(redis_url) as producer:
        producer.send_batch(TOPIC, [{"key": "a", "value": v} for v in values])
    after_ms = int(time.time() * 1000)
    # An idle timeout after messages were printed ends a drain normally (status 0).
    run = subprocess.run([*DDMQ, "consume", "--servers", server(proxy), "--group", GROUP, "--timeout", "2",
                          "--json-values"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in run.stdout.splitlines()]
    assert [r["value"] for r in records] == [{"k": "a", "n": 1}, {"k": "b", "n": 2}, "not json {", [1, 2]]
    for record in records:
        assert isinstance(record["qid"], int) and isinstance(record["offset"], int)
        assert before_ms - 1000 <= record["produce_ms"] <= after_ms + 1000
    # Without --json-values a JSON value stays a string; the drained group has nothing more: status 1.
    with Producer(redis_url) as producer:
        producer.send_batch(TOPIC, [{"key": "a", "value": values[0]}])
    line = subprocess.run([*DDMQ, "consume", "--servers", server(proxy), "--group", GROUP, "--count", "1"],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    assert json.loads(line)["value"] == values[0]
    idle = subprocess.run([*DDMQ, "consume", "--servers", server(proxy), "--group", GROUP, "--timeout", "1"],
                          capture_output=True, text=True, timeout=60)
    assert idle.returncode == 1 and idle.stdout == ""
    assert "no message within 1 s (the proxies answered" in idle.stderr, idle.stderr
