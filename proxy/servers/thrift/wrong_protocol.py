"""The one answer a client on the wrong protocol or transport gets before its connection is closed.

The port speaks framed transport and the compact protocol. A client set up otherwise (the binary
protocol, or no framing) sends bytes the frame loop cannot take: unframed, their first four bytes read
as a frame length far out of range; framed but binary, the frame does not decode. Closing without a
word leaves some libraries waiting forever on the call (Node.js's ``thrift`` does), so the proxy
recognises the three wrong set-ups by their first bytes and answers the call with a
``TApplicationException`` (``PROTOCOL_ERROR``) in the client's own protocol and transport, naming what
the port speaks, with the call's name and sequence id (which is how the client matches it to the call).

This runs only once a connection's bytes were refused, never on a served request, and reads nothing
past the call's message header (at most :data:`MAX_NAME_BYTES` of method name).
"""

from __future__ import annotations

import asyncio
import struct
from typing import Final, NamedTuple

from ddmq.protocol.wire import FRAME_HEADER_BYTES, TApplicationException, TMessageType, encode
from ddmq.protocol.wire.layout import MAX_SEQID, VarintTooLongError, read_varint
from ddmq.proxy.servers.thrift.channel import ChannelClosedError, FrameChannel

__all__ = ["MAX_NAME_BYTES", "MESSAGE", "WrongCall", "answer", "answer_refused", "parse"]

#: A method name longer than this is not a call of this IDL: such bytes get no answer.
MAX_NAME_BYTES: Final = 256
#: What the answer says.
MESSAGE: Final = "this port speaks the compact protocol over framed transport (TFramedTransport + TCompactProtocol)"

#: How long a refused connection is given for the rest of a call's header, and for its answer to go out.
WAIT_S: Final = 1.0

_BINARY_VERSION: Final = 0x80010000
_COMPACT_ID: Final = 0x82
_COMPACT_VERSION: Final = 1


class WrongCall(NamedTuple):
    """A call recognised in bytes the port refused: its protocol (``binary`` or ``compact``), whether it
    came framed, its method name and sequence id."""

    protocol: str
    framed: bool
    name: str
    seqid: int


async def answer_refused(channel: FrameChannel, payload: bytes | None = None) -> WrongCall | None:
    """Answer the call of a connection whose bytes were refused, if they are one of a wrong set-up:
    ``payload`` is the frame that did not decode, None when the frame length was refused (the client
    does not frame). The call answered, if any (the caller closes the connection either way)."""
    try:
        async with asyncio.timeout(WAIT_S):
            while True:
                found = parse(payload if payload is not None else channel.head(), payload is not None)
                if not isinstance(found, int):
                    break
                if payload is not None or found > 8 + 4 + MAX_NAME_BYTES + 5:
                    return None
                await channel.wait_for(found)
            if found is None:
                return None
            channel.write(answer(found))
            await channel.drain()
            return found
    except (TimeoutError, ChannelClosedError, ConnectionError):
        return None


def parse(data: bytes, framed: bool) -> WrongCall | int | None:
    """The call whose message header starts ``data`` (a frame's payload when ``framed``, else the
    connection's first bytes); an int when more bytes are needed to tell (at least that many in all);
    None when ``data`` is no call this module answers (then the connection is closed without a word)."""
    if len(data) < 2:
        return 2
    if data[0] == 0x80 and data[1] == 0x01:
        return _parse_binary(data, framed)
    if data[0] == _COMPACT_ID and not framed and data[1] & 0x1F == _COMPACT_VERSION:
        return _parse_compact(data)
    return None


def _parse_binary(data: bytes, framed: bool) -> WrongCall | int | None:
    if len(data) < 8:
        return 8
    size: int = struct.unpack_from(">i", data, 4)[0]
    if not 0 < size <= MAX_NAME_BYTES:
        return None
    if len(data) < 12 + size:
        return 12 + size
    name = data[8:8 + size].decode("utf-8", "replace")
    seqid: int = struct.unpack_from(">i", data, 8 + size)[0]
    return WrongCall("binary", framed, name, seqid)


def _parse_compact(data: bytes) -> WrongCall | int | None:
    try:
        seqid, at = read_varint(data, 2)
        size, at = read_varint(data, at)
    except IndexError:  # the data ends inside a varint
        return len(data) + 1
    except VarintTooLongError:
        return None
    if seqid > MAX_SEQID or not 0 < size <= MAX_NAME_BYTES:
        return None
    if len(data) < at + size:
        return at + size
    return WrongCall("compact", False, data[at:at + size].decode("utf-8", "replace"), seqid)


def answer(call: WrongCall) -> bytes:
    """The call's answer: a ``TApplicationException`` (``PROTOCOL_ERROR``, :data:`MESSAGE`) in its
    protocol and transport."""
    if call.protocol == "compact":  # the codec's own frame, sent without its header
        return encode(call.name, TMessageType.EXCEPTION, call.seqid,
                      TApplicationException(TApplicationException.PROTOCOL_ERROR, MESSAGE))[FRAME_HEADER_BYTES:]
    name, message = call.name.encode(), MESSAGE.encode()
    body = (
        struct.pack(">Ii", _BINARY_VERSION | TMessageType.EXCEPTION, len(name)) + name + struct.pack(">i", call.seqid)
        + struct.pack(">bhi", 11, 1, len(message)) + message  # field 1, string: message
        + struct.pack(">bhi", 8, 2, TApplicationException.PROTOCOL_ERROR) + b"\x00"  # field 2, i32: type; stop
    )
    return struct.pack(">i", len(body)) + body if call.framed else body
