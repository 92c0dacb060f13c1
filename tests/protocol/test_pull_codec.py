"""The hand-written pull reply encoder and the client's fast Message reader against thriftpy2.

The encoder must give thriftpy2's bytes exactly, and the reader must give what thriftpy2's own
compact reader gives, for many random replies: unicode, empty and large strings, properties, big and
negative numbers, list sizes around the one-byte header limit (14/15), large seqids.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from thriftpy2.protocol.compact import TCompactProtocol
from thriftpy2.transport import TMemoryBuffer

from ddmq.protocol import wire
from ddmq.protocol.wire import ConsumerService, Message, PullResponse, TMessageType, layout, message_reader
from ddmq.protocol.wire.message_reader import read_messages
from ddmq.protocol.wire.reader import CompactReader
from ddmq.proxy.core import pull_codec
from ddmq.proxy.core.pull_codec import encode_pull_reply
from ddmq.proxy.core.types import PullBatch, QueueId, StoredMessage
from ddmq.proxy.servers.thrift.handler import pull_response

_ALPHABET = "abcXYZ019 _-:/{}\"'\\\x00\x7féüß€日本語🙂\U0010fffd"


def _text(rng: random.Random, longest: int = 20) -> str:
    size = rng.choice([0, 1, rng.randint(0, longest), 127, 128])
    return "".join(rng.choice(_ALPHABET) for _ in range(size))


def _number(rng: random.Random) -> int:
    return rng.choice([0, 1, 127, 128, 16_383, 16_384, rng.randint(0, 1 << 40), (1 << 63) - 1, -1, -(1 << 63)])


def _message(rng: random.Random) -> StoredMessage:
    size = rng.choice([0, 1, 50, 127, 128, 300, 70_000])
    value = rng.randbytes(size)
    properties = {_text(rng): _text(rng) for _ in range(rng.choice([0, 0, 1, 3, 20]))}
    return StoredMessage(_number(rng), value, _text(rng), _text(rng), properties, _number(rng))


def _thriftpy2_reply(seqid: int, group: str, topic: str, qid: str, messages: list[StoredMessage]) -> bytes:
    response = pull_response(group, topic, PullBatch(QueueId(topic, int(qid)), messages))
    return _thriftpy2_frame(seqid, ConsumerService.pull_result(success=response))


def _thriftpy2_frame(seqid: int, result: Any) -> bytes:
    """thriftpy2's own writer: the oracle (``wire.encode`` is ours, so not used here)."""
    buffer: Any = TMemoryBuffer()
    protocol: Any = TCompactProtocol(buffer)
    protocol.write_message_begin("pull", TMessageType.REPLY, seqid)
    protocol.write_struct(result)
    payload: bytes = buffer.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def _thriftpy2_read(payload: bytes) -> PullResponse:
    """The reply as thriftpy2's own compact reader sees it (the oracle for our reader)."""
    protocol = TCompactProtocol(TMemoryBuffer(payload))
    protocol.read_message_begin()
    result = ConsumerService.pull_result()
    protocol.read_struct(result)
    response: PullResponse = result.success
    return response


def test_the_shipped_idl_takes_the_fast_paths() -> None:
    assert pull_codec.FAST_PULL_REPLY
    assert layout.MESSAGE_LAYOUT_MATCHES


@pytest.mark.parametrize("seed", range(40))
def test_encoder_matches_thriftpy2_byte_for_byte(seed: int) -> None:
    rng = random.Random(seed)
    count = rng.choice([0, 1, 2, 14, 15, 16, 64, 200])
    messages = [_message(rng) for _ in range(count)]
    seqid = rng.choice([0, 1, 127, 128, rng.randint(0, 0xFFFFFFFF), 0xFFFFFFFF])
    group, topic, qid = _text(rng), _text(rng), str(rng.randint(0, 300))
    ours = encode_pull_reply(seqid, group, topic, qid, messages)
    assert ours == _thriftpy2_reply(seqid, group, topic, qid, messages)


@pytest.mark.parametrize("seed", range(10))
def test_runs_match_thriftpy2_byte_for_byte(seed: int) -> None:
    rng = random.Random(500 + seed)
    messages = [_message(rng) for _ in range(rng.choice([1, 14, 15, 40]))]
    runs: list[int] = []
    left = len(messages)
    while left:
        runs.append(rng.randint(1, left))
        left -= runs[-1]
    batch = PullBatch(QueueId("t", 3), messages, runs)
    expected = _thriftpy2_frame(7, ConsumerService.pull_result(success=pull_response("g", "t", batch)))
    assert encode_pull_reply(7, "g", "t", "3", messages, runs) == expected
    assert _thriftpy2_read(expected[4:]).runs == runs


@pytest.mark.parametrize("seed", range(20))
def test_generic_encoder_gives_the_same_bytes(seed: int) -> None:
    rng = random.Random(700 + seed)
    messages = [_message(rng) for _ in range(rng.choice([0, 1, 15, 64]))]
    runs = None if seed % 2 else [len(messages)] if messages else []
    args = (rng.randint(0, 0xFFFFFFFF), _text(rng), _text(rng), str(rng.randint(0, 300)), messages, runs)
    assert pull_codec.encode_pull_reply_generic(*args) == encode_pull_reply(*args)
    assert pull_codec.pull_reply_encoder() is encode_pull_reply


def test_empty_reply_matches_thriftpy2() -> None:
    expected = _thriftpy2_frame(9, ConsumerService.pull_result(success=pull_response("g", "t", PullBatch(None, []))))
    assert encode_pull_reply(9, "g", "t", "", ()) == expected


def test_encoder_refuses_what_thrift_cannot_carry() -> None:
    message = StoredMessage(1 << 63, b"", "", "", {}, 0)
    with pytest.raises(ValueError):
        encode_pull_reply(1, "g", "t", "0", [message])
    with pytest.raises(ValueError):
        encode_pull_reply(-1, "g", "t", "0", [])


@pytest.mark.parametrize("seed", range(40))
def test_reader_matches_thriftpy2(seed: int) -> None:
    rng = random.Random(1000 + seed)
    messages = [_message(rng) for _ in range(rng.choice([0, 1, 15, 64]))]
    frame = encode_pull_reply(5, "g", "t", "3", messages)
    ours = wire.decode(frame[4:], lambda name, mtype: ConsumerService.pull_result()).body
    assert ours is not None
    assert ours.success == _thriftpy2_read(frame[4:])
    assert [m.offset for m in ours.success.messages] == [m.offset for m in messages]


@pytest.mark.parametrize(
    "message",
    [
        Message(key="k", value=b"v", tag="t", offset=3),  # no properties, no produceTime
        Message(key="k", value=b"v", tag="t", offset=3, properties={}),  # no produceTime
        Message(key="k", offset=3, produceTime=7),  # fields missing in the middle
        Message(),
        Message(key="ü" * 200, value=b"\x00" * 300, tag="", offset=-5, properties={"a": "b"}, produceTime=1 << 62),
    ],
)
def test_reader_takes_other_layouts_the_generic_way(message: Message) -> None:
    frame = wire.encode(
        "pull",
        TMessageType.REPLY,
        1,
        ConsumerService.pull_result(success=PullResponse(messages=[message, Message(key="after", offset=9)])),
    )
    ours = wire.decode(frame[4:], lambda name, mtype: ConsumerService.pull_result()).body
    assert ours is not None
    assert ours.success == _thriftpy2_read(frame[4:])
    assert ours.success.messages[0] == message


def test_reader_refuses_a_truncated_fast_path_message() -> None:
    frame = encode_pull_reply(1, "g", "t", "0", [StoredMessage(5, b"body", "k", "", {}, 1)])
    for cut in range(1, 30):
        with pytest.raises(wire.FrameDecodeError):
            wire.decode(frame[4:-cut], lambda name, mtype: ConsumerService.pull_result())


def test_reader_refuses_every_truncation_of_a_mixed_list() -> None:
    """Fast-path messages around ones that take the generic way (long key, properties), cut anywhere."""
    messages = [
        StoredMessage(1, b"a" * 200, "k1", "", {}, 1_763_776_220_123),
        StoredMessage(2, b"b", "k" * 130, "", {}, 2),
        StoredMessage(3, b"c", "k3", "t", {"p": "q"}, 3),
        StoredMessage(4, b"", "", "", {}, 0),
    ]
    frame = encode_pull_reply(1, "g", "t", "0", messages)
    whole = wire.decode(frame[4:], lambda name, mtype: ConsumerService.pull_result()).body
    assert whole is not None
    assert whole.success == _thriftpy2_read(frame[4:])
    got = [(m.offset, m.key, m.value) for m in whole.success.messages]
    assert got == [(m.offset, m.key, m.value) for m in messages]
    for cut in range(1, len(frame) - 4):
        with pytest.raises(wire.FrameDecodeError):
            wire.decode(frame[4:-cut], lambda name, mtype: ConsumerService.pull_result())


def test_reader_refuses_a_value_length_beyond_the_payload() -> None:
    frame = bytearray(encode_pull_reply(1, "g", "t", "0", [StoredMessage(5, b"body", "k", "", {}, 1)]))
    at = frame.index(b"\x18\x04body")
    frame[at + 1 : at + 2] = b"\xff\xff\xff\xff\x0f"  # the value claims 4 GiB
    with pytest.raises(wire.FrameDecodeError):
        wire.decode(bytes(frame[4:]), lambda name, mtype: ConsumerService.pull_result())


def _fast_layout_message(offset: bytes, produce_time: bytes) -> bytes:
    """A ``Message`` in the layout the proxy writes, its two varints given as bytes."""
    return (
        bytes([layout.KEY_HEADER, 1]) + b"k" + bytes([layout.VALUE_HEADER, 1]) + b"v" + bytes([layout.TAG_HEADER, 0])
        + bytes([layout.OFFSET_HEADER]) + offset
        + bytes([layout.PROPERTIES_HEADER, 0, layout.PRODUCE_TIME_HEADER]) + produce_time
        + bytes([layout.CompactType.STOP])
    )


@pytest.mark.parametrize("which", ["offset", "produce_time"])
def test_the_fast_reader_takes_ten_byte_varints_and_refuses_longer_ones(which: str) -> None:
    def message(varint: bytes) -> bytes:
        short = b"\x04"
        return _fast_layout_message(varint, short) if which == "offset" else _fast_layout_message(short, varint)

    longest = b"\x80" * 9 + b"\x01"  # 1 << 63 in ten bytes, the most a varint may take (zigzag: 1 << 62)
    [read] = read_messages(CompactReader(message(longest)), 1)
    assert (read.offset, read.produceTime) == ((1 << 62, 2) if which == "offset" else (2, 1 << 62))
    with pytest.raises(wire.FrameDecodeError, match="longer than 10 bytes"):
        read_messages(CompactReader(message(b"\x04") + message(b"\x80" * 10 + b"\x01")), 2)


def test_the_message_loop_reads_a_trace_context_and_leaves_larger_maps_to_the_generic_reader() -> None:
    """A traced producer's every message carries properties: the loop reads up to eight of them itself
    (a tracestate past 127 bytes too); a ninth, or text that is not UTF-8, goes the generic way."""
    traced = StoredMessage(1, b"v", "k", "", {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
                                              "tracestate": "vendor=" + "x" * 300}, 7)
    crowded = StoredMessage(2, b"w", "k", "", {f"p{i}": "é" for i in range(9)}, 8)
    payload = pull_codec.encode_message(traced) + pull_codec.encode_message(crowded)
    found: list[Message] = []
    end = message_reader._read_run(payload, 0, 2, found)
    assert end == len(pull_codec.encode_message(traced))
    assert [(m.offset, m.properties, m.produceTime) for m in found] == [(1, traced.properties, 7)]
    [first, second] = read_messages(CompactReader(payload), 2)
    assert (first.properties, second.properties) == (traced.properties, crowded.properties)

    broken = StoredMessage(3, b"v", "k", "", {"p": "é"}, 9)
    frame = encode_pull_reply(1, "g", "t", "0", [broken]).replace("é".encode(), b"\xff\xfe")
    assert message_reader._read_run(pull_codec.encode_message(broken).replace("é".encode(), b"\xff\xfe"), 0, 1, []) == 0
    with pytest.raises(wire.FrameDecodeError, match="UTF-8"):
        wire.decode(frame[4:], lambda name, mtype: ConsumerService.pull_result())


@pytest.mark.parametrize("seed", range(20))
def test_the_size_bound_holds_for_every_reply(seed: int) -> None:
    """A reply of names up to 200 characters (as group and topic names are) never passes the overhead
    plus the messages' bounds, runs included; the bound stays within a few dozen bytes per message
    for plain messages (it is what fills replies up to max_reply_bytes)."""
    rng = random.Random(900 + seed)
    messages = [_message(rng) for _ in range(rng.choice([0, 1, 14, 15, 64, 200]))]
    group, topic = "g" * rng.choice([1, 200]), "t" * rng.choice([1, 200])
    runs = [1] * len(messages) if seed % 2 else None
    frame = encode_pull_reply(0xFFFFFFFF, group, topic, "65535", messages, runs)
    bound = pull_codec.REPLY_OVERHEAD_BYTES + sum(map(pull_codec.message_bytes_bound, messages))
    assert len(frame) <= bound
    plain = StoredMessage(1, b"x" * 1000, "key-1", "tag", {}, 1)
    assert pull_codec.message_bytes_bound(plain) - len(pull_codec.encode_message(plain)) < 64
