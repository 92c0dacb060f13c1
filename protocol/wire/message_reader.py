"""The reader's fast path for ``Message``: the struct a pull reply carries by the hundred.

Both functions expect :data:`~ddmq.protocol.wire.layout.MESSAGE_LAYOUT`, the layout the proxy writes, and
read it without the generic field loop. Anything else (a missing or extra field, a long key) is read
again the generic way, which also reports what is wrong with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ddmq.protocol.wire.layout import (
    KEY_HEADER,
    OFFSET_HEADER,
    PRODUCE_TIME_HEADER,
    PROPERTIES_HEADER,
    STRING_MAP_SPEC,
    TAG_HEADER,
    VALUE_HEADER,
    VARINT_MAX_BYTES,
    CompactType,
    VarintTooLongError,
    read_varint,
)
from ddmq.protocol.wire.structs import Message

if TYPE_CHECKING:
    from ddmq.protocol.wire.reader import CompactReader

__all__ = ["read_message", "read_messages"]


#: An empty properties map and produceTime's field header: what follows a message's offset.
_EMPTY_PROPERTIES_THEN_TIME: Final = bytes((PROPERTIES_HEADER, 0, PRODUCE_TIME_HEADER))


#: The string map header's element types (string key, string value) in one byte.
_STRING_PAIR: Final = CompactType.BINARY << 4 | CompactType.BINARY
#: Most properties a message may have for the Message loop to read them (a trace context is one to
#: three); a larger map goes the generic way, which counts its entries against the reader's limit.
_SMALL_MAP: Final = 8
#: Marks "no properties" inside the Message loop (each message still gets a dict of its own).
_NO_PROPERTIES: Final[dict[str, str]] = {}


class _OtherLayout(Exception):
    """A struct is not in the layout a fast path expects (read it the generic way)."""


def read_message(reader: CompactReader) -> Message:
    """A ``Message`` laid out as :data:`~ddmq.protocol.wire.layout.MESSAGE_LAYOUT`, read without the
    generic field loop; any other layout (a missing or extra field) goes through :meth:`CompactReader.read_struct`."""
    data = reader.data
    start = reader.pos
    try:
        if data[start] != KEY_HEADER:
            raise _OtherLayout
        reader.pos = start + 1
        key = reader.read_bytes().decode("utf-8")
        if data[reader.pos] != VALUE_HEADER:
            raise _OtherLayout
        reader.pos += 1
        value = reader.read_bytes()
        if data[reader.pos] != TAG_HEADER:
            raise _OtherLayout
        reader.pos += 1
        tag = reader.read_bytes().decode("utf-8")
        if data[reader.pos] != OFFSET_HEADER:
            raise _OtherLayout
        reader.pos += 1
        offset = reader.read_zigzag()
        if data[reader.pos] != PROPERTIES_HEADER:
            raise _OtherLayout
        reader.pos += 1
        if data[reader.pos] == 0:
            reader.pos += 1
            properties: dict[str, str] = {}
        else:
            properties = reader.read_map(STRING_MAP_SPEC)
        if data[reader.pos] != PRODUCE_TIME_HEADER:
            raise _OtherLayout
        reader.pos += 1
        produce_time = reader.read_zigzag()
        if data[reader.pos] != CompactType.STOP:
            raise _OtherLayout
        reader.pos += 1
    except (_OtherLayout, IndexError):
        reader.pos = start
        message = Message()
        reader.read_struct(message)
        return message
    return Message(key=key, value=value, tag=tag, offset=offset, properties=properties, produceTime=produce_time)


def read_messages(reader: CompactReader, count: int) -> list[Message]:
    """``count`` Messages laid out as the proxy writes them, in one loop without the generic field reader
    (:func:`_read_run`). A message that runs past the payload or is laid out any other way (a key or tag
    of 128 bytes or more, more than :data:`_SMALL_MAP` properties, a missing field) is read again by
    :func:`read_message`, which also reports what is wrong with it, and the loop goes on behind it.
    """
    messages: list[Message] = []
    data = reader.data
    pos = _read_run(data, reader.pos, count, messages)
    while len(messages) < count:
        reader.pos = pos
        messages.append(read_message(reader))
        pos = _read_run(data, reader.pos, count - len(messages), messages)
    reader.pos = pos
    return messages


def _read_small_map(data: bytes, pos: int) -> tuple[dict[str, str], int]:
    """A properties map of up to :data:`_SMALL_MAP` strings to strings from its field header at
    ``data[pos]`` through produceTime's field header; :class:`_OtherLayout` for anything else (a larger
    map, another type, text that is not UTF-8), IndexError past the payload."""
    size = data[pos + 1]
    if data[pos] != PROPERTIES_HEADER or not 0 < size <= _SMALL_MAP or data[pos + 2] != _STRING_PAIR:
        raise _OtherLayout
    pos += 3
    properties: dict[str, str] = {}
    try:
        for _ in range(size):
            length, pos = read_varint(data, pos)
            end = pos + length
            name = data[pos:end].decode("utf-8")
            length, pos = read_varint(data, end)
            end = pos + length
            properties[name] = data[pos:end].decode("utf-8")
            pos = end
    except (UnicodeDecodeError, VarintTooLongError):
        raise _OtherLayout from None
    if data[pos] != PRODUCE_TIME_HEADER:  # also proves no slice above ran past the payload
        raise _OtherLayout
    return properties, pos + 1


def _read_run(data: bytes, pos: int, count: int, messages: list[Message]) -> int:
    """Up to ``count`` Messages in the proxy's layout from ``data`` at ``pos``, appended to ``messages``; returns
    where they end (where the first one in another layout starts). Every index read is checked (``IndexError``),
    every slice ends before the next index read, and a length from the payload moves on only until checked."""
    new, append = object.__new__, messages.append
    # the layout's field headers as locals: this loop runs for every message of a reply
    key_header, value_header, tag_header, offset_header = KEY_HEADER, VALUE_HEADER, TAG_HEADER, OFFSET_HEADER
    empty_tail, stop, max_shift = _EMPTY_PROPERTIES_THEN_TIME, CompactType.STOP, 7 * VARINT_MAX_BYTES
    for _ in range(count):
        start = pos
        try:
            # key and tag: a length under 128; value: any length (bodies are often 128 bytes or more)
            end = pos + 2 + data[pos + 1]
            if data[pos] != key_header or data[pos + 1] & 0x80 or data[end] != value_header:
                raise _OtherLayout
            key = data[pos + 2 : end]
            size = data[end + 1]
            if size & 0x80:
                size, pos = read_varint(data, end + 1)
            else:  # a body under 128 bytes: no call for its length
                pos = end + 2
            end = pos + size
            value = data[pos:end]
            pos = end + 3 + data[end + 1]
            if data[end] != tag_header or data[end + 1] & 0x80 or data[pos - 1] != offset_header:
                raise _OtherLayout
            tag = data[end + 2 : pos - 1]
            # offset and produceTime, zigzag varints: read_varint's loop written out (a call costs a tenth of this loop)
            offset = shift = 0
            while (byte := data[pos]) & 0x80:
                offset |= (byte & 0x7F) << shift
                shift += 7
                pos += 1
            offset |= byte << shift
            if shift >= max_shift:
                raise _OtherLayout
            if data[pos + 1 : pos + 4] == empty_tail:
                properties, pos = _NO_PROPERTIES, pos + 4
            else:
                properties, pos = _read_small_map(data, pos + 1)
            number = shift = 0
            while (byte := data[pos]) & 0x80:
                number |= (byte & 0x7F) << shift
                shift += 7
                pos += 1
            number |= byte << shift
            if shift >= max_shift or data[pos + 1] != stop:  # also proves no slice above ran past the payload
                raise _OtherLayout
            pos += 2
        except (_OtherLayout, IndexError, VarintTooLongError):
            return start
        message = new(Message)
        message.key = key.decode("utf-8")
        message.value = value
        message.tag = tag.decode("utf-8")
        message.offset = (offset >> 1) ^ -(offset & 1)
        message.properties = {} if properties is _NO_PROPERTIES else properties
        message.produceTime = (number >> 1) ^ -(number & 1)
        append(message)
    return pos
