"""The ``pull`` reply, encoded by hand: the proxy's hottest serialisation.

thriftpy2's compact writer is pure Python and walks ``thrift_spec`` for every field of every message;
encoding pull replies with it cost about a third of the proxy's CPU. :func:`encode_pull_reply` writes
the same bytes directly from the engine's :class:`~ddmq.proxy.types.StoredMessage` values, without
building thriftpy2 structs first (11 µs per message before, 1 µs now; ``bench/micro.py``). The output
is byte for byte what thriftpy2's ``TCompactProtocol`` writes for
``pull_result(success=PullResponse(...))`` with the same values (``tests/proxy/test_pull_codec.py``
compares them on many random replies).

It knows the IDL's field ids and types. :data:`FAST_PULL_REPLY` is False when the loaded IDL's
``PullResponse``, ``Context``, ``Message`` or ``pull_result`` differ from the shapes written here (a
field was added, say); the Thrift server then falls back to ``wire.encode``, and a test fails until this
module learns the new shape.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, Final

from thriftpy2.thrift import TType

from ddmq.client.wire import ConsumerService, Context, Message, PullResponse, TMessageType, varint
from ddmq.proxy.types import StoredMessage

__all__ = ["FAST_PULL_REPLY", "encode_message", "encode_pull_reply"]

_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_FRAME_HEADER: Final = struct.Struct("!i")

# Compact-protocol field headers: (field-id delta << 4) | compact type.
_STRING_NEXT: Final = b"\x18"  # next field id, BINARY (strings and binaries alike)
_STRUCT_NEXT: Final = b"\x1c"
_LIST_NEXT: Final = b"\x19"
_STOP: Final = b"\x00"
_EMPTY_MAP: Final = b"\x00"
_STRING_PAIR: Final = b"\x88"  # map<string, string>: key and value type BINARY
_STRUCT_LIST_MANY: Final = 0xFC  # list<struct> of 15 or more: 0xF0 | STRUCT, then the size
_STRUCT_ELEMENT: Final = 0x0C
_SUCCESS_FIELD: Final = b"\x0c\x00"  # field 0 (delta 0 needs the long form): STRUCT, zigzag(0)
# PullResponse.runs: field 80 is 78 past field 2, beyond a one-byte header's delta: type LIST, then
# the field id as a zigzag varint (160). Its list<i32> header: size << 4 | I32, or 0xF5 and the size.
_RUNS_FIELD: Final = b"\x09\xa0\x01"
_I32_ELEMENT: Final = 0x05
_I32_LIST_MANY: Final = 0xF5
_REPLY_HEADER: Final = bytes((0x82, 0x01 | (TMessageType.REPLY << 5)))
_PULL_NAME: Final = b"\x04pull"
# Message: key (1), value (2), tag (3) as BINARY, offset (4) I64, properties (5) MAP, then produceTime
# (20) I64 with a one-byte header (delta 15 from field 5), and the struct's STOP.
_MESSAGE: Final = b"\x18%b%b\x18%b%b\x18%b%b\x16%b\x1b%b\xf6%b\x00"


def _i64(n: int) -> bytes:
    if not _I64_MIN <= n <= _I64_MAX:
        raise ValueError(f"{n} does not fit a thrift i64")
    return varint((n << 1) ^ (n >> 63))


def encode_message(message: StoredMessage) -> bytes:
    """One ``Message`` struct as the reply carries it (properties always present, maybe empty)."""
    key = message.key.encode("utf-8")
    value = message.value
    tag = message.tag.encode("utf-8")
    properties = message.properties
    return _MESSAGE % (
        varint(len(key)),
        key,
        varint(len(value)),
        value,
        varint(len(tag)),
        tag,
        _i64(message.offset),
        _encode_properties(properties) if properties else _EMPTY_MAP,
        _i64(message.produce_ms),
    )


def _encode_properties(properties: dict[str, str]) -> bytes:
    parts = [varint(len(properties)), _STRING_PAIR]
    for name, text in properties.items():
        raw_name = name.encode("utf-8")
        raw_text = text.encode("utf-8")
        parts += (varint(len(raw_name)), raw_name, varint(len(raw_text)), raw_text)
    return b"".join(parts)


def encode_pull_reply(
    seqid: int,
    group: str,
    topic: str,
    qid: str,
    messages: Sequence[StoredMessage],
    runs: Sequence[int] | None = None,
) -> bytes:
    """The complete frame (length header included) answering pull call ``seqid``; ``runs`` is
    ``PullResponse.runs`` (left out when None)."""
    if not 0 <= seqid <= 0xFFFFFFFF:
        raise ValueError(f"seqid {seqid} is outside the unsigned 32-bit range")
    raw_group = group.encode("utf-8")
    raw_topic = topic.encode("utf-8")
    raw_qid = qid.encode("utf-8")
    count = len(messages)
    list_header = bytes((count << 4 | _STRUCT_ELEMENT,)) if count <= 14 else bytes((_STRUCT_LIST_MANY,)) + varint(count)
    parts = [
        _REPLY_HEADER,
        varint(seqid),
        _PULL_NAME,
        _SUCCESS_FIELD,
        _STRUCT_NEXT,
        _STRING_NEXT,
        varint(len(raw_group)),
        raw_group,
        _STRING_NEXT,
        varint(len(raw_topic)),
        raw_topic,
        _STRING_NEXT,
        varint(len(raw_qid)),
        raw_qid,
        _STOP,
        _LIST_NEXT,
        list_header,
    ]
    parts += map(encode_message, messages)
    if runs is not None:
        parts.append(_encode_runs(runs))
    parts += (_STOP, _STOP)  # end of PullResponse, end of pull_result
    payload = b"".join(parts)
    return _FRAME_HEADER.pack(len(payload)) + payload


def _encode_runs(runs: Sequence[int]) -> bytes:
    size = len(runs)
    header = bytes((size << 4 | _I32_ELEMENT,)) if size <= 14 else bytes((_I32_LIST_MANY,)) + varint(size)
    return b"".join((_RUNS_FIELD, header, *(varint((n << 1) ^ (n >> 31)) for n in runs)))


def _shape(spec: dict[int, Any]) -> list[tuple[Any, ...]]:
    return [(fid, *field[:2], field[2] if len(field) == 4 else None) for fid, field in sorted(spec.items())]


def _idl_matches() -> bool:
    """Whether the loaded IDL has exactly the shapes this module writes."""
    return (
        _shape(Message.thrift_spec)
        == [
            (1, TType.STRING, "key", None),
            (2, TType.BINARY, "value", None),
            (3, TType.STRING, "tag", None),
            (4, TType.I64, "offset", None),
            (5, TType.MAP, "properties", (TType.STRING, TType.STRING)),
            (20, TType.I64, "produceTime", None),
        ]
        and _shape(Context.thrift_spec)
        == [(1, TType.STRING, "groupId", None), (2, TType.STRING, "topic", None), (3, TType.STRING, "qid", None)]
        and _shape(PullResponse.thrift_spec)
        == [
            (1, TType.STRUCT, "context", Context),
            (2, TType.LIST, "messages", (TType.STRUCT, Message)),
            (80, TType.LIST, "runs", TType.I32),
        ]
        and [field[:2] for _, field in sorted(ConsumerService.pull_result.thrift_spec.items())]
        == [(TType.STRUCT, "success"), (TType.STRUCT, "error")]
    )


#: True when :func:`encode_pull_reply` matches the loaded IDL (the Thrift server uses it then).
FAST_PULL_REPLY: Final = _idl_matches()
