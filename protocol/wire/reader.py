"""The compact-protocol reader: one framed payload from an untrusted peer in, a filled struct out.

Every declared string, container size and nesting level is checked against what the payload can
actually hold, so a 20-byte frame can neither make us allocate gigabytes nor loop for billions of
iterations. Whatever is wrong with a payload surfaces as one exception, :class:`FrameDecodeError`.

``Message`` lists, a pull reply's bulk, are read by a fast path that expects
:data:`~ddmq.protocol.wire.layout.MESSAGE_LAYOUT`, field by field; anything else goes the generic way.
"""

from __future__ import annotations

import struct
import sys
from typing import Any, Final

from thriftpy2.thrift import TPayload

from ddmq.protocol.wire.layout import (
    COMPACT_OF_TTYPE,
    MAX_SEQID,
    MESSAGE_LAYOUT_MATCHES,
    PROTOCOL_ID,
    VERSION,
    CompactType,
    MessageType,
    ThriftType,
    VarintTooLongError,
    read_varint,
    read_zigzag_varints,
    split_spec,
)
from ddmq.protocol.wire.message_reader import read_message, read_messages
from ddmq.protocol.wire.structs import Message

__all__ = ["MAX_NESTING", "CompactReader", "FrameDecodeError", "new_struct"]

# Structs and containers nested deeper than this are refused. The deepest legitimate shape is the
# ConsumeResult list (one level per (topic, qid)); the limit keeps the recursive reader and thriftpy2's
# recursive writer far from Python's recursion limit.
MAX_NESTING: Final = 200

_DOUBLE: Final = struct.Struct("<d")


class FrameDecodeError(ValueError):
    """A frame payload is not one well-formed compact Thrift message of the expected shape."""


class _TooManyElements(FrameDecodeError):
    pass


class _OutOfRange(FrameDecodeError):
    pass


#: The inclusive range of each integer type of the IDL.
_INT_RANGES: Final = {
    ThriftType.I16: (-(1 << 15), (1 << 15) - 1),
    ThriftType.I32: (-(1 << 31), (1 << 31) - 1),
    ThriftType.I64: (-(1 << 63), (1 << 63) - 1),
}


def _out_of_range(name: str, value: int, ttype: int) -> _OutOfRange:
    low, high = _INT_RANGES[ttype]
    kind = {ThriftType.I16: "i16", ThriftType.I32: "i32", ThriftType.I64: "i64"}[ttype]
    return _OutOfRange(f"{name} = {value} is outside the range of an {kind} ({low}..{high})")


# The same numbers as plain module constants, for the reader's per-field loop.
_C_STOP: Final = CompactType.STOP
_C_TRUE: Final = CompactType.TRUE
_C_FALSE: Final = CompactType.FALSE
_T_STRING: Final = ThriftType.STRING
_T_BINARY: Final = ThriftType.BINARY
_T_BOOL: Final = ThriftType.BOOL
_T_I16: Final = ThriftType.I16
_T_I32: Final = ThriftType.I32
_T_I64: Final = ThriftType.I64
_T_STRUCT: Final = ThriftType.STRUCT


def _same_type(ctype: int, ttype: int) -> bool:
    """Whether a value of compact type ``ctype`` on the wire can fill a field declared ``ttype``."""
    if ctype == CompactType.FALSE:
        ctype = CompactType.TRUE
    return COMPACT_OF_TTYPE.get(ttype) == ctype


_FieldEntry = tuple[int, int, str, Any]  # (compact type expected, thrift type, name, element spec)
_FIELDS: dict[type, dict[int, _FieldEntry]] = {}


def _fields_of(struct_class: type) -> dict[int, _FieldEntry]:
    """``thrift_spec`` of ``struct_class`` arranged for the reader (built once per class)."""
    fields = _FIELDS.get(struct_class)
    if fields is None:
        spec: dict[int, Any] = struct_class.thrift_spec  # type: ignore[attr-defined]
        fields = {}
        for fid, field in spec.items():
            ttype = field[0]
            # The name interned: setattr interns a name that is not, a lookup in the interned table.
            name = sys.intern(field[1])
            fields[fid] = (COMPACT_OF_TTYPE.get(ttype, -1), ttype, name, field[2] if len(field) == 4 else None)
        _FIELDS[struct_class] = fields
    return fields


_BLANKS: dict[type, dict[str, Any] | None] = {}  # None: a class new_struct calls


def new_struct(struct_class: Any) -> Any:
    """``struct_class()`` for a thriftpy2 struct: its fields' defaults copied into a new instance,
    without the class's generated ``__init__``, interpreted bytecode (four per request decoded). A
    class with another ``__init__``, or an exception class, is called."""
    if struct_class not in _BLANKS:
        init = getattr(struct_class.__init__, "__code__", None)
        generated = init is not None and init.co_filename.startswith("<generated ")
        plain = generated and not issubclass(struct_class, BaseException)
        _BLANKS[struct_class] = dict(vars(struct_class())) if plain else None
    blank = _BLANKS[struct_class]
    if blank is None:
        return struct_class()
    obj = struct_class.__new__(struct_class)
    obj.__dict__.update(blank)  # the defaults themselves, shared as __init__ shares its defaults
    return obj


class CompactReader:
    """Reads one compact-protocol message from bytes, trusting no declared size.

    ``data`` (the payload) and ``pos`` (where reading stands) are plain attributes, and :meth:`read_bytes`,
    :meth:`read_zigzag` and :meth:`read_map` read one value at ``pos`` with every check, for the ``Message``
    fast path (:mod:`~ddmq.protocol.wire.message_reader`), which reads the payload at ``pos`` and moves it on."""

    __slots__ = ("_depth", "_elements_left", "data", "pos")

    def __init__(self, data: bytes, max_elements: int | None = None) -> None:
        self.data = data
        self.pos = 0
        self._depth = 0
        # Checked at each container header: a huge list is refused before its elements are read.
        self._elements_left = len(data) if max_elements is None else max_elements

    # -- primitives ----------------------------------------------------------------------------

    def _remaining(self) -> int:
        return len(self.data) - self.pos

    def _byte(self) -> int:
        pos = self.pos
        if pos >= len(self.data):
            raise FrameDecodeError(f"payload truncated at byte {pos}")
        self.pos = pos + 1
        return self.data[pos]

    def _take(self, size: int) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise FrameDecodeError(f"payload truncated: {size} bytes declared at byte {self.pos}")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def _varint(self) -> int:
        try:
            value, self.pos = read_varint(self.data, self.pos)
        except IndexError:
            raise FrameDecodeError(f"payload truncated at byte {len(self.data)}") from None
        except VarintTooLongError as exc:
            raise FrameDecodeError(str(exc)) from None
        return value

    def read_zigzag(self) -> int:
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
        if protocol_id != PROTOCOL_ID:
            raise FrameDecodeError(f"not a compact protocol message (first byte 0x{protocol_id:02x})")
        version_type = self._byte()
        version = version_type & 0x1F
        if version != VERSION:
            raise FrameDecodeError(f"unsupported compact protocol version {version}")
        mtype = version_type >> 5
        if mtype not in (MessageType.CALL, MessageType.REPLY, MessageType.EXCEPTION, MessageType.ONEWAY):
            raise FrameDecodeError(f"unknown message type {mtype}")
        seqid = self._varint()
        if seqid > MAX_SEQID:
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
        if ctype == CompactType.STOP:
            return ctype, 0
        delta = header >> 4
        fid = last_fid + delta if delta else self.read_zigzag()
        return ctype, fid

    def read_struct(self, obj: TPayload) -> None:
        """Fill ``obj``'s fields from the payload; unknown or mistyped fields are skipped."""
        self._enter()
        fields = _fields_of(type(obj))
        data = self.data
        size = len(data)
        last_fid = 0
        # Plain locals and globals below, not ``ThriftType.X``/``CompactType.X``: this loop runs for every
        # field of every request, and a class attribute costs more to read than a local.
        while True:
            # The field header, inline.
            pos = self.pos
            if pos >= size:
                raise FrameDecodeError(f"payload truncated at byte {pos}")
            header = data[pos]
            self.pos = pos + 1
            ctype = header & 0x0F
            if ctype == _C_STOP:
                break
            delta = header >> 4
            fid = last_fid + delta if delta else self.read_zigzag()
            last_fid = fid
            field = fields.get(fid)
            if field is None or field[0] != (_C_TRUE if ctype == _C_FALSE else ctype):
                self.skip(ctype)
                continue
            ttype = field[1]
            value: Any
            if ttype == _T_STRING:
                value = self.read_bytes().decode("utf-8")
            elif ttype == _T_I64 or ttype == _T_I32 or ttype == _T_I16:
                value = self.read_zigzag()
                low, high = _INT_RANGES[ttype]
                if not low <= value <= high:
                    raise _out_of_range(field[2], value, ttype)
            elif ttype == _T_STRUCT:
                spec = field[3]
                if spec is Message and MESSAGE_LAYOUT_MATCHES:
                    value = read_message(self)
                else:
                    value = new_struct(spec)
                    self.read_struct(value)
            elif ttype == _T_BINARY:
                value = self.read_bytes()
            elif ttype == _T_BOOL:
                value = ctype == _C_TRUE  # a bool field lives in its header
            else:
                value = self._read_value(ttype, field[3])
            setattr(obj, field[2], value)
        self._leave()

    def read_bytes(self) -> bytes:
        """A length-prefixed string or binary (the common one-byte length inline)."""
        data = self.data
        pos = self.pos
        if pos < len(data) and data[pos] < 0x80:
            size = data[pos]
            pos += 1
        else:
            size = self._size(1)
            pos = self.pos
        end = pos + size
        if end > len(data):
            raise FrameDecodeError(f"payload truncated: {size} bytes declared at byte {pos}")
        self.pos = end
        return data[pos:end]

    def _read_value(self, ttype: int, spec: Any) -> Any:
        if ttype == ThriftType.STRING:
            return self.read_bytes().decode("utf-8")
        if ttype == ThriftType.BINARY:
            return self.read_bytes()
        if ttype in (ThriftType.I16, ThriftType.I32, ThriftType.I64):
            value = self.read_zigzag()
            low, high = _INT_RANGES[ttype]
            if not low <= value <= high:
                raise _out_of_range("an element", value, ttype)
            return value
        if ttype == ThriftType.BYTE:
            byte = self._byte()
            return byte - 256 if byte > 127 else byte
        if ttype == ThriftType.BOOL:
            return self._byte() == CompactType.TRUE
        if ttype == ThriftType.DOUBLE:
            return _DOUBLE.unpack(self._take(8))[0]
        if ttype == ThriftType.STRUCT:
            if spec is Message and MESSAGE_LAYOUT_MATCHES:
                return read_message(self)
            obj = new_struct(spec)
            self.read_struct(obj)
            return obj
        if ttype in (ThriftType.LIST, ThriftType.SET):
            return self._read_list(spec)
        if ttype == ThriftType.MAP:
            return self.read_map(spec)
        raise FrameDecodeError(f"cannot read thrift type {ttype}")

    def _read_list(self, spec: Any) -> list[Any]:
        elem_ttype, elem_spec = split_spec(spec)
        ctype, size = self._collection_header()
        if size and not _same_type(ctype, elem_ttype):
            raise FrameDecodeError(f"list elements have compact type {ctype}, expected thrift type {elem_ttype}")
        self._enter()
        items: list[Any]
        if elem_ttype in (ThriftType.I16, ThriftType.I32, ThriftType.I64):
            items = self._zigzag_list(size)  # offsets in acks: the one long list of a request
            low, high = _INT_RANGES[elem_ttype]
            if items and not (low <= min(items) and max(items) <= high):
                bad = next(item for item in items if not low <= item <= high)
                raise _out_of_range("a list element", bad, elem_ttype)
        elif elem_spec is Message and MESSAGE_LAYOUT_MATCHES:
            items = read_messages(self, size)  # a pull reply's messages: the client's busiest loop
        else:
            items = [self._read_value(elem_ttype, elem_spec) for _ in range(size)]
        self._leave()
        return items

    def _zigzag_list(self, size: int) -> list[int]:
        data = self.data
        try:
            items, pos = read_zigzag_varints(data, self.pos, size)
        except IndexError:
            raise FrameDecodeError(f"payload truncated at byte {len(data)}") from None
        except VarintTooLongError as exc:
            raise FrameDecodeError(str(exc)) from None
        self.pos = pos
        return items

    def read_map(self, spec: Any) -> dict[Any, Any]:
        key_ttype, key_spec = split_spec(spec[0])
        value_ttype, value_spec = split_spec(spec[1])
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
        if size and not CompactType.TRUE <= ctype <= CompactType.STRUCT:
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
            return 0, CompactType.STOP, CompactType.STOP
        self._count_elements(size)
        types = self._byte()
        key_ctype, value_ctype = types >> 4, types & 0x0F
        for ctype in (key_ctype, value_ctype):
            if not CompactType.TRUE <= ctype <= CompactType.STRUCT:
                raise FrameDecodeError(f"invalid map key/value type {ctype}")
        return size, key_ctype, value_ctype

    # -- skipping ------------------------------------------------------------------------------

    def skip(self, ctype: int) -> None:
        """Consume one value of compact type ``ctype`` (a field's bool lives in its header)."""
        if ctype in (CompactType.TRUE, CompactType.FALSE):
            return
        if ctype == CompactType.BYTE:
            self._byte()
        elif ctype in (CompactType.I16, CompactType.I32, CompactType.I64):
            self._varint()
        elif ctype == CompactType.DOUBLE:
            self._take(8)
        elif ctype == CompactType.BINARY:
            self._take(self._size(1))
        elif ctype == CompactType.STRUCT:
            self._enter()
            last_fid = 0
            while True:
                field_ctype, last_fid = self._field_header(last_fid)
                if field_ctype == CompactType.STOP:
                    break
                self.skip(field_ctype)
            self._leave()
        elif ctype in (CompactType.LIST, CompactType.SET):
            elem_ctype, size = self._collection_header()
            self._enter()
            for _ in range(size):
                self._skip_element(elem_ctype)
            self._leave()
        elif ctype == CompactType.MAP:
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
        if ctype in (CompactType.TRUE, CompactType.FALSE):
            self._byte()
        else:
            self.skip(ctype)
