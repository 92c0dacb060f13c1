"""The compact protocol's numbers, its varint, and the ``Message`` layout, each written down once.

The reader, the writer and the hand-written pull reply encoder (:mod:`ddmq.proxy.core.pull_codec`) all
take their type ids, field headers and varints from here, so they cannot disagree about a byte.

``Message`` is the one struct with fast paths on both sides (the proxy writes it without the generic
writer, the client reads it without the generic field loop). :data:`MESSAGE_LAYOUT` is the shape those
fast paths assume; :data:`MESSAGE_LAYOUT_MATCHES` tells whether the loaded IDL still has it, and the fast
paths stand aside when it does not.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from thriftpy2.thrift import TMessageType, TType

from ddmq.protocol.wire.structs import Message

__all__ = [
    "COMPACT_OF_TTYPE",
    "FRAME_HEADER",
    "MAX_SEQID",
    "MESSAGE_LAYOUT",
    "MESSAGE_LAYOUT_MATCHES",
    "PROTOCOL_ID",
    "STRING_MAP_SPEC",
    "VARINT_MAX_BYTES",
    "VERSION",
    "CompactType",
    "VarintTooLongError",
    "field_header",
    "read_varint",
    "read_zigzag_varints",
    "shape",
    "split_spec",
    "varint",
    "zigzag64",
]

FRAME_HEADER: Final = struct.Struct("!i")  # a frame's length, 4 bytes big-endian, signed
PROTOCOL_ID: Final = 0x82
VERSION: Final = 1
MAX_SEQID: Final = 0xFFFFFFFF  # compact writes the i32 seqid as an unsigned varint
VARINT_MAX_BYTES: Final = 10  # enough for 64 bits


class CompactType:
    """Type ids of the compact protocol (they differ from the TType numbers in ``thrift_spec``); Final,
    so that compiled code reads them as constants."""

    STOP: Final = 0
    TRUE: Final = 1
    FALSE: Final = 2
    BYTE: Final = 3
    I16: Final = 4
    I32: Final = 5
    I64: Final = 6
    DOUBLE: Final = 7
    BINARY: Final = 8
    LIST: Final = 9
    SET: Final = 10
    MAP: Final = 11
    STRUCT: Final = 12


class ThriftType:
    """thriftpy2's ``TType`` numbers (the types in ``thrift_spec``) as Final constants: compiled code
    reads ``TType.X`` as an attribute of a Python class, a type lookup at every use."""

    BOOL: Final = 2
    BYTE: Final = 3
    DOUBLE: Final = 4
    I16: Final = 6
    I32: Final = 8
    I64: Final = 10
    STRING: Final = 11
    STRUCT: Final = 12
    MAP: Final = 13
    SET: Final = 14
    LIST: Final = 15
    BINARY: Final = 18


class MessageType:
    """thriftpy2's ``TMessageType`` numbers as Final constants (see :class:`ThriftType`)."""

    CALL: Final = 1
    REPLY: Final = 2
    EXCEPTION: Final = 3
    ONEWAY: Final = 4


COMPACT_OF_TTYPE: Final[dict[int, int]] = {
    TType.BOOL: CompactType.TRUE,
    TType.BYTE: CompactType.BYTE,
    TType.I16: CompactType.I16,
    TType.I32: CompactType.I32,
    TType.I64: CompactType.I64,
    TType.DOUBLE: CompactType.DOUBLE,
    TType.STRING: CompactType.BINARY,
    TType.BINARY: CompactType.BINARY,
    TType.LIST: CompactType.LIST,
    TType.SET: CompactType.SET,
    TType.MAP: CompactType.MAP,
    TType.STRUCT: CompactType.STRUCT,
}

if any(getattr(TType, name) != value for name, value in vars(ThriftType).items() if name.isupper()) or any(
    getattr(TMessageType, name) != value for name, value in vars(MessageType).items() if name.isupper()
):
    raise ImportError("thriftpy2's TType/TMessageType numbers differ from ddmq.protocol.wire.layout's")


def field_header(delta: int, ttype: int) -> int:
    """The one-byte field header: the field id's distance from the previous field, and the type."""
    assert 0 < delta <= 15, delta
    return delta << 4 | COMPACT_OF_TTYPE[ttype]


def split_spec(spec: Any) -> tuple[int, Any]:
    """``thrift_spec`` writes an element type either as a bare TType or as ``(TType, sub_spec)``."""
    if isinstance(spec, tuple):
        return spec[0], spec[1]
    return spec, None


def shape(spec: dict[int, Any]) -> list[tuple[Any, ...]]:
    """A ``thrift_spec`` as sorted ``(field id, TType, name, element spec)`` rows, for comparisons."""
    return [(fid, *field[:2], field[2] if len(field) == 4 else None) for fid, field in sorted(spec.items())]


# -- varints ------------------------------------------------------------------------------------


def _varint_loop(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Varints by 14-bit chunks from two tables (about 1.4 MB): offsets and millisecond timestamps are 3 to 6
# bytes long, and a byte-at-a-time loop over them would be a large part of the pull reply encoder's time.
_LAST14: Final = [_varint_loop(n) for n in range(1 << 14)]  # a final chunk: 1 or 2 bytes
_MORE14: Final = [bytes(((n & 0x7F) | 0x80, (n >> 7) | 0x80)) for n in range(1 << 14)]  # 2 bytes, more follow
#: ``SHORT_VARINTS[n]`` is ``varint(n)`` for ``n`` below :data:`SHORT_VARINT_LIMIT`: an encoder that writes
#: many short lengths looks them up instead of calling :func:`varint` for each.
SHORT_VARINTS: Final = _LAST14
SHORT_VARINT_LIMIT: Final = 1 << 14


def varint(n: int) -> bytes:
    """``n`` (not negative) as a protocol varint: 7 bits per byte, low first, high bit = more follow."""
    if n < 0x4000:
        return _LAST14[n]
    if n < 1 << 28:
        return _MORE14[n & 0x3FFF] + _LAST14[n >> 14]
    if n < 1 << 42:
        return _MORE14[n & 0x3FFF] + _MORE14[(n >> 14) & 0x3FFF] + _LAST14[n >> 28]
    if n < 1 << 56:
        return b"".join(
            (_MORE14[n & 0x3FFF], _MORE14[(n >> 14) & 0x3FFF], _MORE14[(n >> 28) & 0x3FFF], _LAST14[n >> 42])
        )
    return _varint_loop(n)


class VarintTooLongError(ValueError):
    """A varint runs on past :data:`VARINT_MAX_BYTES` bytes."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint starting at ``data[pos]``, and the position after it.

    IndexError when ``data`` ends inside it (callers on a fast path fall back on that, as on any other
    surprise), :class:`VarintTooLongError` past :data:`VARINT_MAX_BYTES` bytes.
    """
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 7 * VARINT_MAX_BYTES:
            raise VarintTooLongError(f"varint longer than {VARINT_MAX_BYTES} bytes")


def read_zigzag_varints(data: bytes, pos: int, count: int) -> tuple[list[int], int]:
    """``count`` zigzag varints (a list of i16/i32/i64) starting at ``data[pos]``, and the position after
    them. The loop of :func:`read_varint`, written out once more because this list is the offsets of
    a request's acks, the longest list nearly every request carries: a call per element costs about a
    third of its decoding. Same errors as :func:`read_varint`.
    """
    items: list[int] = []
    append = items.append
    for _ in range(count):
        result = shift = 0
        while True:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                break
            shift += 7
            if shift >= 7 * VARINT_MAX_BYTES:
                raise VarintTooLongError(f"varint longer than {VARINT_MAX_BYTES} bytes")
        append((result >> 1) ^ -(result & 1))
    return items, pos


def zigzag64(n: int) -> bytes:
    """A signed 64-bit integer (the caller checks the range) as its zigzag varint."""
    return varint((n << 1) ^ (n >> 63))


# -- Message ------------------------------------------------------------------------------------

STRING_MAP_SPEC: Final = (TType.STRING, TType.STRING)

#: ``Message`` as the fast paths read and write it: ``(field id, TType, name, element spec)``.
MESSAGE_LAYOUT: Final = (
    (1, TType.STRING, "key", None),
    (2, TType.BINARY, "value", None),
    (3, TType.STRING, "tag", None),
    (4, TType.I64, "offset", None),
    (5, TType.MAP, "properties", STRING_MAP_SPEC),
    (20, TType.I64, "produceTime", None),
)

#: Whether the loaded IDL's ``Message`` is :data:`MESSAGE_LAYOUT`.
MESSAGE_LAYOUT_MATCHES: Final = shape(Message.thrift_spec) == list(MESSAGE_LAYOUT)


def _message_headers() -> tuple[int, ...]:
    headers = []
    last = 0
    for fid, ttype, _, _ in MESSAGE_LAYOUT:
        headers.append(field_header(fid - last, ttype))
        last = fid
    return tuple(headers)


# The one-byte field headers of MESSAGE_LAYOUT, in order (all deltas fit one byte: 1, 1, 1, 1, 1, 15).
(
    KEY_HEADER,
    VALUE_HEADER,
    TAG_HEADER,
    OFFSET_HEADER,
    PROPERTIES_HEADER,
    PRODUCE_TIME_HEADER,
) = _message_headers()
