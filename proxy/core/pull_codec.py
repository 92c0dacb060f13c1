"""The ``pull`` reply, encoded by hand: the proxy's hottest serialisation.

thriftpy2's compact writer is pure Python and walks ``thrift_spec`` for every field of every message;
:func:`encode_pull_reply` writes the same bytes directly from the engine's messages, without building
thriftpy2 structs first (``bench/micro.py`` measures both). The output is byte for byte what thriftpy2's
``TCompactProtocol`` writes for ``pull_result(success=PullResponse(...))`` with the same values
(``tests/protocol/test_pull_codec.py`` compares them on many random replies).

It knows the IDL's field ids and types. :data:`FAST_PULL_REPLY` is False when the loaded IDL's
``PullResponse``, ``Context``, ``Message`` or ``pull_result`` differ from the shapes written here (a
field was added, say); :func:`pull_reply_encoder` then hands out :func:`encode_pull_reply_generic`, the
same interface over the generic writer, and a test fails until this module learns the new shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from thriftpy2.thrift import TMessageType, TType

from ddmq.protocol.redis.stream_entry import StoredMessage
from ddmq.protocol.wire.layout import (
    FRAME_HEADER,
    KEY_HEADER,
    MESSAGE_LAYOUT_MATCHES,
    OFFSET_HEADER,
    PRODUCE_TIME_HEADER,
    PROPERTIES_HEADER,
    PROTOCOL_ID,
    SHORT_VARINT_LIMIT,
    SHORT_VARINTS,
    TAG_HEADER,
    VALUE_HEADER,
    VERSION,
    shape,
    varint,
)
from ddmq.protocol.wire.structs import ConsumerService, Context, Message, PullResponse
from ddmq.protocol.wire.writer import encode

__all__ = [
    "FAST_PULL_REPLY",
    "MESSAGE_OVERHEAD_BYTES",
    "REPLY_OVERHEAD_BYTES",
    "UTF8_MAX_BYTES",
    "PullReplyEncoder",
    "ReplyMessage",
    "encode_message",
    "encode_pull_reply",
    "encode_pull_reply_generic",
    "message_bytes_bound",
    "pull_reply_encoder",
]


#: What a reply carries of a message: the engine's messages as read. A NamedTuple rather than a
#: Protocol, so the compiled build reads its fields by index instead of by attribute lookups.
ReplyMessage = StoredMessage


class PullReplyEncoder(Protocol):
    """The interface both encoders share: the complete frame answering pull call ``seqid``."""

    def __call__(
        self,
        seqid: int,
        group: str,
        topic: str,
        qid: str,
        messages: Sequence[ReplyMessage],
        runs: Sequence[int] | None = None,
    ) -> bytes: ...


# Compact-protocol field headers: (field-id delta << 4) | compact type.
_STRING_NEXT: Final = b"\x18"  # next field id, BINARY (strings and binaries alike)
_STRUCT_NEXT: Final = b"\x1c"
_LIST_NEXT: Final = b"\x19"
_STOP: Final = b"\x00"
_STRING_PAIR: Final = b"\x88"  # map<string, string>: key and value type BINARY
_STRUCT_LIST_MANY: Final = 0xFC  # list<struct> of 15 or more: 0xF0 | STRUCT, then the size
_STRUCT_ELEMENT: Final = 0x0C
_SUCCESS_FIELD: Final = b"\x0c\x00"  # field 0 (delta 0 needs the long form): STRUCT, zigzag(0)
# PullResponse.runs: field 80 is 78 past field 2, beyond a one-byte header's delta: type LIST, then
# the field id as a zigzag varint (160). Its list<i32> header: size << 4 | I32, or 0xF5 and the size.
_RUNS_FIELD: Final = b"\x09\xa0\x01"
_I32_ELEMENT: Final = 0x05
_I32_LIST_MANY: Final = 0xF5
_REPLY_HEADER: Final = bytes((PROTOCOL_ID, VERSION | (TMessageType.REPLY << 5)))
_PULL_NAME: Final = b"\x04pull"
# Message, in MESSAGE_LAYOUT: key, value, tag (length-prefixed), offset, properties, produceTime, STOP;
# the field headers as the bytes between the values.
_KEY_FIELD: Final = bytes((KEY_HEADER,))
_VALUE_FIELD: Final = bytes((VALUE_HEADER,))
_TAG_FIELD: Final = bytes((TAG_HEADER,))
_OFFSET_FIELD: Final = bytes((OFFSET_HEADER,))
_PROPERTIES_FIELD: Final = bytes((PROPERTIES_HEADER,))
_PRODUCE_TIME_FIELD: Final = bytes((PRODUCE_TIME_HEADER,))
_NO_PROPERTIES_THEN_TIME: Final = bytes((PROPERTIES_HEADER, 0, PRODUCE_TIME_HEADER))


def encode_message(message: ReplyMessage) -> bytes:
    """One ``Message`` struct as the reply carries it (properties always present, maybe empty)."""
    parts: list[bytes] = []
    _add_message(parts, message)
    return b"".join(parts)


def _add_message(parts: list[bytes], message: ReplyMessage) -> None:
    """Appends ``message``'s encoding to ``parts`` (joined once per reply): no bytes object of its own,
    no formatting; lengths below 2^14 (nearly all) are looked up. Runs once per message delivered."""
    offset = message.offset
    produced = message.produce_ms
    # An i64 shifted right by 63 is 0 or -1; the shift stays a machine-word operation when compiled,
    # where comparing with the i64 bounds themselves takes the big-integer path.
    if not (-1 <= offset >> 63 <= 0 and -1 <= produced >> 63 <= 0):
        raise ValueError(f"offset {offset} or produce time {produced} does not fit a thrift i64")
    key = message.key.encode("utf-8")
    value = message.value
    tag = message.tag.encode("utf-8")
    properties = message.properties
    n_key, n_value, n_tag = len(key), len(value), len(tag)
    parts += (
        _KEY_FIELD,
        SHORT_VARINTS[n_key] if n_key < SHORT_VARINT_LIMIT else varint(n_key),
        key,
        _VALUE_FIELD,
        SHORT_VARINTS[n_value] if n_value < SHORT_VARINT_LIMIT else varint(n_value),
        value,
        _TAG_FIELD,
        SHORT_VARINTS[n_tag] if n_tag < SHORT_VARINT_LIMIT else varint(n_tag),
        tag,
        _OFFSET_FIELD,
        varint((offset << 1) ^ (offset >> 63)),
    )
    if properties:
        parts += (_PROPERTIES_FIELD, _encode_properties(properties), _PRODUCE_TIME_FIELD)
    else:
        parts.append(_NO_PROPERTIES_THEN_TIME)
    parts += (varint((produced << 1) ^ (produced >> 63)), _STOP)


#: Most bytes a pull reply frame takes besides its messages: frame and message headers, the seqid, the
#: Context (group and topic names are at most 200 ASCII characters, a qid at most 5 digits), the
#: headers of the message list and of ``runs``, the stops.
REPLY_OVERHEAD_BYTES: Final = 1024
#: A message beside its key, value, tag and properties: 6 field headers and a stop, 3 length varints
#: (5 bytes each up to 32 GiB), offset and produce time (10 each), an empty map (1), and its entry in
#: ``runs`` (at most one per message, an i32 varint: 5).
MESSAGE_OVERHEAD_BYTES: Final = 7 + 3 * 5 + 2 * 10 + 1 + 5
#: A character of a ``str`` takes at most this many bytes in UTF-8.
UTF8_MAX_BYTES: Final = 4


def message_bytes_bound(message: ReplyMessage) -> int:
    """At least the bytes :func:`encode_message` writes for ``message``, plus its entry in ``runs``:
    what a message adds to a pull reply. Cheap (no encoding): a reply is filled by this bound. Without
    properties it is ``len(value) + (len(key) + len(tag)) * UTF8_MAX_BYTES + MESSAGE_OVERHEAD_BYTES``
    (the pull buffer writes that out rather than call this once per message)."""
    size = len(message.value) + (len(message.key) + len(message.tag)) * UTF8_MAX_BYTES + MESSAGE_OVERHEAD_BYTES
    properties = message.properties
    if properties:
        # the map's header (a size varint and the types), then per entry two length varints and two strings
        # (a loop, not sum() over a generator: a traced producer's every message has properties)
        size += 6
        for name, text in properties.items():
            size += 10 + UTF8_MAX_BYTES * (len(name) + len(text))
    return size


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
    messages: Sequence[ReplyMessage],
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
    for message in messages:
        _add_message(parts, message)
    if runs is not None:
        parts.append(_encode_runs(runs))
    parts += (_STOP, _STOP)  # end of PullResponse, end of pull_result
    payload = b"".join(parts)
    return FRAME_HEADER.pack(len(payload)) + payload


def _encode_runs(runs: Sequence[int]) -> bytes:
    size = len(runs)
    header = bytes((size << 4 | _I32_ELEMENT,)) if size <= 14 else bytes((_I32_LIST_MANY,)) + varint(size)
    return b"".join((_RUNS_FIELD, header, *(varint((n << 1) ^ (n >> 31)) for n in runs)))


def _idl_matches() -> bool:
    """Whether the loaded IDL has exactly the shapes this module writes."""
    return (
        MESSAGE_LAYOUT_MATCHES
        and shape(Context.thrift_spec)
        == [(1, TType.STRING, "groupId", None), (2, TType.STRING, "topic", None), (3, TType.STRING, "qid", None)]
        and shape(PullResponse.thrift_spec)
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


def encode_pull_reply_generic(
    seqid: int,
    group: str,
    topic: str,
    qid: str,
    messages: Sequence[ReplyMessage],
    runs: Sequence[int] | None = None,
) -> bytes:
    """:func:`encode_pull_reply` through thriftpy2 structs and the generic writer: any IDL shape."""
    response = PullResponse(
        context=Context(groupId=group, topic=topic, qid=qid),
        messages=[
            Message(
                key=m.key,
                value=m.value,
                tag=m.tag,
                offset=m.offset,
                properties=m.properties,
                produceTime=m.produce_ms,
            )
            for m in messages
        ],
        runs=None if runs is None else list(runs),
    )
    return encode("pull", TMessageType.REPLY, seqid, ConsumerService.pull_result(success=response))


def pull_reply_encoder() -> PullReplyEncoder:
    """The encoder for the loaded IDL: the hand-written one when it matches, else the generic one."""
    return encode_pull_reply if FAST_PULL_REPLY else encode_pull_reply_generic
