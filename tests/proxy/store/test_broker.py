"""Reading queue entries: the producer's flat field list straight into a message, anything else by name."""

from __future__ import annotations

import json
import math

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys, stream_entry
from ddmq.proxy.core.types import StoredMessage
from ddmq.proxy.store.broker import Broker, decode_entry, decode_fields


def test_the_producers_layout_and_any_other_order_decode_alike() -> None:
    canonical = [b"v", b'{"a":1}', b"k", "clé".encode(), b"t", b"tag", b"ts", b"1763776220123"]
    expected = StoredMessage(42, b'{"a":1}', "clé", "tag", {}, 1763776220123)
    assert decode_fields(b"0-42", canonical) == expected
    shuffled = [b"ts", b"1763776220123", b"k", "clé".encode(), b"v", b'{"a":1}', b"t", b"tag"]
    assert decode_fields(b"0-42", shuffled) == expected
    with_properties = [*canonical[:6], b"p", b'{"x":"y"}', *canonical[6:]]
    assert decode_fields(b"0-42", with_properties) == expected._replace(properties={"x": "y"})
    fields = dict(zip(with_properties[::2], with_properties[1::2], strict=True))
    assert decode_fields(b"0-42", with_properties) == decode_entry(b"0-42", fields)
    # the same fields in another order go the long way round, to the same message
    reordered = [*with_properties[6:8], *with_properties[:6], *with_properties[8:]]
    assert decode_fields(b"0-42", reordered) == decode_fields(b"0-42", with_properties)


@pytest.mark.parametrize(
    ("entry_id", "fields"),
    [
        (b"1700000000000-0", [b"v", b"x", b"k", b"", b"t", b"", b"ts", b"1"]),  # a plain XADD * id
        (b"0-1", [b"v", b"x", b"k", b"", b"t", b"", b"ts", b"soon"]),  # produce time not a number
        (b"0-1", [b"v", b"x", b"p"]),  # odd field list
        (b"0-1", [b"v", b"x", b"p", b"{not json"]),
        (b"0-1", [b"v", b"x", b"k", b"", b"t", b"", b"p", b"{not json", b"ts", b"1"]),  # the producer's layout
        (b"0-1", [b"v", b"x", b"k", b"", b"t", b"", b"p", b"[1]", b"ts", b"1"]),  # properties not an object
        (b"9-1", [b"v", b"x", b"k", b"", b"t", b"", b"p", b"{}", b"ts", b"1"]),  # not the producer's id
        (b"0-1", None),  # a deleted entry
    ],
)
def test_unreadable_entries_are_value_errors(entry_id: bytes, fields: list[bytes] | None) -> None:
    with pytest.raises(ValueError):
        decode_fields(entry_id, fields)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"a=b"}',
        '{"h":"\u00fc\u65e5","e":""}'.encode(),
        b'{"big":123456789012345678901234567890}',  # orjson would give a float: json's exact int is kept
        b'{"n":NaN}',  # orjson refuses what json accepts
        b'{"s":"\\ud800"}',  # a lone surrogate: the same
        b'{"a":"1","a":"2"}',
    ],
)
def test_properties_decode_as_json_reads_them(raw: bytes) -> None:
    got, expected = stream_entry.decode_properties(raw), json.loads(raw)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name] == value or (math.isnan(got[name]) and math.isnan(value))
        assert type(got[name]) is type(value)


@pytest.mark.parametrize("text", [b"0", b"7", b"1763776220123", b"0012", b"9" * 30, b" 12", b"+5", b"-3", b"1_000"])
def test_numbers_read_from_the_layout_are_what_int_reads(text: bytes) -> None:
    # what decode_fields reads of the layout is what int() reads
    fields = [b"v", b"x", b"k", b"", b"t", b"", b"ts", text]
    message = decode_fields(b"0-" + text.strip(b" +"), fields) if text.strip(b" +").isdigit() else None
    if message is not None:
        assert (message.offset, message.produce_ms) == (int(text.strip(b" +")), int(text))
    assert decode_fields(b"0-1", fields).produce_ms == int(text)


@pytest.mark.parametrize("entry_id", [b"0-", b"0-x1", b"0-1x"])
def test_an_entry_id_without_a_number_is_a_value_error(entry_id: bytes) -> None:
    with pytest.raises(ValueError):
        decode_fields(entry_id, [b"v", b"x", b"k", b"", b"t", b"", b"ts", b"1"])


async def test_read_returns_what_the_producer_wrote(redis_url: str, redis_client: aioredis.Redis) -> None:
    producer = AsyncProducer(redis_url)
    try:
        await producer.send("rt", "plain", key="a", qid=0)
        await producer.send("rt", "with props", key="b", tag="x", properties={"h": "ü"}, qid=0)
    finally:
        await producer.close()
    broker = Broker(redis_client)
    messages = await broker.read("rt", 0, 0, 10, 100)
    assert [(m.offset, m.value, m.key, m.tag, m.properties) for m in messages] == [
        (1, b"plain", "a", "", {}),
        (2, b"with props", "b", "x", {"h": "ü"}),
    ]
    assert all(m.produce_ms > 0 for m in messages)
    assert await broker.read("rt", 0, 2, 10, 10) == []
    # The client's other XREAD users still get redis-py's parsed reply.
    parsed = await redis_client.xread({keys.stream("rt", 0): "0-0"}, count=1)
    assert parsed[0][1][0][1][b"v"] == b"plain"


def test_a_batch_that_shares_one_properties_dict_encodes_it_once_and_each_message_as_alone() -> None:
    shared, own = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, {"app": "ü"}
    memo: stream_entry.PropertiesMemo = {}
    batch = [stream_entry.encode_entry(f"v{i}", "k", "", shared if i % 2 else own, 7, memo) for i in range(6)]
    assert batch == [stream_entry.encode_entry(f"v{i}", "k", "", shared if i % 2 else own, 7) for i in range(6)]
    assert len(memo) == 2 and batch[1][7] is batch[3][7]
    assert [decode_fields(b"0-1", items).properties for items in batch[:2]] == [own, shared]
