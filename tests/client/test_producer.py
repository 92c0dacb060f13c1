"""The producer against a real Redis: dense offsets, queue choice, topic metadata, batches, the CLI."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import cast

import pytest
import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.retry import Retry

from ddmq.protocol.produce.producer import AsyncProducer, DeliveryError, OutgoingMessage, Producer, SendResult
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.queues import ProduceError, TopicMismatchError, ensure_topic


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as sync_client:
        yield sync_client


@pytest.fixture
def producer(redis_url: str) -> Iterator[Producer]:
    with Producer(redis_url) as p:
        yield p


Entries = list[tuple[bytes, dict[bytes, bytes]]]


def entries(client: redis.Redis, topic: str, qid: int) -> Entries:
    return cast(Entries, client.xrange(keys.stream(topic, qid)))


def test_offsets_are_dense_from_one_and_are_the_entry_ids(producer: Producer, client: redis.Redis) -> None:
    first = [producer.send("rides", f"m{i}", qid=0) for i in range(5)]
    second = [producer.send("rides", f"n{i}", qid=1) for i in range(3)]

    assert first == [SendResult("rides", 0, offset) for offset in range(1, 6)]
    assert second == [SendResult("rides", 1, offset) for offset in range(1, 4)]
    assert [entry_id for entry_id, _ in entries(client, "rides", 0)] == [b"0-%d" % i for i in range(1, 6)]
    assert [keys.offset_of(entry_id) for entry_id, _ in entries(client, "rides", 1)] == [1, 2, 3]
    assert client.get(keys.sequence("rides", 0)) == b"5"
    assert client.get(keys.sequence("rides", 1)) == b"3"


def test_entry_fields(producer: Producer, client: redis.Redis) -> None:
    before = int(time.time() * 1000)
    producer.send("rides", "héllo", key="rider-42", tag="created", properties={"src": "app", "ü": "1"})
    producer.send("rides", b"\x00\xff", qid=0)
    after = int(time.time() * 1000)

    (_, full), (_, bare) = entries(client, "rides", 0)
    assert full[b"v"] == "héllo".encode()
    assert full[b"k"] == b"rider-42"
    assert full[b"t"] == b"created"
    assert full[b"p"] == '{"src":"app","ü":"1"}'.encode()
    assert before <= int(full[b"ts"]) <= after
    assert bare[b"v"] == b"\x00\xff"
    assert bare[b"k"] == b"" and bare[b"t"] == b""
    assert b"p" not in bare  # omitted when there are no properties


def test_key_picks_a_stable_queue(producer: Producer) -> None:
    assert producer.send("rides", "a", key="rider-42").qid == 0  # crc32 3583044112 % 8
    assert producer.send("rides", "b", key="order-1").qid == 7  # crc32 3769860079 % 8
    for key in ("order-1", "rider-7", "x", "日本"):
        qids = {producer.send("rides", "v", key=key).qid for _ in range(3)}
        assert qids == {queue_for_key(key, 8)}


def test_messages_without_key_go_round_robin(producer: Producer) -> None:
    qids = [producer.send("rides", "v").qid for _ in range(16)]
    assert sorted(qids) == sorted(list(range(8)) * 2)
    assert all((b - a) % 8 == 1 for a, b in itertools.pairwise(qids))


def test_explicit_qid_and_bad_qid(producer: Producer, client: redis.Redis) -> None:
    assert producer.send("rides", "v", key="rider-42", qid=5) == SendResult("rides", 5, 1)
    for bad in (8, -1, 100):
        with pytest.raises(ValueError, match="out of range"):
            producer.send("rides", "v", qid=bad)
    with pytest.raises(ValueError, match="out of range"):
        producer.send_batch("rides", [{"value": "ok", "qid": 1}, {"value": "bad", "qid": 8}])
    assert client.xlen(keys.stream("rides", 1)) == 0  # a bad message fails the whole batch up front


def test_bad_arguments(producer: Producer) -> None:
    with pytest.raises(ValueError, match="invalid topic"):
        producer.send("bad topic{}", "v")
    with pytest.raises(TypeError):
        producer.send("rides", 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown message field"):
        producer.send_batch("rides", [{"value": "v", "kee": "typo"}])
    with pytest.raises(TypeError, match="properties"):
        producer.send("rides", "v", properties={"n": 1})  # type: ignore[dict-item]


def test_batch_keeps_input_order_and_per_queue_offsets(producer: Producer, client: redis.Redis) -> None:
    batch: list[OutgoingMessage | dict[str, object]] = [
        {"value": "r1", "key": "rider-42"},
        OutgoingMessage("o1", key="order-1"),
        {"value": "q3", "qid": 3},
        OutgoingMessage("r2", key="rider-42", tag="t"),
        {"value": "o2", "key": "order-1", "properties": {"a": "b"}},
        OutgoingMessage("r3", key="rider-42"),
    ]
    results = producer.send_batch("rides", batch)

    assert results == [
        SendResult("rides", 0, 1),
        SendResult("rides", 7, 1),
        SendResult("rides", 3, 1),
        SendResult("rides", 0, 2),
        SendResult("rides", 7, 2),
        SendResult("rides", 0, 3),
    ]
    assert [fields[b"v"] for _, fields in entries(client, "rides", 0)] == [b"r1", b"r2", b"r3"]
    assert [fields[b"v"] for _, fields in entries(client, "rides", 7)] == [b"o1", b"o2"]
    # the next send continues each queue's sequence
    assert producer.send("rides", "r4", key="rider-42") == SendResult("rides", 0, 4)
    assert producer.send_batch("rides", []) == []


def test_big_batch_for_one_queue_stays_dense(producer: Producer, client: redis.Redis) -> None:
    results = producer.send_batch("rides", ({"value": str(i), "qid": 2} for i in range(2500)))
    assert [r.offset for r in results] == list(range(1, 2501))
    ids = [entry_id for entry_id, _ in entries(client, "rides", 2)]
    assert ids == [b"0-%d" % i for i in range(1, 2501)]


def test_topic_metadata_is_created_by_the_first_producer_and_reused(redis_url: str, client: redis.Redis) -> None:
    with Producer(redis_url, default_queues=4) as first:
        assert first.send("rides", "v", key="order-1").qid == queue_for_key("order-1", 4)
    assert client.hget(keys.topic_meta("rides"), "queues") == b"4"
    assert client.smembers(keys.topics()) == {b"rides"}

    with Producer(redis_url, default_queues=16) as second:
        assert second.queue_count("rides") == 4
        assert second.send("rides", "v", key="order-1").qid == queue_for_key("order-1", 4)
        with pytest.raises(ValueError, match="out of range"):
            second.send("rides", "v", qid=4)
    assert client.hget(keys.topic_meta("rides"), "queues") == b"4"


def test_ensure_topic(producer: Producer, client: redis.Redis) -> None:
    assert producer.ensure_topic("orders", 3) == 3
    assert client.hget(keys.topic_meta("orders"), "queues") == b"3"
    assert b"orders" in client.smembers(keys.topics())
    assert producer.ensure_topic("orders", 3) == 3
    with pytest.raises(TopicMismatchError, match=r"'orders' has 3 queues in Redis but 5 are declared"):
        producer.ensure_topic("orders", 5)
    with pytest.raises(ValueError):
        producer.ensure_topic("orders", 0)


async def test_ensure_topic_async(redis_client: redis.asyncio.Redis) -> None:
    assert await ensure_topic(redis_client, "orders", 2) == 2
    assert await redis_client.hget(keys.topic_meta("orders"), "queues") == b"2"
    assert await ensure_topic(redis_client, "orders", 2) == 2
    with pytest.raises(TopicMismatchError, match="break per-key order"):
        await ensure_topic(redis_client, "orders", 8)


def test_script_reloaded_after_script_flush(producer: Producer, client: redis.Redis) -> None:
    producer.send("rides", "a", qid=0)
    client.script_flush()
    assert producer.send_batch("rides", [{"value": "b", "qid": 0}, {"value": "c", "qid": 1}]) == [
        SendResult("rides", 0, 2),
        SendResult("rides", 1, 1),
    ]


def test_lost_sequence_continues_after_the_stream(producer: Producer, client: redis.Redis) -> None:
    producer.send_batch("rides", [{"value": "a", "qid": 0}, {"value": "b", "qid": 0}])
    client.delete(keys.sequence("rides", 0))
    assert producer.send("rides", "c", qid=0).offset == 3


def test_failed_call_leaves_no_gap(producer: Producer, client: redis.Redis) -> None:
    producer.send_batch("rides", [{"value": v, "qid": 0} for v in "abc"])
    stream = keys.stream("rides", 0)
    client.rename(stream, "aside")
    client.set(stream, "not a stream")  # every XADD into queue 0 fails now
    with pytest.raises(ProduceError, match="queue 0") as info:
        producer.send_batch("rides", [{"value": "d", "qid": 0}, {"value": "e", "qid": 0}])
    assert isinstance(info.value.__cause__, redis.ResponseError)
    assert client.get(keys.sequence("rides", 0)) == b"3"  # the sequence did not move
    client.delete(stream)
    client.rename("aside", stream)
    assert client.xlen(stream) == 3
    assert producer.send("rides", "d", qid=0).offset == 4


def test_foreign_entries_are_renumbered_and_producers_go_on(producer: Producer, client: redis.Redis) -> None:
    stream = keys.stream("rides", 0)
    producer.send("rides", "a", qid=0)
    client.xadd(stream, {"v": "foreign"}, id="5-0")  # a time-based id, as XADD * makes
    assert producer.send("rides", "b", qid=0).offset == 3
    assert [(i, f) for i, f in client.xrange(stream)][1:] == [
        (b"0-2", {b"v": b"foreign"}),  # renumbered in place, fields unchanged (the proxy dead-letters it)
        (b"0-3", client.xrange(stream, "0-3", "0-3")[0][1]),
    ]
    client.xadd(stream, {"x": "y"}, id="0-4")  # the next id, without the producer's fields
    assert producer.send("rides", "c", qid=0).offset == 5
    client.xadd(stream, {"x": "y"}, id="0-9")  # a gap
    assert producer.send("rides", "d", qid=0).offset == 10
    assert client.get(keys.sequence("rides", 0)) == b"10"


def test_maxlen_trims_approximately(redis_url: str, client: redis.Redis) -> None:
    with Producer(redis_url, maxlen=10) as trimmed:
        results = trimmed.send_batch("rides", ({"value": "v", "qid": 0} for _ in range(1000)))
    assert results[-1].offset == 1000
    assert 10 <= client.xlen(keys.stream("rides", 0)) < 1000


def test_redis_errors_become_produce_errors() -> None:
    no_retry = redis.Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    with Producer(no_retry, delivery_timeout_ms=300) as unreachable:
        with pytest.raises(DeliveryError, match="'rides'") as info:
            unreachable.send("rides", "v")
    assert isinstance(info.value.__cause__, redis.ConnectionError)
    assert info.value.retries > 0


def test_given_client_is_left_open(client: redis.Redis) -> None:
    with Producer(client) as p:
        p.send("rides", "v", qid=0)
    assert client.ping()


async def test_async_producer_basics(redis_url: str, redis_client: redis.asyncio.Redis) -> None:
    async with AsyncProducer(redis_url) as p:
        assert await p.send("rides", "a", key="rider-42") == SendResult("rides", 0, 1)
        assert await p.send("rides", b"b", key="order-1", tag="t") == SendResult("rides", 7, 1)
        results = await p.send_batch(
            "rides", [{"value": "c", "key": "rider-42"}, OutgoingMessage("d", qid=7), {"value": "e", "qid": 0}]
        )
        assert results == [SendResult("rides", 0, 2), SendResult("rides", 7, 2), SendResult("rides", 0, 3)]
        with pytest.raises(ValueError, match="out of range"):
            await p.send("rides", "x", qid=8)
        await redis_client.script_flush()
        assert await p.send("rides", "f", qid=0) == SendResult("rides", 0, 4)

    stream = cast(Entries, await redis_client.xrange(keys.stream("rides", 0)))
    assert [entry_id for entry_id, _ in stream] == [b"0-1", b"0-2", b"0-3", b"0-4"]
    assert [fields[b"v"] for _, fields in stream] == [b"a", b"c", b"e", b"f"]
    assert await redis_client.hget(keys.topic_meta("rides"), "queues") == b"8"


async def test_async_producer_on_a_given_client(redis_client: redis.asyncio.Redis) -> None:
    async with AsyncProducer(redis_client, default_queues=2) as p:
        assert await p.queue_count("rides") == 2
        assert await p.ensure_topic("rides", 2) == 2
        assert (await p.send("rides", "v", key="order-1")).qid == queue_for_key("order-1", 2)
    assert await redis_client.ping()


async def test_async_redis_errors_become_produce_errors() -> None:
    no_retry = redis.asyncio.Redis(host="127.0.0.1", port=1, retry=AsyncRetry(NoBackoff(), 0))
    async with AsyncProducer(no_retry, delivery_timeout_ms=300) as unreachable:
        with pytest.raises(DeliveryError) as info:
            await unreachable.send("rides", "v")
    await no_retry.aclose()
    assert isinstance(info.value.__cause__, redis.ConnectionError)


# --- `ddmq produce` ---------------------------------------------------------------------------------

# client/cli/main.py also imports ddmq.client.consumer and ddmq.client.cli.demo, written by others. Until both
# exist, drive add_cli through a parser of our own; afterwards the real `ddmq` entry point is used.
_DRIVER = """
import argparse, sys
from ddmq.client.cli.produce import add_cli
parser = argparse.ArgumentParser(prog="ddmq")
add_cli(parser.add_subparsers(dest="command", required=True))
args = parser.parse_args(sys.argv[1:])
sys.exit(args.func(args))
"""


def _ddmq_command() -> list[str]:
    if importlib.util.find_spec("ddmq.client.consumer") and importlib.util.find_spec("ddmq.client.cli.demo"):
        return [sys.executable, "-m", "ddmq.client.cli"]
    return [sys.executable, "-c", _DRIVER]


def test_produce_cli_end_to_end(redis_url: str, client: redis.Redis) -> None:
    lines = [
        json.dumps({"key": "rider-42", "value": "first"}),
        json.dumps({"value": {"ride": 7, "city": "Zürich"}, "tag": "json"}),
        "{not json",
        json.dumps({"key": "order-1", "value": "third", "properties": {"src": "cli"}}),
        json.dumps({"value": "bad qid", "qid": 8}),
        "",
        json.dumps({"value": "explicit", "qid": 2}),
        json.dumps({"value": "more", "key": "rider-42"}),
    ]
    proc = subprocess.run(
        [*_ddmq_command(), "produce", "--redis", redis_url, "--topic", "rides", "--create", "--queues", "8",
         "--batch", "2"],
        input="\n".join(lines).encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    stderr = proc.stderr.decode()
    assert proc.returncode == 1, stderr
    assert "line 3:" in stderr and "line 5:" in stderr
    assert "line 6" not in stderr  # blank lines are not bad
    assert re.fullmatch(
        r"sent 5 message\(s\) to 'rides' over [34] queue\(s\) in \d+\.\ds, 0 retries, 2 bad line\(s\)",
        stderr.splitlines()[-1],
    ), stderr

    def values(qid: int) -> list[bytes]:  # without the keyless message, which went round-robin
        return [f[b"v"] for _, f in entries(client, "rides", qid) if f[b"t"] != b"json"]

    assert values(0) == [b"first", b"more"]
    assert values(7) == [b"third"]
    assert [f[b"p"] for _, f in entries(client, "rides", 7) if f[b"t"] != b"json"] == [b'{"src":"cli"}']
    assert values(2) == [b"explicit"]
    json_value = [f for q in range(8) for _, f in entries(client, "rides", q) if f[b"t"] == b"json"]
    assert [f[b"v"] for f in json_value] == ['{"ride":7,"city":"Zürich"}'.encode()]


def test_produce_cli_all_good_exits_zero(redis_url: str, client: redis.Redis) -> None:
    proc = subprocess.run(
        [*_ddmq_command(), "produce", "--redis", redis_url, "--topic", "orders", "--create"],
        input=b'{"value": "a", "qid": 0}\n{"value": 1, "qid": 0}\n',
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert [f[b"v"] for _, f in entries(client, "orders", 0)] == [b"a", b"1"]
    assert client.hget(keys.topic_meta("orders"), "queues") == b"8"


def test_produce_cli_queue_mismatch_fails(redis_url: str, producer: Producer) -> None:
    producer.ensure_topic("orders", 4)
    proc = subprocess.run(
        [*_ddmq_command(), "produce", "--redis", redis_url, "--topic", "orders", "--queues", "8"],
        input=b'{"value": "a"}\n',
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.decode().startswith("ddmq produce: ")
    assert "has 4 queues in Redis but 8 are declared" in proc.stderr.decode()
