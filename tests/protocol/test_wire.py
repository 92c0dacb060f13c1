"""The wire contract: the IDL matches DDMQ's consumerProxy.thrift field for field, structs round-trip, and the decoder
refuses malformed or hostile payloads with FrameDecodeError (quickly, without huge allocations)."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from thriftpy2.thrift import TPayload, TType

from ddmq.protocol import wire
from ddmq.protocol.wire import (
    AckResult,
    ConsumeResult,
    ConsumerService,
    ConsumeStats,
    ConsumeStatsRequest,
    Context,
    FetchRequest,
    FetchResponse,
    FrameDecodeError,
    Message,
    PullException,
    PullRequest,
    PullResponse,
    QidResponse,
    TApplicationException,
    TMessageType,
)
from ddmq.protocol.wire.reader import new_struct

STRING, BINARY, I32, I64, BOOL = TType.STRING, TType.BINARY, TType.I32, TType.I64, TType.BOOL
STRUCT, LIST, MAP = TType.STRUCT, TType.LIST, TType.MAP

# DDMQ's consumerProxy.thrift, written out: id -> (type, name, requiredness, element/struct spec).
EXPECTED: dict[str, dict[int, tuple[int, str, str, Any]]] = {
    "Message": {
        1: (STRING, "key", "", None),
        2: (BINARY, "value", "", None),
        3: (STRING, "tag", "", None),
        4: (I64, "offset", "", None),
        5: (MAP, "properties", "optional", (STRING, STRING)),
        20: (I64, "produceTime", "optional", None),
    },
    "Context": {
        1: (STRING, "groupId", "", None),
        2: (STRING, "topic", "", None),
        3: (STRING, "qid", "", None),
    },
    "ConsumeResult": {
        1: (STRUCT, "context", "", "Context"),
        3: (LIST, "successOffsets", "", I64),
        4: (LIST, "failOffsets", "", I64),
        10: (STRUCT, "nextResult", "optional", "ConsumeResult"),
        80: (LIST, "releaseOffsets", "optional", I64),
        81: (LIST, "extendOffsets", "optional", I64),
        82: (LIST, "failDetails", "optional", (STRUCT, "FailDetail")),
    },
    "FailDetail": {
        1: (I64, "offset", "", None),
        2: (I32, "retryAfterMs", "optional", None),
        3: (STRING, "reason", "optional", None),
    },
    "PullRequest": {
        1: (STRING, "groupId", "required", None),
        2: (STRING, "topic", "optional", None),
        10: (I32, "maxBatchSize", "optional", None),
        11: (I32, "maxLingerTime", "optional", None),
        50: (STRUCT, "result", "optional", "ConsumeResult"),
        60: (STRING, "version", "optional", None),
        70: (STRING, "leaseId", "optional", None),
        71: (I32, "leaseIndex", "optional", None),
        72: (I32, "leaseTimeoutMs", "optional", None),
        80: (I32, "maxPerKey", "optional", None),
        90: (STRING, "requestId", "optional", None),
    },
    "PullResponse": {
        1: (STRUCT, "context", "", "Context"),
        2: (LIST, "messages", "", (STRUCT, "Message")),
        80: (LIST, "runs", "optional", I32),
    },
    "ConsumeStatsRequest": {
        1: (STRING, "group", "required", None),
        2: (STRING, "topic", "optional", None),
        3: (STRING, "version", "optional", None),
    },
    "ConsumeStats": {
        1: (STRING, "group", "", None),
        2: (STRING, "topic", "", None),
        3: (MAP, "consumeOffsets", "", (STRING, I64)),
        4: (MAP, "produceOffsets", "", (STRING, I64)),
        20: (MAP, "owners", "optional", (STRING, STRING)),
        21: (MAP, "leaseTtlMs", "optional", (STRING, I64)),
        22: (MAP, "leaseTerms", "optional", (STRING, I64)),
        23: (MAP, "expired", "optional", (STRING, I64)),
        24: (MAP, "expiredLast", "optional", (STRING, STRING)),
    },
    "FetchRequest": {
        1: (STRING, "consumerId", "required", None),
        2: (STRING, "groupId", "required", None),
        3: (STRING, "cluster", "required", None),
        4: (MAP, "fetchOffset", "optional", (STRING, (MAP, (STRING, I64)))),
        10: (I32, "maxBatchSize", "optional", None),
        11: (I32, "maxLingerTime", "optional", None),
        60: (STRING, "version", "optional", None),
    },
    "QidResponse": {
        1: (STRING, "topic", "required", None),
        2: (STRING, "qid", "required", None),
        3: (I64, "nextRequestOffset", "optional", None),
        10: (LIST, "messages", "required", (STRUCT, "Message")),
    },
    "FetchResponse": {
        1: (I32, "code", "optional", None),
        10: (LIST, "results", "required", (STRUCT, "QidResponse")),
    },
    "AckResult": {
        1: (STRING, "consumerId", "required", None),
        2: (STRING, "groupId", "required", None),
        3: (STRING, "cluster", "required", None),
        4: (MAP, "offsets", "required", (STRING, (MAP, (STRING, I64)))),
    },
    "LeaseAck": {
        1: (STRING, "groupId", "required", None),
        2: (LIST, "leaseIds", "required", STRING),
        3: (BOOL, "abandon", "optional", None),
    },
    "PullException": {
        1: (I32, "code", "", None),
        2: (STRING, "message", "", None),
    },
}

# method -> (argument spec, success spec, throws PullException?)
EXPECTED_METHODS: dict[str, tuple[tuple[int, str, str], tuple[int, Any], bool]] = {
    "pull": ((STRUCT, "request", "PullRequest"), (STRUCT, "PullResponse"), True),
    "submit": ((STRUCT, "result", "ConsumeResult"), (BOOL, None), True),
    "getConsumeStats": ((STRUCT, "request", "ConsumeStatsRequest"), (LIST, (STRUCT, "ConsumeStats")), True),
    "fetch": ((STRUCT, "request", "FetchRequest"), (STRUCT, "FetchResponse"), False),
    "ack": ((STRUCT, "result", "AckResult"), (BOOL, None), False),
    "ackLeases": ((STRUCT, "request", "LeaseAck"), (I32, None), True),
}


def _named(spec: Any) -> Any:
    """A thrift_spec sub-spec with struct classes replaced by their names."""
    if isinstance(spec, type):
        return spec.__name__
    if isinstance(spec, tuple):
        return tuple(_named(part) for part in spec)
    return spec


def _idl_requiredness() -> dict[str, dict[int, str]]:
    """Per struct: field id -> "required" / "optional" / "" as written in the IDL (thriftpy2 folds
    optional and default together, so read the text)."""
    text = re.sub(r"/\*.*?\*/", "", wire.IDL_PATH.read_text(), flags=re.S)
    found: dict[str, dict[int, str]] = {}
    for kind_name, body in re.findall(r"(?:struct|exception)\s+(\w+)\s*\{(.*?)\}", text, flags=re.S):
        fields = re.findall(r"(\d+)\s*:\s*(required|optional)?\s*[\w<>, ]+?\s+\w+\s*;", body)
        found[kind_name] = {int(fid): word for fid, word in fields}
    return found


@pytest.mark.parametrize("struct_name", sorted(EXPECTED))
def test_struct_fields_match_design(struct_name: str) -> None:
    cls = getattr(wire, struct_name)
    actual = {
        fid: (entry[0], entry[1], _named(entry[2]) if len(entry) == 4 else None, entry[-1])
        for fid, entry in cls.thrift_spec.items()
    }
    expected = {
        fid: (ttype, name, sub, requiredness == "required")
        for fid, (ttype, name, requiredness, sub) in EXPECTED[struct_name].items()
    }
    assert actual == expected
    assert _idl_requiredness()[struct_name] == {fid: field[2] for fid, field in EXPECTED[struct_name].items()}


def test_no_struct_beyond_the_design() -> None:
    assert set(_idl_requiredness()) == set(EXPECTED)
    assert issubclass(PullException, Exception)


@pytest.mark.parametrize("method", sorted(EXPECTED_METHODS))
def test_service_methods_match_design(method: str) -> None:
    (arg_type, arg_name, arg_struct), success, throws = EXPECTED_METHODS[method]
    args = getattr(ConsumerService, f"{method}_args").thrift_spec
    assert {fid: (e[0], e[1], _named(e[2])) for fid, e in args.items()} == {1: (arg_type, arg_name, arg_struct)}
    result = getattr(ConsumerService, f"{method}_result").thrift_spec
    expected_result: dict[int, tuple[Any, ...]] = {0: (success[0], "success", success[1])}
    if throws:
        expected_result[1] = (STRUCT, "error", "PullException")
    assert {fid: (e[0], e[1], _named(e[2]) if len(e) == 4 else None) for fid, e in result.items()} == expected_result
    assert method in ConsumerService.thrift_services
    assert not getattr(ConsumerService, f"{method}_result").oneway


# -- round trips ------------------------------------------------------------------------------------

MESSAGE = Message(
    key="rider-42",
    value=b"\x00\xff\xfe payload",
    tag="ride",
    offset=2**62,
    properties={"ü": "ß", "": ""},
    produceTime=1_700_000_000_123,
)
CHAIN = wire.link_results(
    [
        ConsumeResult(Context("g", "t", "0"), [1, 2, 3], [-4]),
        ConsumeResult(Context("g", "t", "1"), [], [9]),
        ConsumeResult(Context("g", "u", "7"), [2**63 - 1], [-(2**63)]),
    ]
)
SAMPLES: list[TPayload] = [
    MESSAGE,
    Message(key="", value=b"", tag="", offset=0),
    Context(groupId="g", topic="t", qid="3"),
    CHAIN,
    PullRequest(groupId="g", topic="t", maxBatchSize=32, maxLingerTime=-1, result=CHAIN, version="py-0.1"),
    PullRequest(groupId="g"),
    PullResponse(context=Context("g", "t", "0"), messages=[MESSAGE, MESSAGE]),
    PullResponse(context=Context("g", "", ""), messages=[]),
    ConsumeStatsRequest(group="g", topic="t", version="1"),
    ConsumeStats(group="g", topic="t", consumeOffsets={"0": 5, "1": 0}, produceOffsets={}),
    FetchRequest(
        consumerId="c",
        groupId="g",
        cluster="k",
        fetchOffset={"t": {"0": 1, "1": 2}, "u": {}},
        maxBatchSize=2**31 - 1,
        maxLingerTime=-(2**31),
        version="v",
    ),
    QidResponse(topic="t", qid="0", nextRequestOffset=8, messages=[MESSAGE]),
    FetchResponse(code=0, results=[QidResponse(topic="t", qid="1", messages=[])]),
    AckResult(consumerId="c", groupId="g", cluster="k", offsets={"t": {"0": 99}}),
    PullException(code=1001, message="unknown group 'g'"),
    ConsumerService.submit_result(success=True),
    ConsumerService.submit_result(success=False),
    ConsumerService.getConsumeStats_result(success=[ConsumeStats("g", "t", {"0": 1}, {"0": 2})]),
]


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: type(s).__name__)
def test_round_trip(sample: TPayload) -> None:
    frame = wire.encode("pull", TMessageType.REPLY, 4_000_000_000, sample)
    assert wire.frame_length(frame[:4]) == len(frame) - 4
    envelope = wire.decode(frame[4:], lambda name, mtype: type(sample)())
    assert (envelope.name, envelope.type, envelope.seqid) == ("pull", TMessageType.REPLY, 4_000_000_000)
    assert type(envelope.body) is type(sample)
    assert vars(envelope.body) == vars(sample)  # (exceptions compare by identity, so compare fields)


def test_unknown_body_is_skipped() -> None:
    frame = wire.encode("frobnicate", TMessageType.CALL, 1, PullRequest(groupId="g", result=CHAIN))
    envelope = wire.decode(frame[4:], lambda name, mtype: None)
    assert envelope == wire.Envelope("frobnicate", TMessageType.CALL, 1, None)


def test_fields_of_a_newer_peer_are_ignored(tmp_path: Path) -> None:
    newer_idl = wire.IDL_PATH.read_text().replace(
        "60: optional string version;",
        "60: optional string version;\n    190: optional list<map<string, bool>> hints;\n"
        "    191: optional double weight;\n    192: optional bool urgent;",
        1,
    )
    path = tmp_path / "newer.thrift"
    path.write_text(newer_idl)
    newer = thriftpy2.load(str(path), module_name="newer_consumerProxy_thrift")
    request = newer.PullRequest(
        groupId="g", topic="t", maxBatchSize=3, hints=[{"a": True, "b": False}], weight=0.5, urgent=True
    )
    frame = wire.encode("pull", TMessageType.CALL, 1, newer.ConsumerService.pull_args(request=request))
    decoded = wire.decode(frame[4:], lambda name, mtype: ConsumerService.pull_args()).body
    assert decoded == ConsumerService.pull_args(request=PullRequest(groupId="g", topic="t", maxBatchSize=3))


def test_mismatched_field_type_is_skipped() -> None:
    # A Context whose qid arrives as an i64 (an old or broken peer): the field is skipped, not misread.
    frame = _message(b"\x1c" + b"\x18\x01g" + b"\x16\x02" + b"\x00" + b"\x00")
    body = wire.decode(frame, lambda name, mtype: ConsumerService.pull_args()).body
    assert body == ConsumerService.pull_args(request=PullRequest(groupId="g"))


def test_a_long_result_list_decodes() -> None:
    nodes = [ConsumeResult(Context("g", "t", str(qid)), [qid], []) for qid in range(150)]
    frame = wire.encode("submit", TMessageType.CALL, 1, ConsumerService.submit_args(result=wire.link_results(nodes)))
    body: Any = wire.decode(frame[4:], lambda name, mtype: ConsumerService.submit_args()).body
    assert [node.context.qid for node in wire.iter_results(body.result)] == [str(qid) for qid in range(150)]


def test_link_and_iter_results() -> None:
    assert wire.link_results([]) is None
    assert list(wire.iter_results(None)) == []
    assert [n.context.qid for n in wire.iter_results(CHAIN)] == ["0", "1", "7"]  # type: ignore[union-attr]


def test_encode_rejects_a_seqid_outside_32_bits() -> None:
    with pytest.raises(ValueError):
        wire.encode("pull", TMessageType.CALL, -1, PullRequest(groupId="g"))
    with pytest.raises(ValueError):
        wire.encode("pull", TMessageType.CALL, 2**32, PullRequest(groupId="g"))


# -- hostile payloads -------------------------------------------------------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        if value < 0x80:
            out.append(value)
            return bytes(out)
        out.append((value & 0x7F) | 0x80)
        value >>= 7


def _message(body: bytes, name: bytes = b"pull", mtype: int = TMessageType.CALL) -> bytes:
    """A payload: compact message header for ``name``, then ``body`` as the struct."""
    return bytes([0x82, (mtype << 5) | 1]) + _varint(5) + _varint(len(name)) + name + body


def _pull_args_decoder(name: str, mtype: int) -> Any:
    return ConsumerService.pull_args()


PULL_PAYLOAD = wire.encode(
    "pull",
    TMessageType.CALL,
    9,
    ConsumerService.pull_args(
        request=PullRequest(groupId="g", topic="t", maxBatchSize=8, maxLingerTime=100, result=CHAIN, version="1")
    ),
)[4:]

# 0x1C: field 1 (the PullRequest), struct; 0x18 0x01 'g': its groupId
_REQUEST = b"\x1c\x18\x01g"
# field 50 (long form: type byte, then zigzag i16 id 100), a ConsumeResult; 0x39: its field 3, a list
_RESULT_LIST = _REQUEST + b"\x0c" + _varint(100) + b"\x39"

# Sizes a payload declares but cannot hold: refused up front, before any allocation or loop.
HUGE_SIZES: dict[str, bytes] = {
    "huge name": bytes([0x82, 0x21, 0x01]) + _varint(2**31) + b"pull",
    "huge list of i64": _message(_RESULT_LIST + b"\xf6" + _varint(2**31 - 1) + b"\x02\x04"),
    "huge list, 64-bit size": _message(_RESULT_LIST + b"\xf6" + _varint(2**63) + b"\x02"),
    "huge list of zero-byte elements": _message(b"\x99\xf0" + _varint(2**62) + b"\x00"),
    "huge skipped list": _message(b"\x99\xf3" + _varint(2**40) + b"\x01\x02"),
    "huge skipped map": _message(b"\x9b" + _varint(2**40) + b"\x33\x01\x02"),
    "huge skipped string": _message(b"\x98" + _varint(2**40) + b"abc"),
    "huge groupId": _message(b"\x1c\x18" + _varint(2**35) + b"g"),
}

HOSTILE: dict[str, bytes] = {
    **HUGE_SIZES,
    "empty": b"",
    "not compact": b"GET / HTTP/1.1\r\n\r\n",
    "binary protocol": b"\x80\x01\x00\x01\x00\x00\x00\x04pull\x00\x00\x00\x01\x00",
    "bad version": bytes([0x82, 0x22]) + _varint(1) + b"\x04pull\x00",
    "bad message type": bytes([0x82, 0xE1]) + _varint(1) + b"\x04pull\x00",
    "seqid beyond 32 bits": bytes([0x82, 0x21]) + _varint(2**40) + b"\x04pull\x00",
    "name not utf-8": _message(b"\x00", name=b"\xff\xfe"),
    "endless varint": bytes([0x82, 0x21]) + b"\xff" * 64,
    "list of zero-byte elements": _message(b"\x99\x40" + b"\x00" * 8),
    "map of zero-byte entries": _message(b"\x9b" + _varint(4) + b"\x00" + b"\x00" * 16),
    "string not utf-8": _message(b"\x1c\x18\x02\xc3\x28\x00\x00"),
    "list of mismatched elements": _message(_RESULT_LIST + b"\x28\x01\x02\x00\x00\x00\x00"),
    "invalid field type": _message(b"\x1d\x00"),
    "deeply nested structs": _message(b"\x1c" * 100_000),
    "deeply nested skipped lists": _message(b"\x99" + b"\x19" * 100_000),
    "trailing bytes": PULL_PAYLOAD + b"\x00",
    "missing struct stop": PULL_PAYLOAD[:-1],
}


@pytest.mark.timeout(5)
@pytest.mark.parametrize("payload", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_payload_raises_frame_decode_error(payload: bytes) -> None:
    with pytest.raises(FrameDecodeError):
        wire.decode(payload, _pull_args_decoder)


@pytest.mark.timeout(5)
@pytest.mark.parametrize("payload", HUGE_SIZES.values(), ids=HUGE_SIZES.keys())
def test_declared_sizes_are_checked_against_the_payload(payload: bytes) -> None:
    with pytest.raises(FrameDecodeError, match="declared size"):
        wire.decode(payload, _pull_args_decoder)


@pytest.mark.timeout(5)
def test_every_truncation_raises_frame_decode_error() -> None:
    wire.decode(PULL_PAYLOAD, _pull_args_decoder)  # the whole payload is fine
    for end in range(len(PULL_PAYLOAD)):
        with pytest.raises(FrameDecodeError):
            wire.decode(PULL_PAYLOAD[:end], _pull_args_decoder)


@pytest.mark.timeout(10)
def test_random_and_mutated_payloads_only_raise_frame_decode_error() -> None:
    rng = random.Random(1234)
    payloads = [bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64))) for _ in range(2000)]
    payloads += [bytes([0x82, 0x21]) + bytes(rng.getrandbits(8) for _ in range(40)) for _ in range(2000)]
    for _ in range(3000):
        mutated = bytearray(PULL_PAYLOAD)
        for _ in range(rng.randrange(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.getrandbits(8)
        payloads.append(bytes(mutated))
    decoded = 0
    for payload in payloads:
        try:
            wire.decode(payload, _pull_args_decoder)
        except FrameDecodeError:
            continue
        decoded += 1
    assert decoded < len(payloads)  # the corpus did exercise the error paths


def test_the_nesting_limit_applies_to_real_structs() -> None:
    nodes = [ConsumeResult(Context("g", "t", str(qid)), [qid], []) for qid in range(wire.MAX_NESTING + 10)]
    frame = wire.encode("submit", TMessageType.CALL, 1, ConsumerService.submit_args(result=wire.link_results(nodes)))
    with pytest.raises(FrameDecodeError, match="nested"):
        wire.decode(frame[4:], lambda name, mtype: ConsumerService.submit_args())


def _payload_classes() -> list[type]:
    """Every struct of the IDL, and the args and result struct of every method."""
    classes = [getattr(wire, name) for name in EXPECTED]
    for method in ConsumerService.thrift_services:
        classes += [getattr(ConsumerService, f"{method}_args"), getattr(ConsumerService, f"{method}_result")]
    return classes


@pytest.mark.parametrize("struct_class", _payload_classes(), ids=lambda c: c.__name__)
def test_a_new_struct_is_what_its_constructor_makes(struct_class: type) -> None:
    made, built = struct_class(), new_struct(struct_class)
    assert type(built) is struct_class
    assert vars(built) == vars(made)
    # Its own attributes: filling one leaves the next new struct at its defaults.
    for name in vars(built):
        setattr(built, name, "changed")
    assert vars(new_struct(struct_class)) == vars(made)


def test_a_class_with_its_own_init_is_called() -> None:
    class Custom:
        def __init__(self) -> None:
            self.calls = 1

    assert vars(new_struct(Custom)) == {"calls": 1}
    assert isinstance(new_struct(TApplicationException), TApplicationException)
