"""The Thrift contract on the wire: the IDL's struct classes and a framed + compact codec.

Both the proxy's server and the clients use this module, so they agree byte for byte::

    frame   = length (4 bytes, big-endian, signed) + payload
    payload = one Thrift message in the compact protocol (name, type, seqid, then one struct)

Encoding uses a small writer of our own that gives thriftpy2's ``TCompactProtocol`` bytes exactly (the
tests compare them), without thriftpy2's five or six method calls per field. Decoding uses a small
reader of our own, because a payload comes from an untrusted peer: every declared string, container
size and nesting level is checked against what the payload can actually hold, so a 20-byte frame can
neither make us allocate gigabytes nor loop for billions of iterations. Whatever is wrong with a payload surfaces as one
exception, :class:`FrameDecodeError`.

>>> frame = encode("submit", TMessageType.CALL, 7, ConsumerService.submit_args(result=None))
>>> frame_length(frame[:4]) == len(frame) - 4
True
>>> decode(frame[4:], lambda name, mtype: ConsumerService.submit_args()).seqid
7
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import thriftpy2
from thriftpy2.protocol.exc import TProtocolException as _ThriftProtocolException
from thriftpy2.thrift import TApplicationException, TException, TMessageType, TPayload, TType

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_PORT",
    "FRAME_HEADER_BYTES",
    "IDL_PATH",
    "MAX_NESTING",
    "AckResult",
    "ConsumeResult",
    "ConsumeStats",
    "ConsumeStatsRequest",
    "ConsumerService",
    "Context",
    "Envelope",
    "FetchRequest",
    "FetchResponse",
    "FrameDecodeError",
    "FrameTooLargeError",
    "LeaseAck",
    "Message",
    "PullException",
    "PullRequest",
    "PullResponse",
    "QidResponse",
    "TApplicationException",
    "TMessageType",
    "consumer_thrift",
    "decode",
    "encode",
    "frame_length",
    "iter_results",
    "link_results",
]

IDL_PATH: Final = Path(__file__).resolve().parent / "idl" / "consumerProxy.thrift"
DEFAULT_PORT: Final = 9713
FRAME_HEADER_BYTES: Final = 4
# Requests are small (a pull, a list of offsets); this bounds what one peer can make us buffer.
DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
# Structs and containers nested deeper than this are refused. The deepest legitimate shape is the
# ConsumeResult list (one level per (topic, qid)); the limit keeps the recursive reader and thriftpy2's
# recursive writer far from Python's recursion limit.
MAX_NESTING: Final = 200

_FRAME_HEADER: Final = struct.Struct("!i")
_DOUBLE: Final = struct.Struct("<d")
_MAX_SEQID: Final = 0xFFFFFFFF  # compact writes the i32 seqid as an unsigned varint


consumer_thrift: ModuleType = thriftpy2.load(str(IDL_PATH), module_name="consumerProxy_thrift")
"""The IDL loaded as a module: structs, ``ConsumerService`` and its ``<method>_args/_result``."""

ConsumerService: Any = consumer_thrift.ConsumerService


if TYPE_CHECKING:
    # Typed views of the classes thriftpy2 generates from the IDL (fields are None when unset).

    class Message(TPayload):
        key: str | None
        value: bytes | None
        tag: str | None
        offset: int | None
        properties: dict[str, str] | None
        produceTime: int | None

        def __init__(
            self,
            key: str | None = None,
            value: bytes | None = None,
            tag: str | None = None,
            offset: int | None = None,
            properties: dict[str, str] | None = None,
            produceTime: int | None = None,
        ) -> None: ...

    class Context(TPayload):
        groupId: str | None
        topic: str | None
        qid: str | None

        def __init__(self, groupId: str | None = None, topic: str | None = None, qid: str | None = None) -> None: ...

    class ConsumeResult(TPayload):
        context: Context | None
        successOffsets: list[int] | None
        failOffsets: list[int] | None
        nextResult: ConsumeResult | None

        def __init__(
            self,
            context: Context | None = None,
            successOffsets: list[int] | None = None,
            failOffsets: list[int] | None = None,
            nextResult: ConsumeResult | None = None,
        ) -> None: ...

    class PullRequest(TPayload):
        groupId: str | None
        topic: str | None
        maxBatchSize: int | None
        maxLingerTime: int | None
        result: ConsumeResult | None
        version: str | None
        leaseId: str | None
        leaseIndex: int | None
        leaseTimeoutMs: int | None

        def __init__(
            self,
            groupId: str | None = None,
            topic: str | None = None,
            maxBatchSize: int | None = None,
            maxLingerTime: int | None = None,
            result: ConsumeResult | None = None,
            version: str | None = None,
            leaseId: str | None = None,
            leaseIndex: int | None = None,
            leaseTimeoutMs: int | None = None,
        ) -> None: ...

    class PullResponse(TPayload):
        context: Context | None
        messages: list[Message] | None

        def __init__(self, context: Context | None = None, messages: list[Message] | None = None) -> None: ...

    class ConsumeStatsRequest(TPayload):
        group: str | None
        topic: str | None
        version: str | None

        def __init__(self, group: str | None = None, topic: str | None = None, version: str | None = None) -> None: ...

    class ConsumeStats(TPayload):
        group: str | None
        topic: str | None
        consumeOffsets: dict[str, int] | None
        produceOffsets: dict[str, int] | None
        owners: dict[str, str] | None
        leaseTtlMs: dict[str, int] | None
        leaseTerms: dict[str, int] | None

        def __init__(
            self,
            group: str | None = None,
            topic: str | None = None,
            consumeOffsets: dict[str, int] | None = None,
            produceOffsets: dict[str, int] | None = None,
            owners: dict[str, str] | None = None,
            leaseTtlMs: dict[str, int] | None = None,
            leaseTerms: dict[str, int] | None = None,
        ) -> None: ...

    class FetchRequest(TPayload):
        consumerId: str | None
        groupId: str | None
        cluster: str | None
        fetchOffset: dict[str, dict[str, int]] | None
        maxBatchSize: int | None
        maxLingerTime: int | None
        version: str | None

        def __init__(
            self,
            consumerId: str | None = None,
            groupId: str | None = None,
            cluster: str | None = None,
            fetchOffset: dict[str, dict[str, int]] | None = None,
            maxBatchSize: int | None = None,
            maxLingerTime: int | None = None,
            version: str | None = None,
        ) -> None: ...

    class QidResponse(TPayload):
        topic: str | None
        qid: str | None
        nextRequestOffset: int | None
        messages: list[Message] | None

        def __init__(
            self,
            topic: str | None = None,
            qid: str | None = None,
            nextRequestOffset: int | None = None,
            messages: list[Message] | None = None,
        ) -> None: ...

    class FetchResponse(TPayload):
        code: int | None
        results: list[QidResponse] | None

        def __init__(self, code: int | None = None, results: list[QidResponse] | None = None) -> None: ...

    class AckResult(TPayload):
        consumerId: str | None
        groupId: str | None
        cluster: str | None
        offsets: dict[str, dict[str, int]] | None

        def __init__(
            self,
            consumerId: str | None = None,
            groupId: str | None = None,
            cluster: str | None = None,
            offsets: dict[str, dict[str, int]] | None = None,
        ) -> None: ...

    class LeaseAck(TPayload):
        groupId: str | None
        leaseIds: list[str] | None

        def __init__(self, groupId: str | None = None, leaseIds: list[str] | None = None) -> None: ...

    class PullException(TException):
        code: int | None
        message: str | None

        def __init__(self, code: int | None = None, message: str | None = None) -> None: ...

else:
    Message = consumer_thrift.Message
    Context = consumer_thrift.Context
    ConsumeResult = consumer_thrift.ConsumeResult
    PullRequest = consumer_thrift.PullRequest
    PullResponse = consumer_thrift.PullResponse
    ConsumeStatsRequest = consumer_thrift.ConsumeStatsRequest
    ConsumeStats = consumer_thrift.ConsumeStats
    FetchRequest = consumer_thrift.FetchRequest
    QidResponse = consumer_thrift.QidResponse
    FetchResponse = consumer_thrift.FetchResponse
    AckResult = consumer_thrift.AckResult
    LeaseAck = consumer_thrift.LeaseAck
    PullException = consumer_thrift.PullException


class FrameDecodeError(ValueError):
    """A frame payload is not one well-formed compact Thrift message of the expected shape."""


class FrameTooLargeError(FrameDecodeError):
    """A well-formed message so far, but with more container elements than the caller allows.

    Raised as soon as a list, set or map header takes the count past the limit, before its elements
    are read: a server can answer the call (it knows name and seqid) without decoding the rest.
    """

    def __init__(self, name: str, mtype: int, seqid: int, limit: int) -> None:
        super().__init__(f"{name} carries more than {limit} list/map elements")
        self.name = name
        self.mtype = mtype
        self.seqid = seqid
        self.limit = limit


class _TooManyElements(FrameDecodeError):
    pass


class Envelope(NamedTuple):
    """One decoded message. ``body`` is None when the caller had no struct for ``name`` (skipped)."""

    name: str
    type: int
    seqid: int
    body: TPayload | None


def _varint_loop(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Varints by 14-bit chunks from two tables (about 1.4 MB): offsets and millisecond timestamps are 3 to 6
# bytes long, and a byte-at-a-time loop over them was a sixth of the pull reply encoder's time.
_LAST14: Final = [_varint_loop(n) for n in range(1 << 14)]  # a final chunk: 1 or 2 bytes
_MORE14: Final = [bytes(((n & 0x7F) | 0x80, (n >> 7) | 0x80)) for n in range(1 << 14)]  # 2 bytes, more follow


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


# thriftpy2's protocol error carries no annotations; raised as the error thriftpy2's writer raises.
TProtocolException: Any = _ThriftProtocolException
_INT_LIMITS: Final = {TType.I16: 1 << 15, TType.I32: 1 << 31, TType.I64: 1 << 63}
_BYTE: Final = struct.Struct("!b")
_WriterField = tuple[int, int, str, Any, int]  # (field id, thrift type, name, element spec, compact type)
_WRITER_FIELDS: dict[type, list[_WriterField]] = {}


def _writer_fields(struct_class: type) -> list[_WriterField]:
    """``thrift_spec`` of ``struct_class`` in its own order (thriftpy2 writes fields in that order)."""
    fields = _WRITER_FIELDS.get(struct_class)
    if fields is None:
        spec: dict[int, Any] = struct_class.thrift_spec  # type: ignore[attr-defined]
        fields = _WRITER_FIELDS[struct_class] = [
            (fid, field[0], field[1], field[2] if len(field) == 4 else None, _COMPACT_OF_TTYPE[field[0]])
            for fid, field in spec.items()
            if fid is not None
        ]
    return fields


def _zigzag(value: int, ttype: int) -> bytes:
    limit = _INT_LIMITS[ttype]
    if not -limit <= value < limit:
        raise TProtocolException(TProtocolException.INVALID_DATA, f"{value} does not fit thrift type {ttype}")
    return varint((value << 1) ^ (value >> 63))


class _CompactWriter:
    """Writes thrift structs in the compact protocol: thriftpy2's bytes, without its per-field calls.

    thriftpy2's pure-Python writer goes through five or six method calls per field; this one appends to
    one bytearray. Fields are written in ``thrift_spec`` order and None fields are left out, as thriftpy2
    does; the tests compare the two on random values of every struct of the IDL.
    """

    __slots__ = ("out",)

    def __init__(self) -> None:
        self.out = bytearray()

    def message_begin(self, name: str, mtype: int, seqid: int) -> None:
        raw = name.encode("utf-8")
        self.out += bytes((_PROTOCOL_ID, _VERSION | (mtype << 5)))
        self.out += varint(seqid)
        self.out += varint(len(raw))
        self.out += raw

    def struct(self, obj: Any) -> None:
        out = self.out
        last_fid = 0
        for fid, ttype, name, spec, ctype in _writer_fields(type(obj)):
            value = getattr(obj, name, None)
            if value is None:
                continue
            if ttype == TType.BOOL:
                ctype = _CompactType.TRUE if value else _CompactType.FALSE
            delta = fid - last_fid
            if 0 < delta <= 15:
                out.append(delta << 4 | ctype)
            else:
                out += _BYTE.pack(ctype)
                out += _zigzag(fid, TType.I16)
            last_fid = fid
            if ttype != TType.BOOL:
                self.value(ttype, value, spec)
        out.append(_CompactType.STOP)

    def value(self, ttype: int, value: Any, spec: Any) -> None:
        out = self.out
        if ttype == TType.STRING:
            raw = value if isinstance(value, bytes) else value.encode("utf-8")
            out += varint(len(raw))
            out += raw
        elif ttype == TType.BINARY:
            out += varint(len(value))  # thriftpy2 counts before encoding a str; so do we, for the same bytes
            out += value.encode() if isinstance(value, str) else value
        elif ttype in _INT_LIMITS:
            out += _zigzag(value, ttype)
        elif ttype == TType.STRUCT:
            self.struct(value)
        elif ttype in (TType.LIST, TType.SET):
            elem_ttype, elem_spec = _split_spec(spec)
            size = len(value)
            elem_ctype = _COMPACT_OF_TTYPE[elem_ttype]
            if size <= 14:
                out.append(size << 4 | elem_ctype)
            else:
                out.append(0xF0 | elem_ctype)
                out += varint(size)
            if elem_ttype in _INT_LIMITS:
                out += b"".join([_zigzag(item, elem_ttype) for item in value])  # offsets in acks
            else:
                for item in value:
                    self.value(elem_ttype, item, elem_spec)
        elif ttype == TType.MAP:
            key_ttype, key_spec = _split_spec(spec[0])
            value_ttype, value_spec = _split_spec(spec[1])
            if not value:
                out.append(0)
                return
            out += varint(len(value))
            out.append(_COMPACT_OF_TTYPE[key_ttype] << 4 | _COMPACT_OF_TTYPE[value_ttype])
            for key in value:
                self.value(key_ttype, key, key_spec)
                self.value(value_ttype, value[key], value_spec)
        elif ttype == TType.BOOL:  # inside a container: a byte of its own
            out.append(_CompactType.TRUE if value else _CompactType.FALSE)
        elif ttype == TType.BYTE:
            out += _BYTE.pack(value)
        elif ttype == TType.DOUBLE:
            out += _DOUBLE.pack(value)
        else:
            raise TProtocolException(TProtocolException.INVALID_DATA, f"cannot write thrift type {ttype}")


def frame_length(header: bytes) -> int:
    """The payload length a 4-byte frame header declares (may be negative or absurd: check it)."""
    length: int = _FRAME_HEADER.unpack(header)[0]
    return length


def encode(name: str, mtype: int, seqid: int, body: TPayload) -> bytes:
    """One complete frame (header + payload) carrying ``body`` as message ``name``."""
    if not 0 <= seqid <= _MAX_SEQID:
        raise ValueError(f"seqid {seqid} is outside the unsigned 32-bit range")
    writer = _CompactWriter()
    writer.message_begin(name, mtype, seqid)
    writer.struct(body)
    payload = writer.out
    return _FRAME_HEADER.pack(len(payload)) + payload


def decode(
    payload: bytes, body_for: Callable[[str, int], TPayload | None], max_elements: int | None = None
) -> Envelope:
    """Decode one frame payload (without its length header).

    ``body_for(name, message_type)`` returns an empty struct to fill, or None to skip the body (an
    unknown method, say). The payload must hold exactly one message: trailing bytes are an error.
    Raises :class:`FrameDecodeError` for anything malformed, and :class:`FrameTooLargeError` when the
    elements of all its lists, sets and maps together are more than ``max_elements``.
    """
    reader = _CompactReader(payload, max_elements)
    name, mtype, seqid = "", 0, 0
    try:
        name, mtype, seqid = reader.read_message_begin()
        body = body_for(name, mtype)
        if body is None:
            reader.skip(_CompactType.STRUCT)
        else:
            reader.read_struct(body)
        reader.expect_end()
    except _TooManyElements as exc:
        assert max_elements is not None
        raise FrameTooLargeError(name, mtype, seqid, max_elements) from exc
    except UnicodeDecodeError as exc:
        raise FrameDecodeError(f"a string field is not valid UTF-8: {exc}") from exc
    except RecursionError as exc:  # a guard behind MAX_NESTING, in case the caller's stack is deep
        raise FrameDecodeError("payload nests too deeply") from exc
    return Envelope(name, mtype, seqid, body)


def iter_results(head: ConsumeResult | None) -> Iterator[ConsumeResult]:
    """Walk a ``ConsumeResult`` list through ``nextResult`` (without recursion)."""
    node = head
    while node is not None:
        yield node
        node = node.nextResult


def link_results(nodes: Iterable[ConsumeResult]) -> ConsumeResult | None:
    """Chain ``nodes`` through ``nextResult`` in the given order; None for no nodes."""
    head: ConsumeResult | None = None
    for node in reversed(list(nodes)):
        node.nextResult = head
        head = node
    return head


class _CompactType:
    """Type ids of the compact protocol (they differ from the TType numbers in ``thrift_spec``)."""

    STOP = 0
    TRUE = 1
    FALSE = 2
    BYTE = 3
    I16 = 4
    I32 = 5
    I64 = 6
    DOUBLE = 7
    BINARY = 8
    LIST = 9
    SET = 10
    MAP = 11
    STRUCT = 12


_COMPACT_OF_TTYPE: Final[dict[int, int]] = {
    TType.BOOL: _CompactType.TRUE,
    TType.BYTE: _CompactType.BYTE,
    TType.I16: _CompactType.I16,
    TType.I32: _CompactType.I32,
    TType.I64: _CompactType.I64,
    TType.DOUBLE: _CompactType.DOUBLE,
    TType.STRING: _CompactType.BINARY,
    TType.BINARY: _CompactType.BINARY,
    TType.LIST: _CompactType.LIST,
    TType.SET: _CompactType.SET,
    TType.MAP: _CompactType.MAP,
    TType.STRUCT: _CompactType.STRUCT,
}
# The same numbers as plain module constants, for the reader's per-field loop.
_C_STOP: Final = _CompactType.STOP
_C_TRUE: Final = _CompactType.TRUE
_C_FALSE: Final = _CompactType.FALSE
_T_STRING: Final = TType.STRING
_T_BINARY: Final = TType.BINARY
_T_BOOL: Final = TType.BOOL
_T_I16: Final = TType.I16
_T_I32: Final = TType.I32
_T_I64: Final = TType.I64
_T_STRUCT: Final = TType.STRUCT
_PROTOCOL_ID: Final = 0x82
_VERSION: Final = 1
_VARINT_MAX_BYTES: Final = 10  # enough for 64 bits


def _same_type(ctype: int, ttype: int) -> bool:
    """Whether a value of compact type ``ctype`` on the wire can fill a field declared ``ttype``."""
    if ctype == _CompactType.FALSE:
        ctype = _CompactType.TRUE
    return _COMPACT_OF_TTYPE.get(ttype) == ctype


_FieldEntry = tuple[int, int, str, Any]  # (compact type expected, thrift type, name, element spec)
_FIELDS: dict[type, dict[int, _FieldEntry]] = {}


def _fields_of(struct_class: type) -> dict[int, _FieldEntry]:
    """``thrift_spec`` of ``struct_class`` arranged for the reader (built once per class)."""
    fields = _FIELDS.get(struct_class)
    if fields is None:
        spec: dict[int, Any] = struct_class.thrift_spec  # type: ignore[attr-defined]
        fields = _FIELDS[struct_class] = {
            fid: (_COMPACT_OF_TTYPE.get(field[0], -1), field[0], field[1], field[2] if len(field) == 4 else None)
            for fid, field in spec.items()
        }
    return fields


def _split_spec(spec: Any) -> tuple[int, Any]:
    """``thrift_spec`` writes an element type either as a bare TType or as ``(TType, sub_spec)``."""
    if isinstance(spec, tuple):
        return spec[0], spec[1]
    return spec, None


class _OtherLayout(Exception):
    """A struct is not in the layout a fast path expects (read it the generic way)."""


_STRING_MAP_SPEC: Final = (TType.STRING, TType.STRING)
#: Whether the loaded IDL's ``Message`` is the one :meth:`_CompactReader._read_message` reads.
_MESSAGE_FAST_PATH: Final = {fid: tuple(field[:2]) for fid, field in Message.thrift_spec.items()} == {
    1: (TType.STRING, "key"),
    2: (TType.BINARY, "value"),
    3: (TType.STRING, "tag"),
    4: (TType.I64, "offset"),
    5: (TType.MAP, "properties"),
    20: (TType.I64, "produceTime"),
} and Message.thrift_spec[5][2] == _STRING_MAP_SPEC


class _CompactReader:
    """Reads one compact-protocol message from bytes, trusting no declared size."""

    __slots__ = ("_data", "_depth", "_elements_left", "_pos")

    def __init__(self, data: bytes, max_elements: int | None = None) -> None:
        self._data = data
        self._pos = 0
        self._depth = 0
        # Checked at each container header: a huge list is refused before its elements are read.
        self._elements_left = len(data) if max_elements is None else max_elements

    # -- primitives ----------------------------------------------------------------------------

    def _remaining(self) -> int:
        return len(self._data) - self._pos

    def _byte(self) -> int:
        pos = self._pos
        if pos >= len(self._data):
            raise FrameDecodeError(f"payload truncated at byte {pos}")
        self._pos = pos + 1
        return self._data[pos]

    def _take(self, size: int) -> bytes:
        end = self._pos + size
        if end > len(self._data):
            raise FrameDecodeError(f"payload truncated: {size} bytes declared at byte {self._pos}")
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def _varint(self) -> int:
        data = self._data
        pos = self._pos
        end = min(len(data), pos + _VARINT_MAX_BYTES)
        result = 0
        shift = 0
        while pos < end:
            byte = data[pos]
            pos += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self._pos = pos
                return result
            shift += 7
        if pos >= len(data):
            raise FrameDecodeError(f"payload truncated at byte {pos}")
        raise FrameDecodeError(f"varint longer than {_VARINT_MAX_BYTES} bytes")

    def _zigzag(self) -> int:
        value = self._varint()
        return (value >> 1) ^ -(value & 1)

    def _size(self, min_bytes_each: int) -> int:
        """A declared size, refused when the rest of the payload cannot hold that many items."""
        size = self._varint()
        if size * min_bytes_each > self._remaining():
            raise FrameDecodeError(f"declared size {size} exceeds the {self._remaining()} bytes left in the payload")
        return size

    def _enter(self) -> None:
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise FrameDecodeError(f"structs/containers nested deeper than {MAX_NESTING}")

    def _leave(self) -> None:
        self._depth -= 1

    # -- message -------------------------------------------------------------------------------

    def read_message_begin(self) -> tuple[str, int, int]:
        protocol_id = self._byte()
        if protocol_id != _PROTOCOL_ID:
            raise FrameDecodeError(f"not a compact protocol message (first byte 0x{protocol_id:02x})")
        version_type = self._byte()
        version = version_type & 0x1F
        if version != _VERSION:
            raise FrameDecodeError(f"unsupported compact protocol version {version}")
        mtype = version_type >> 5
        if mtype not in (TMessageType.CALL, TMessageType.REPLY, TMessageType.EXCEPTION, TMessageType.ONEWAY):
            raise FrameDecodeError(f"unknown message type {mtype}")
        seqid = self._varint()
        if seqid > _MAX_SEQID:
            raise FrameDecodeError(f"seqid {seqid} does not fit 32 bits")
        name = self._take(self._size(1)).decode("utf-8")
        return name, mtype, seqid

    def expect_end(self) -> None:
        if self._remaining():
            raise FrameDecodeError(f"{self._remaining()} trailing bytes after the message")

    # -- structs -------------------------------------------------------------------------------

    def _field_header(self, last_fid: int) -> tuple[int, int]:
        """(compact type, field id); compact type STOP ends the struct."""
        header = self._byte()
        ctype = header & 0x0F
        if ctype == _CompactType.STOP:
            return ctype, 0
        delta = header >> 4
        fid = last_fid + delta if delta else self._zigzag()
        return ctype, fid

    def read_struct(self, obj: TPayload) -> None:
        """Fill ``obj``'s fields from the payload; unknown or mistyped fields are skipped."""
        self._enter()
        fields = _fields_of(type(obj))
        data = self._data
        size = len(data)
        last_fid = 0
        # Plain locals and globals below, not ``TType.X``/``_CompactType.X``: this loop runs for every
        # field of every request, and a class attribute costs more to read than a local.
        while True:
            # The field header, inline.
            pos = self._pos
            if pos >= size:
                raise FrameDecodeError(f"payload truncated at byte {pos}")
            header = data[pos]
            self._pos = pos + 1
            ctype = header & 0x0F
            if ctype == _C_STOP:
                break
            delta = header >> 4
            fid = last_fid + delta if delta else self._zigzag()
            last_fid = fid
            field = fields.get(fid)
            if field is None or field[0] != (_C_TRUE if ctype == _C_FALSE else ctype):
                self.skip(ctype)
                continue
            ttype = field[1]
            value: Any
            if ttype == _T_STRING:
                value = self._bytes().decode("utf-8")
            elif ttype == _T_I64 or ttype == _T_I32 or ttype == _T_I16:
                value = self._zigzag()
            elif ttype == _T_STRUCT:
                spec = field[3]
                if spec is Message and _MESSAGE_FAST_PATH:
                    value = self._read_message()
                else:
                    value = spec()
                    self.read_struct(value)
            elif ttype == _T_BINARY:
                value = self._bytes()
            elif ttype == _T_BOOL:
                value = ctype == _C_TRUE  # a bool field lives in its header
            else:
                value = self._read_value(ttype, field[3])
            setattr(obj, field[2], value)
        self._leave()

    def _bytes(self) -> bytes:
        """A length-prefixed string or binary (the common one-byte length inline)."""
        data = self._data
        pos = self._pos
        if pos < len(data) and data[pos] < 0x80:
            size = data[pos]
            pos += 1
        else:
            size = self._size(1)
            pos = self._pos
        end = pos + size
        if end > len(data):
            raise FrameDecodeError(f"payload truncated: {size} bytes declared at byte {pos}")
        self._pos = end
        return data[pos:end]

    def _read_value(self, ttype: int, spec: Any) -> Any:
        if ttype == TType.STRING:
            return self._bytes().decode("utf-8")
        if ttype == TType.BINARY:
            return self._bytes()
        if ttype in (TType.I16, TType.I32, TType.I64):
            return self._zigzag()
        if ttype == TType.BYTE:
            byte = self._byte()
            return byte - 256 if byte > 127 else byte
        if ttype == TType.BOOL:
            return self._byte() == _CompactType.TRUE
        if ttype == TType.DOUBLE:
            return _DOUBLE.unpack(self._take(8))[0]
        if ttype == TType.STRUCT:
            if spec is Message and _MESSAGE_FAST_PATH:
                return self._read_message()
            obj = spec()
            self.read_struct(obj)
            return obj
        if ttype in (TType.LIST, TType.SET):
            return self._read_list(spec)
        if ttype == TType.MAP:
            return self._read_map(spec)
        raise FrameDecodeError(f"cannot read thrift type {ttype}")

    def _read_message(self) -> Message:
        """A ``Message`` laid out as the proxy writes it (fields 1-5 and 20, in order), read without the
        generic field loop; any other layout (a missing or extra field) goes through :meth:`read_struct`."""
        data = self._data
        start = self._pos
        try:
            if data[start] != 0x18:  # key: delta 1, BINARY
                raise _OtherLayout
            self._pos = start + 1
            key = self._bytes().decode("utf-8")
            if data[self._pos] != 0x18:  # value
                raise _OtherLayout
            self._pos += 1
            value = self._bytes()
            if data[self._pos] != 0x18:  # tag
                raise _OtherLayout
            self._pos += 1
            tag = self._bytes().decode("utf-8")
            if data[self._pos] != 0x16:  # offset: delta 1, I64
                raise _OtherLayout
            self._pos += 1
            offset = self._zigzag()
            if data[self._pos] != 0x1B:  # properties: delta 1, MAP
                raise _OtherLayout
            self._pos += 1
            if data[self._pos] == 0:
                self._pos += 1
                properties: dict[str, str] = {}
            else:
                properties = self._read_map(_STRING_MAP_SPEC)
            if data[self._pos] != 0xF6:  # produceTime: field 20, delta 15, I64
                raise _OtherLayout
            self._pos += 1
            produce_time = self._zigzag()
            if data[self._pos] != _CompactType.STOP:
                raise _OtherLayout
            self._pos += 1
        except (_OtherLayout, IndexError):
            self._pos = start
            message = Message()
            self.read_struct(message)
            return message
        return Message(key=key, value=value, tag=tag, offset=offset, properties=properties, produceTime=produce_time)

    def _read_messages(self, count: int) -> list[Message]:
        """``count`` Messages laid out as the proxy writes them, in one loop with no call per field.

        Every read index is checked by Python (``IndexError``) and every slice ends before the next
        index read, so a message that runs past the payload or is laid out any other way (a key or tag
        of 128 bytes or more, properties, a missing field) is read again by :meth:`_read_message`,
        which also reports what is wrong with it.
        """
        data = self._data
        pos = self._pos
        new = object.__new__
        messages: list[Message] = []
        append = messages.append
        for _ in range(count):
            start = pos
            try:
                # key: field header 0x18 (delta 1, BINARY), a length under 128
                if data[pos] != 0x18 or data[pos + 1] & 0x80:
                    raise _OtherLayout
                end = pos + 2 + data[pos + 1]
                key = data[pos + 2 : end]
                # value: any length (bodies are often 128 bytes or more)
                if data[end] != 0x18:
                    raise _OtherLayout
                pos = end + 1
                size = shift = 0
                while True:
                    byte = data[pos]
                    pos += 1
                    size |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift > 28:
                        raise _OtherLayout
                end = pos + size
                value = data[pos:end]
                # tag, as the key
                if data[end] != 0x18 or data[end + 1] & 0x80:
                    raise _OtherLayout
                pos = end + 2 + data[end + 1]
                tag = data[end + 2 : pos]
                # offset: 0x16 (delta 1, I64), a zigzag varint
                if data[pos] != 0x16:
                    raise _OtherLayout
                pos += 1
                number = shift = 0
                while True:
                    byte = data[pos]
                    pos += 1
                    number |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift > 63:
                        raise _OtherLayout
                offset = (number >> 1) ^ -(number & 1)
                # properties: 0x1B (delta 1, MAP) and an empty map; then produceTime: 0xF6 (field 20)
                if data[pos] != 0x1B or data[pos + 1] != 0 or data[pos + 2] != 0xF6:
                    raise _OtherLayout
                pos += 3
                number = shift = 0  # the offset's loop again, inline: no call per field here
                while True:
                    byte = data[pos]
                    pos += 1
                    number |= (byte & 0x7F) << shift
                    if not byte & 0x80:
                        break
                    shift += 7
                    if shift > 63:
                        raise _OtherLayout
                if data[pos] != _CompactType.STOP:  # also proves no slice above ran past the payload
                    raise _OtherLayout
                pos += 1
            except (_OtherLayout, IndexError):
                self._pos = start
                append(self._read_message())
                pos = self._pos
                continue
            message = new(Message)
            message.key = key.decode("utf-8")
            message.value = value
            message.tag = tag.decode("utf-8")
            message.offset = offset
            message.properties = {}
            message.produceTime = (number >> 1) ^ -(number & 1)
            append(message)
        self._pos = pos
        return messages

    def _read_list(self, spec: Any) -> list[Any]:
        elem_ttype, elem_spec = _split_spec(spec)
        ctype, size = self._collection_header()
        if size and not _same_type(ctype, elem_ttype):
            raise FrameDecodeError(f"list elements have compact type {ctype}, expected thrift type {elem_ttype}")
        self._enter()
        items: list[Any]
        if elem_ttype in (TType.I16, TType.I32, TType.I64):
            items = self._zigzag_list(size)  # offsets in acks: the one long list of a request
        elif elem_spec is Message and _MESSAGE_FAST_PATH:
            items = self._read_messages(size)  # a pull reply's messages: the client's busiest loop
        else:
            items = [self._read_value(elem_ttype, elem_spec) for _ in range(size)]
        self._leave()
        return items

    def _zigzag_list(self, size: int) -> list[int]:
        data = self._data
        end = len(data)
        pos = self._pos
        items = []
        for _ in range(size):
            result = 0
            shift = 0
            while True:
                if pos >= end:
                    raise FrameDecodeError(f"payload truncated at byte {pos}")
                byte = data[pos]
                pos += 1
                result |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
                if shift >= 7 * _VARINT_MAX_BYTES:
                    raise FrameDecodeError(f"varint longer than {_VARINT_MAX_BYTES} bytes")
            items.append((result >> 1) ^ -(result & 1))
        self._pos = pos
        return items

    def _read_map(self, spec: Any) -> dict[Any, Any]:
        key_ttype, key_spec = _split_spec(spec[0])
        value_ttype, value_spec = _split_spec(spec[1])
        size, key_ctype, value_ctype = self._map_header()
        if size and not (_same_type(key_ctype, key_ttype) and _same_type(value_ctype, value_ttype)):
            raise FrameDecodeError(
                f"map entries have compact types ({key_ctype}, {value_ctype}), "
                f"expected thrift types ({key_ttype}, {value_ttype})"
            )
        self._enter()
        result = {}
        for _ in range(size):
            key = self._read_value(key_ttype, key_spec)
            result[key] = self._read_value(value_ttype, value_spec)
        self._leave()
        return result

    def _collection_header(self) -> tuple[int, int]:
        header = self._byte()
        ctype = header & 0x0F
        size = header >> 4
        if size == 15:
            size = self._size(1)
        elif size > self._remaining():
            raise FrameDecodeError(f"declared size {size} exceeds the payload")
        if size and not _CompactType.TRUE <= ctype <= _CompactType.STRUCT:
            # A STOP element type would take zero bytes each: a billion of them must not loop.
            raise FrameDecodeError(f"invalid list element type {ctype}")
        self._count_elements(size)
        return ctype, size

    def _count_elements(self, size: int) -> None:
        self._elements_left -= size
        if self._elements_left < 0:
            raise _TooManyElements()

    def _map_header(self) -> tuple[int, int, int]:
        size = self._size(2)
        if not size:
            return 0, _CompactType.STOP, _CompactType.STOP
        self._count_elements(size)
        types = self._byte()
        key_ctype, value_ctype = types >> 4, types & 0x0F
        for ctype in (key_ctype, value_ctype):
            if not _CompactType.TRUE <= ctype <= _CompactType.STRUCT:
                raise FrameDecodeError(f"invalid map key/value type {ctype}")
        return size, key_ctype, value_ctype

    # -- skipping ------------------------------------------------------------------------------

    def skip(self, ctype: int) -> None:
        """Consume one value of compact type ``ctype`` (a field's bool lives in its header)."""
        if ctype in (_CompactType.TRUE, _CompactType.FALSE):
            return
        if ctype == _CompactType.BYTE:
            self._byte()
        elif ctype in (_CompactType.I16, _CompactType.I32, _CompactType.I64):
            self._varint()
        elif ctype == _CompactType.DOUBLE:
            self._take(8)
        elif ctype == _CompactType.BINARY:
            self._take(self._size(1))
        elif ctype == _CompactType.STRUCT:
            self._enter()
            last_fid = 0
            while True:
                field_ctype, last_fid = self._field_header(last_fid)
                if field_ctype == _CompactType.STOP:
                    break
                self.skip(field_ctype)
            self._leave()
        elif ctype in (_CompactType.LIST, _CompactType.SET):
            elem_ctype, size = self._collection_header()
            self._enter()
            for _ in range(size):
                self._skip_element(elem_ctype)
            self._leave()
        elif ctype == _CompactType.MAP:
            size, key_ctype, value_ctype = self._map_header()
            self._enter()
            for _ in range(size):
                self._skip_element(key_ctype)
                self._skip_element(value_ctype)
            self._leave()
        else:
            raise FrameDecodeError(f"invalid compact type {ctype}")

    def _skip_element(self, ctype: int) -> None:
        # Inside containers a bool takes one byte of its own.
        if ctype in (_CompactType.TRUE, _CompactType.FALSE):
            self._byte()
        else:
            self.skip(ctype)
