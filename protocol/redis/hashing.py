"""The queue a message key lands in: the same function in every language.

``qid = crc32(utf8(key)) mod queues`` where crc32 is the common CRC-32 (IEEE 802.3, the one in zlib,
Java's ``java.util.zip.CRC32``, Go's ``hash/crc32.ChecksumIEEE``), taken as an unsigned 32-bit value.
Python's built-in ``hash()`` is salted per process and must never be used for this.

>>> queue_for_key("rider-42", 8)  # crc32 = 3583044112
0
>>> queue_for_key("order-1", 8)  # crc32 = 3769860079
7
"""

from __future__ import annotations

import zlib

__all__ = [
    "queue_for_key",
]


def queue_for_key(key: str, queues: int) -> int:
    if queues < 1:
        raise ValueError("a topic has at least one queue")
    return zlib.crc32(key.encode("utf-8")) % queues
