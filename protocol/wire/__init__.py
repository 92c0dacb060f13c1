"""The Thrift contract on the wire, in one import: the IDL's structs and the framed compact codec.

Both the proxy's server and the clients use it, so they agree byte for byte::

    frame   = length (4 bytes, big-endian, signed) + payload
    payload = one Thrift message in the compact protocol (name, type, seqid, then one struct)

The parts live in :mod:`~ddmq.protocol.wire.structs` (the IDL and typed views of its structs),
:mod:`~ddmq.protocol.wire.writer`, :mod:`~ddmq.protocol.wire.reader` and :mod:`~ddmq.protocol.wire.layout`.

>>> frame = encode("submit", TMessageType.CALL, 7, ConsumerService.submit_args(result=None))
>>> frame_length(frame[:4]) == len(frame) - 4
True
>>> decode(frame[4:], lambda name, mtype: ConsumerService.submit_args()).seqid
7
"""

from __future__ import annotations

from typing import Final

from thriftpy2.thrift import TApplicationException, TMessageType

from ddmq.protocol.wire.frames import Envelope, FieldRangeError, FrameRefusedError, FrameTooLargeError, decode
from ddmq.protocol.wire.layout import varint
from ddmq.protocol.wire.reader import MAX_NESTING, FrameDecodeError
from ddmq.protocol.wire.structs import (
    IDL_PATH,
    AckResult,
    ConsumeResult,
    ConsumerService,
    ConsumeStats,
    ConsumeStatsRequest,
    Context,
    FailDetail,
    FetchRequest,
    FetchResponse,
    LeaseAck,
    Message,
    PullException,
    PullRequest,
    PullResponse,
    QidResponse,
    consumer_thrift,
    iter_results,
    link_results,
)
from ddmq.protocol.wire.writer import encode, frame_length

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
    "FailDetail",
    "FetchRequest",
    "FetchResponse",
    "FieldRangeError",
    "FrameDecodeError",
    "FrameRefusedError",
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
    "varint",
]

DEFAULT_PORT: Final = 9713
FRAME_HEADER_BYTES: Final = 4
# Requests are small (a pull, a list of offsets); this bounds what one peer can make us buffer.
DEFAULT_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
