"""Our compact writer (``wire.encode``) must give thriftpy2's bytes for every struct of the IDL."""

from __future__ import annotations

import random
from typing import Any

import pytest
from thriftpy2.protocol.compact import TCompactProtocol
from thriftpy2.protocol.exc import TProtocolException
from thriftpy2.thrift import TPayload, TType
from thriftpy2.transport import TMemoryBuffer

from ddmq.protocol import wire
from ddmq.protocol.wire import AckResult, ConsumeResult, ConsumerService, Context, PullRequest, TMessageType


def _thriftpy2_frame(name: str, seqid: int, body: TPayload, mtype: int = TMessageType.CALL) -> bytes:
    buffer: Any = TMemoryBuffer()
    protocol: Any = TCompactProtocol(buffer)
    protocol.write_message_begin(name, mtype, seqid)
    body.write(protocol)
    payload: bytes = buffer.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def _offsets(rng: random.Random) -> list[int]:
    size = rng.choice([0, 1, 14, 15, 64, 300])
    pick = [0, 1, -1, 63, 64, 127, 128, 16_383, 16_384, (1 << 63) - 1, -(1 << 63)]
    return [rng.choice([rng.choice(pick), rng.getrandbits(rng.randint(1, 62))]) for _ in range(size)]


@pytest.mark.parametrize("seed", range(30))
def test_requests_with_offset_lists_match_thriftpy2(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [
        ConsumeResult(
            context=Context(groupId="g", topic="t", qid=str(qid)),
            successOffsets=_offsets(rng),
            failOffsets=rng.choice([None, [], _offsets(rng)]),
        )
        for qid in range(rng.randint(0, 4))
    ]
    request = PullRequest(groupId="g", topic="t", maxBatchSize=64, maxLingerTime=-5, result=wire.link_results(nodes))
    body = ConsumerService.pull_args(request=request)
    assert wire.encode("pull", TMessageType.CALL, seed, body) == _thriftpy2_frame("pull", seed, body)


def test_out_of_range_elements_raise_as_thriftpy2_does() -> None:
    body = ConsumerService.submit_args(result=ConsumeResult(successOffsets=[1, 1 << 63]))
    with pytest.raises(TProtocolException):
        wire.encode("submit", TMessageType.CALL, 1, body)


def test_nested_maps_are_left_to_thriftpy2() -> None:
    body = ConsumerService.ack_args(
        result=AckResult(consumerId="c", groupId="g", cluster="x", offsets={"t": {"0": 5, "1": 1 << 40}})
    )
    assert wire.encode("ack", TMessageType.CALL, 3, body) == _thriftpy2_frame("ack", 3, body)


def _random_value(rng: random.Random, ttype: int, spec: Any, depth: int) -> Any:
    if ttype == TType.STRING:
        return "".join(rng.choice("aZ0 é日🙂") for _ in range(rng.choice([0, 1, 5, 20, 200])))
    if ttype == TType.BINARY:
        return rng.randbytes(rng.choice([0, 1, 7, 300]))
    if ttype in (TType.I16, TType.I32, TType.I64):
        bits = {TType.I16: 15, TType.I32: 31, TType.I64: 63}[ttype]
        return rng.choice([0, 1, -1, (1 << bits) - 1, -(1 << bits), rng.randint(-(1 << bits), (1 << bits) - 1)])
    if ttype == TType.BOOL:
        return rng.random() < 0.5
    if ttype == TType.BYTE:
        return rng.randint(-128, 127)
    if ttype == TType.DOUBLE:
        return rng.uniform(-1e9, 1e9)
    if ttype == TType.STRUCT:
        return _random_struct(rng, spec, depth + 1)
    if ttype in (TType.LIST, TType.SET):
        elem = spec if isinstance(spec, tuple) else (spec, None)
        return [_random_value(rng, elem[0], elem[1], depth) for _ in range(rng.choice([0, 1, 14, 15, 40]))]
    if ttype == TType.MAP:
        key = spec[0] if isinstance(spec[0], tuple) else (spec[0], None)
        value = spec[1] if isinstance(spec[1], tuple) else (spec[1], None)
        return {
            _random_value(rng, key[0], key[1], depth): _random_value(rng, value[0], value[1], depth)
            for _ in range(rng.choice([0, 1, 3, 16]))
        }
    raise AssertionError(f"type {ttype} not in the IDL")


def _random_struct(rng: random.Random, cls: Any, depth: int = 0) -> Any:
    obj = cls()
    for field in cls.thrift_spec.values():
        if rng.random() < 0.25 or (field[0] == TType.STRUCT and depth > 3):
            continue  # left unset: not written
        setattr(obj, field[1], _random_value(rng, field[0], field[2] if len(field) == 4 else None, depth))
    return obj


_STRUCTS = sorted(
    (
        value
        for value in vars(wire.consumer_thrift).values()
        if isinstance(value, type) and hasattr(value, "thrift_spec")
    ),
    key=lambda cls: cls.__name__,
)
_CALLS = [
    getattr(ConsumerService, f"{name}_{part}")
    for name in sorted(ConsumerService.thrift_services)
    for part in ("args", "result")
]


@pytest.mark.parametrize("cls", [*_STRUCTS, *_CALLS], ids=lambda cls: cls.__name__)
@pytest.mark.parametrize("seed", range(8))
def test_every_struct_of_the_idl_matches_thriftpy2(cls: Any, seed: int) -> None:
    rng = random.Random(seed)
    body = _random_struct(rng, cls)
    seqid = rng.choice([0, 1, 200, 0xFFFFFFFF])
    assert wire.encode("m", TMessageType.REPLY, seqid, body) == _thriftpy2_frame("m", seqid, body, TMessageType.REPLY)


def test_application_errors_match_thriftpy2() -> None:
    error = wire.TApplicationException(wire.TApplicationException.UNKNOWN_METHOD, "unknown method 'x' ü")
    assert wire.encode("x", TMessageType.EXCEPTION, 4, error) == _thriftpy2_frame("x", 4, error, TMessageType.EXCEPTION)
