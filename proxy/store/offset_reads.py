"""Reading a queue's messages again by offset: the held messages of a key that drained
(:mod:`ddmq.proxy.engine.held_keys`).

Offsets map to entry ids ``0-<offset>`` exactly, so each run of consecutive offsets (a few gaps
allowed: :data:`GAP`) is one ``XRANGE``; the runs of one call go in one pipeline (one slot: one
stream), so held messages come back in one round trip whatever their spread in the queue.
"""

from __future__ import annotations

from typing import Any

from ddmq.protocol.redis import keys
from ddmq.proxy.core.types import StoredMessage
from ddmq.proxy.store.broker import Broker, decode_entry, map_redis_errors

__all__ = ["read_offsets"]


#: Entries read past and dropped rather than start another ``XRANGE``: held keys read again together
#: (a tenant's share split between its keys) ask for offsets a few apart, and a command per offset costs
#: the proxy more to send and parse than a few entries more in one reply.
GAP = 8


def runs(offsets: list[int], gap: int = 0) -> list[tuple[int, int]]:
    """Sorted ``offsets`` as runs of consecutive ones (up to ``gap`` offsets not asked for between two
    of a run), ``(first, last)`` each."""
    found: list[tuple[int, int]] = []
    for offset in offsets:
        if found and offset - found[-1][1] <= gap + 1:
            found[-1] = (found[-1][0], offset)
        else:
            found.append((offset, offset))
    return found


async def read_offsets(broker: Broker, topic: str, qid: int, offsets: list[int]) -> dict[int, StoredMessage]:
    """The messages at ``offsets`` (sorted) of ``topic``'s queue ``qid``, by offset; an offset whose
    entry is gone (trimmed) or unreadable is left out. Raises BrokerError when Redis fails."""
    if not offsets:
        return {}
    stream = keys.stream(topic, qid)
    spans = runs(offsets, GAP)
    with map_redis_errors(f"reading {len(offsets)} held message(s) of {topic}#{qid} again"):
        pipe = broker.redis.pipeline(transaction=False)
        for first, last in spans:
            pipe.xrange(stream, keys.stream_id(first), keys.stream_id(last), count=last - first + 1)
        replies: list[Any] = await pipe.execute()
    found: dict[int, StoredMessage] = {}
    wanted = set(offsets)
    for entries in replies:
        for entry_id, fields in entries or ():
            try:
                message = decode_entry(entry_id, fields)
            except (ValueError, AttributeError, TypeError):
                continue  # not the producer's: it was never held (the reader dead-letters such entries)
            if message.offset in wanted:
                found[message.offset] = message
    return found
