"""The key-to-queue hash: :mod:`ddmq.protocol.hashing` (shared with the proxy), kept importable here."""

from ddmq.protocol.hashing import (
    queue_for_key,
)

__all__ = [
    "queue_for_key",
]
