"""The idempotent produce script and the producer's retries, against a real Redis: a repeated call is
answered from the script's state, out-of-order calls wait, dedup ids hold across producers, a full Redis
is retried, and the deadline raises one error that says what was written."""

from __future__ import annotations

import asyncio
import os
import pty
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import redis

from ddmq.protocol.produce.producer import AsyncProducer, DeliveryError, MessageTooLargeError, Producer, SendResult
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.scripts import IDEMPOTENT_PRODUCE_LUA, OUT_OF_ORDER, PRODUCE_LUA


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as sync_client:
        yield sync_client


def call(client: redis.Redis, seq: int, acked: int, values: list[str], producer_id: str = "p1",
         dedup: dict[int, str] | None = None) -> Any:
    """One raw call of the idempotent script on queue t#0."""
    dedup = dedup or {}
    call_keys = [keys.stream("t", 0), keys.sequence("t", 0), keys.producer_state("t", 0, producer_id)]
    args: list[Any] = [len(values), "", seq, acked, 60_000, 60_000]
    for index, value in enumerate(values):
        if index in dedup:
            call_keys.append(keys.dedup_id("t", 0, dedup[index]))
        args += ([1 if index in dedup else 0] if dedup else []) + [2, "v", value]
    return client.eval(IDEMPOTENT_PRODUCE_LUA, len(call_keys), *call_keys, *args)


def bodies(client: redis.Redis, topic: str, qid: int) -> list[bytes]:
    return [fields[b"v"] for _, fields in client.xrange(keys.stream(topic, qid))]


def test_a_repeated_call_is_answered_from_the_state_and_writes_nothing(client: redis.Redis) -> None:
    assert call(client, 1, 0, ["a", "b"]) == 1
    assert call(client, 2, 0, ["c"]) == 3
    # both replies "lost": the producer sends them again, in order
    assert int(call(client, 1, 0, ["a", "b"])) == 1
    assert int(call(client, 2, 0, ["c"])) == 3
    assert bodies(client, "t", 0) == [b"a", b"b", b"c"]
    assert call(client, 3, 2, ["d"]) == 4
    assert [keys.offset_of(i) for i, _ in client.xrange(keys.stream("t", 0))] == [1, 2, 3, 4]
    assert 0 < client.pttl(keys.producer_state("t", 0, "p1")) <= 60_000


def test_a_call_whose_predecessor_was_not_applied_waits_for_it(client: redis.Redis) -> None:
    assert call(client, 1, 0, ["a"]) == 1
    # call 2 failed (never ran); call 3 must not overtake it, or per-key order breaks
    with pytest.raises(redis.ResponseError, match=OUT_OF_ORDER):
        call(client, 3, 1, ["c"])
    assert call(client, 2, 1, ["b"]) == 2
    assert call(client, 3, 1, ["c"]) == 3
    assert bodies(client, "t", 0) == [b"a", b"b", b"c"]
    # a producer whose state is gone (expired, or lost with a failover) goes on from what it holds
    client.delete(keys.producer_state("t", 0, "p1"))
    assert call(client, 4, 3, ["d"]) == 4
    with pytest.raises(redis.ResponseError, match=OUT_OF_ORDER):
        call(client, 9, 4, ["x"])


def test_the_old_script_and_the_idempotent_one_share_a_queue(client: redis.Redis) -> None:
    stream, sequence = keys.stream("t", 0), keys.sequence("t", 0)
    assert client.eval(PRODUCE_LUA, 2, stream, sequence, 1, "", 2, "v", "old-1") == 1
    assert call(client, 1, 0, ["new-1", "new-2"]) == 2
    assert client.eval(PRODUCE_LUA, 2, stream, sequence, 1, "", 2, "v", "old-2") == 4
    assert int(call(client, 1, 0, ["new-1", "new-2"])) == 2  # a retry after the old producer wrote
    client.xadd(stream, {"v": "foreign"}, id="9-0")  # a time-based id: renumbered to the next offset
    assert call(client, 2, 1, ["new-3"]) == 6
    assert bodies(client, "t", 0) == [b"old-1", b"new-1", b"new-2", b"old-2", b"foreign", b"new-3"]
    assert [keys.offset_of(i) for i, _ in client.xrange(stream)] == [1, 2, 3, 4, 5, 6]


def test_dedup_ids_hold_across_two_producers(redis_url: str, client: redis.Redis) -> None:
    with Producer(redis_url, default_queues=4) as first:
        sent = first.send_batch("rides", [
            {"value": "pay-1", "key": "rider-1", "dedup_id": "pay-1"},
            {"value": "keyless", "dedup_id": "evt-9"},
            {"value": "plain", "key": "rider-1"},
        ])
    assert sent[1].qid == queue_for_key("evt-9", 4)  # keyless with a dedup id: the id picks the queue
    # a new process sends the same messages again (it cannot know what the first one wrote)
    with Producer(redis_url) as second:
        again = second.send_batch("rides", [
            {"value": "pay-1", "key": "rider-1", "dedup_id": "pay-1"},
            {"value": "keyless", "dedup_id": "evt-9"},
            {"value": "pay-2", "key": "rider-1", "dedup_id": "pay-2"},
            {"value": "pay-2", "key": "rider-1", "dedup_id": "pay-2"},  # twice in one batch: once
        ])
    rider_queue = queue_for_key("rider-1", 4)
    assert again[:2] == sent[:2]
    assert again[2] == again[3] == SendResult("rides", rider_queue, 3)
    assert bodies(client, "rides", rider_queue) == [b"pay-1", b"plain", b"pay-2"]
    assert bodies(client, "rides", sent[1].qid).count(b"keyless") == 1
    ttl = client.pttl(keys.dedup_id("rides", rider_queue, "pay-1"))
    assert 290_000 < ttl <= 300_000  # the default window, 300 s
    # past its window an id is forgotten: the message is written again
    with Producer(redis_url, dedup_window_s=0.2) as short:
        short.send("rides", "once", key="rider-1", dedup_id="short")
        assert short.send("rides", "once", key="rider-1", dedup_id="short").offset == 4
        deadline = time.monotonic() + 10
        while client.exists(keys.dedup_id("rides", rider_queue, "short")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert short.send("rides", "once", key="rider-1", dedup_id="short").offset == 5
    with Producer(redis_url) as p, pytest.raises(ValueError, match="dedup_id"):
        p.send("rides", "v", dedup_id="")


@pytest.fixture
def memory_limit(client: redis.Redis) -> Iterator[None]:
    before = client.config_get("maxmemory")["maxmemory"]
    policy = client.config_get("maxmemory-policy")["maxmemory-policy"]
    client.config_set("maxmemory-policy", "noeviction")
    try:
        yield
    finally:
        client.config_set("maxmemory", before)
        client.config_set("maxmemory-policy", policy)


def over_the_limit(client: redis.Redis, room: int) -> None:
    used = cast(dict[str, int], client.info("memory"))["used_memory"]
    client.config_set("maxmemory", used + room)


def test_a_full_redis_is_retried_until_memory_frees(redis_url: str, client: redis.Redis, memory_limit: None) -> None:
    client.setrange("ballast", 2_000_000, b"x")  # 2 MB, from a small request (no query buffer to count)
    over_the_limit(client, -500_000)  # full while the ballast is there
    freed = threading.Timer(0.5, lambda: client.delete("ballast"))
    with Producer(redis_url, delivery_timeout_ms=30_000) as producer:
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            client.set("probe", "x" * 200_000)  # the server is full indeed
        freed.start()
        results = producer.send_batch("t", [{"value": f"m{i}", "qid": 0} for i in range(100)])
        assert producer.retries > 0
    freed.join()
    assert [r.offset for r in results] == list(range(1, 101))
    assert bodies(client, "t", 0) == [b"m%d" % i for i in range(100)]


def test_the_deadline_raises_one_error_with_what_was_written(
    redis_url: str, client: redis.Redis, memory_limit: None
) -> None:
    with Producer(redis_url, delivery_timeout_ms=600) as producer:
        producer.ensure_topic("t", 2)
        producer.send("t", "warm-up", qid=1)  # so queue 1 exists and nothing else must grow first
        over_the_limit(client, 400_000)
        # queue 1's small call runs first and is written; queue 0's call of 1 MB fills Redis with its own
        # arguments, so it meets a full Redis at its first write every time until the deadline
        batch = [{"value": "early", "qid": 1}] * 3 + [{"value": "x" * 1000, "qid": 0} for _ in range(1000)]
        started = time.monotonic()
        with pytest.raises(DeliveryError) as info:
            producer.send_batch("t", batch)
        elapsed = time.monotonic() - started
        error = info.value
        assert 0.6 <= elapsed < 5
        assert [(w.position, w.qid, w.offset) for w in error.written] == [(0, 1, 2), (1, 1, 3), (2, 1, 4)]
        assert error.unwritten == list(range(3, 1003))
        assert error.unknown == []
        assert error.retries > 0
        assert "maxmemory" in str(error) and "queue 1 offsets 2-4" in str(error)
        assert "not written 1000" in str(error)
        client.config_set("maxmemory", 0)
        # the caller sends what was not written; the producer goes on under a new id
        resent = producer.send_batch("t", [batch[i] for i in error.unwritten])
        assert [r.offset for r in resent] == list(range(1, 1001))
    assert bodies(client, "t", 1) == [b"warm-up", b"early", b"early", b"early"]
    assert client.xlen(keys.stream("t", 0)) == 1000


def test_max_message_bytes_refuses_before_writing(redis_url: str, client: redis.Redis) -> None:
    with Producer(redis_url, max_message_bytes=1000) as producer:
        producer.send("t", "x" * 900, qid=0)
        with pytest.raises(MessageTooLargeError, match=r"message 1 of 1\d\d\d bytes .* over max_message_bytes 1000"):
            producer.send_batch("t", [{"value": "ok", "qid": 0}, {"value": "x" * 1000, "qid": 0}])
    assert bodies(client, "t", 0) == [b"x" * 900]
    with pytest.raises(ValueError, match="max_message_bytes"):
        Producer(redis_url, max_message_bytes=0)


def _ddmq(*args: str) -> list[str]:
    return [sys.executable, "-m", "ddmq.client.cli", *args]


def test_cli_skips_messages_over_max_message_bytes_and_sums_up(redis_url: str, client: redis.Redis) -> None:
    lines = b'{"value": "small", "qid": 0}\n{"value": "%s", "qid": 0}\n{"value": "after", "qid": 0}\n' % (
        b"x" * 2000)
    proc = subprocess.run(
        _ddmq("produce", "--redis", redis_url, "--topic", "t", "--create", "--max-message-bytes", "1024"),
        input=lines, capture_output=True, timeout=60, check=False,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 1, stderr
    assert "line 2: a message of 20" in stderr and "over max_message_bytes 1024; skipped" in stderr
    assert stderr.splitlines()[-1].startswith("sent 2 message(s) to 't' over 1 queue(s) in ")
    assert stderr.splitlines()[-1].endswith(", 0 retries, 1 bad line(s)")
    assert bodies(client, "t", 0) == [b"small", b"after"]


def test_cli_shows_progress_only_on_a_terminal(redis_url: str, tmp_path: Any) -> None:
    lines = b"".join(b'{"value": "m%d", "key": "k%d"}\n' % (i, i % 50) for i in range(3000))
    source = tmp_path / "lines.jsonl"
    source.write_bytes(lines)
    # stdout and stdin plain, stderr a terminal; the input is paced (100 lines per 0.1 s) so the run
    # spans seconds, whenever ddmq itself gets going
    pacer = "import sys,time\nfor i, line in enumerate(open(sys.argv[1],'rb')):\n" \
            "    sys.stdout.buffer.write(line)\n    sys.stdout.flush()\n    time.sleep(0 if i % 100 else 0.1)\n"
    controller, terminal = pty.openpty()
    feeder = subprocess.Popen([sys.executable, "-c", pacer, str(source)], stdout=subprocess.PIPE)
    proc = subprocess.Popen(
        _ddmq("produce", "--redis", redis_url, "--topic", "t", "--create", "--batch", "50"),
        stdin=feeder.stdout, stdout=subprocess.DEVNULL, stderr=terminal,
    )
    os.close(terminal)
    assert feeder.stdout is not None
    feeder.stdout.close()
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        output += chunk
    assert proc.wait(timeout=60) == 0
    feeder.wait(timeout=10)
    os.close(controller)
    text = output.decode()
    assert "\rsent " in text and " ..." in text, text
    assert "sent 3000 message(s) to 't' over 8 queue(s)" in text
    # without a terminal: only the summary
    piped = subprocess.run(_ddmq("produce", "--redis", redis_url, "--topic", "t", "--create"), input=lines,
                           capture_output=True, timeout=60, check=True)
    assert piped.stderr.decode().count("\n") == 1 and "\r" not in piped.stderr.decode()


def test_an_incurable_error_fails_at_once_and_counts_the_rest_of_the_round(
    redis_url: str, client: redis.Redis
) -> None:
    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 2)
        client.set(keys.stream("t", 0), "not a stream")  # every write into queue 0 fails for good
        started = time.monotonic()
        with pytest.raises(DeliveryError, match=r"queue 0: .*WRONGTYPE") as info:
            producer.send_batch("t", [{"value": "a", "qid": 0}, {"value": "b", "qid": 1}, {"value": "c", "qid": 1}])
        assert time.monotonic() - started < 2  # no retries
        error = info.value
        assert (error.written, error.unwritten, error.unknown, error.retries) == (
            [(1, 1, 1), (2, 1, 2)], [0], [], 0)
        assert isinstance(error.__cause__, redis.ResponseError)
    assert bodies(client, "t", 1) == [b"b", b"c"]


async def test_concurrent_sends_on_one_async_producer_take_turns(redis_url: str, client: redis.Redis) -> None:
    async with AsyncProducer(redis_url, default_queues=2) as producer:
        async def sender(task: int) -> list[SendResult]:
            return await producer.send_batch(
                "t", [{"value": f"{task}:{i}", "key": "one-key"} for i in range(50)])

        results = await asyncio.gather(*(sender(task) for task in range(20)))
    offsets = sorted(r.offset for batch in results for r in batch)
    assert offsets == list(range(1, 1001))
    stored = [value.decode().split(":") for value in bodies(client, "t", queue_for_key("one-key", 2))]
    for task in range(20):  # each batch whole and in its order
        assert [int(i) for t, i in stored if t == str(task)] == list(range(50))
