"""One frame payload decoded into an :class:`Envelope` (:func:`decode`), and the refusals a server
answers instead of closing the connection (:class:`FrameRefusedError` and its kinds); the compact
reader underneath is :mod:`ddmq.protocol.wire.reader`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from thriftpy2.thrift import TPayload

from ddmq.protocol.wire.layout import CompactType
from ddmq.protocol.wire.reader import CompactReader, FrameDecodeError, _OutOfRange, _TooManyElements

__all__ = ["Envelope", "FieldRangeError", "FrameRefusedError", "FrameTooLargeError", "decode"]


class FrameRefusedError(FrameDecodeError):
    """A message whose header decoded, refused for what it carries: a server can answer the call
    (it knows its name and seqid) with an error instead of closing the connection."""

    def __init__(self, message: str, name: str, mtype: int, seqid: int) -> None:
        super().__init__(message)
        self.name = name
        self.mtype = mtype
        self.seqid = seqid


class FrameTooLargeError(FrameRefusedError):
    """A well-formed message so far, but with more container elements than the caller allows.

    Raised as soon as a list, set or map header takes the count past the limit, before its elements
    are read, so the rest is never decoded.
    """

    def __init__(self, name: str, mtype: int, seqid: int, limit: int) -> None:
        super().__init__(f"{name} carries more than {limit} list/map elements", name, mtype, seqid)
        self.limit = limit


class FieldRangeError(FrameRefusedError):
    """An integer field holds a value outside its IDL type (an ``i32`` of 2^40, say). The compact
    protocol writes every integer as a varint, so nothing but this check stops such a value."""


class Envelope(NamedTuple):
    """One decoded message. ``body`` is None when the caller had no struct for ``name`` (skipped)."""

    name: str
    type: int
    seqid: int
    body: TPayload | None


def decode(
    payload: bytes, body_for: Callable[[str, int], TPayload | None], max_elements: int | None = None
) -> Envelope:
    """Decode one frame payload (without its length header).

    ``body_for(name, message_type)`` returns an empty struct to fill, or None to skip the body (an
    unknown method, say). The payload must hold exactly one message: trailing bytes are an error.
    Raises :class:`FrameDecodeError` for anything malformed, :class:`FrameTooLargeError` when the
    elements of all its lists, sets and maps together are more than ``max_elements``, and
    :class:`FieldRangeError` when an integer does not fit its IDL type (both after the header decoded).
    """
    reader = CompactReader(payload, max_elements)
    name, mtype, seqid = "", 0, 0
    try:
        name, mtype, seqid = reader.read_message_begin()
        body = body_for(name, mtype)
        if body is None:
            reader.skip(CompactType.STRUCT)
        else:
            reader.read_struct(body)
        reader.expect_end()
    # One name per handler: compiled (mypyc), a name keeps the type of its first handler.
    except _TooManyElements as too_many:
        assert max_elements is not None
        raise FrameTooLargeError(name, mtype, seqid, max_elements) from too_many
    except _OutOfRange as out_of_range:
        raise FieldRangeError(str(out_of_range), name, mtype, seqid) from None
    except UnicodeDecodeError as not_utf8:
        raise FrameDecodeError(f"a string field is not valid UTF-8: {not_utf8}") from not_utf8
    except RecursionError as too_deep:  # a guard behind MAX_NESTING, in case the caller's stack is deep
        raise FrameDecodeError("payload nests too deeply") from too_deep
    return Envelope(name, mtype, seqid, body)
