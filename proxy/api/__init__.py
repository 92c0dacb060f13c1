"""The request surface: :class:`ConsumeService` (what both servers call), its one implementation
(:class:`~ddmq.proxy.api.consume.ConsumeApi`), the request rules they share, and the low-level
fetch/ack API.
"""

from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS, ConsumeService

__all__ = ["MAX_RESULT_OFFSETS", "ConsumeService"]
