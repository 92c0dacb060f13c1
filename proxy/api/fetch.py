"""The low-level API (docs/design/servers.md, "Low-level fetch and ack"): ``fetch`` from offsets the client names,
``ack`` the client's positions.

Unlike ``pull``, nothing here is ordered by key, leased, retried or timed out: the client owns its
progress. ``fetch`` reads each named (topic, qid) from an offset, in offset order, and says where to
continue (``next_offset``); naming none reads every queue of the group's topics from its stored
position. ``ack`` stores, per (group, topic, qid), the next offset the client wants to read, kept
apart from the ordered pull path's committed offsets (``keys.fetch_position``). Any proxy that serves
the group serves both, whoever owns the queue's lease: reads are side-effect free and positions
belong to the client.

Intended users: Spark batch and ``mode=queue`` streaming reads (deterministic offset ranges, replayable),
replaying a queue from an offset for backfills or audits, and tools that page through a queue.

Offsets: a queue's first message has offset 1; ``-1`` means "from the stored position" (1 when none
was stored). A request names at most ``MAX_FETCH_QUEUES`` queues of topics the group consumes. Per
queue at most ``max_batch`` messages (``0..MAX_FETCH_BATCH``; 0 answers the start positions only),
and a response stops adding messages once ``MAX_FETCH_BYTES`` of values were added (its first
message always fits), so a page does not outgrow a frame unless one message does; ``next_offset``
picks up exactly where it stopped, past entries that are not messages of ours too, and past other groups'
replayed dead letters (:data:`~ddmq.protocol.redis.stream_entry.REPLAY_GROUP`), which a group never sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Final

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.stream_entry import REPLAY_GROUP
from ddmq.proxy.core.errors import BadRequestError, UnknownTopicError
from ddmq.proxy.core.types import FetchedQueue, QueueId, StoredMessage
from ddmq.proxy.groups.group import ConsumerGroup
from ddmq.proxy.store.broker import Broker

#: Messages per queue when the request does not say.
DEFAULT_FETCH_BATCH: Final = 64
#: Upper bound on ``maxBatchSize``.
MAX_FETCH_BATCH: Final = 10_000
#: Most (topic, qid) pairs one request may name.
MAX_FETCH_QUEUES: Final = 4096
#: Value bytes after which a response takes no more messages.
MAX_FETCH_BYTES: Final = 4 * 1024 * 1024
#: ``fetchOffset`` value meaning "from the stored position".
FROM_STORED: Final = -1
FIRST_OFFSET: Final = 1
_REPLAY_GROUP: Final = REPLAY_GROUP


class LowLevelApi:
    """``fetch`` and ``ack`` for the groups of one proxy."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    async def fetch(
        self,
        group: ConsumerGroup,
        offsets: Mapping[str, Mapping[str, int]] | None,
        max_batch: int | None,
        linger_ms: int,
    ) -> list[FetchedQueue]:
        """Messages of each named queue from its offset; waits up to ``linger_ms`` if there are none at all."""
        if max_batch is not None and not 0 <= max_batch <= MAX_FETCH_BATCH:
            raise BadRequestError(f"maxBatchSize must be within 0..{MAX_FETCH_BATCH}, got {max_batch}")
        count = DEFAULT_FETCH_BATCH if max_batch is None else max_batch
        wanted = await self._targets(group, offsets, allow_stored=True)
        starts = await self._resolve(group.name, wanted)
        if count == 0:
            return [FetchedQueue(q.topic, q.qid, start, []) for q, start in starts.items()]
        # An operator's pause holds its topics here too: their queues answer no messages, positions unchanged.
        held = {topic for topic in {q.topic for q in starts} if await group.pause_watch.holds(topic)}
        readable = {q: start for q, start in starts.items() if q.topic not in held}
        if not readable:
            await asyncio.sleep(linger_ms / 1000)  # a paused group's fetch lingers as a pull does
            return [FetchedQueue(q.topic, q.qid, start, []) for q, start in starts.items()]
        pages = await self._read(readable, count, block_ms=None)
        if linger_ms > 0 and not any(seen for _, seen in pages.values()):
            pages = await self._read(readable, count, block_ms=linger_ms)
        budget = MAX_FETCH_BYTES
        name = group.name
        answer = []
        for queue, start in starts.items():
            messages, seen = pages.get(queue, ([], 0))
            taken: list[StoredMessage] = []
            looked = 0  # messages looked at, other groups' replays included
            for message in messages:
                if budget <= 0:
                    break
                looked += 1
                properties = message.properties
                if properties and properties.get(_REPLAY_GROUP, name) != name:
                    continue
                taken.append(message)
                budget -= len(message.value)
            if looked == len(messages):  # the whole page: continue after foreign entries left out too
                next_offset = max(start, seen + 1)
            else:
                next_offset = messages[looked - 1].offset + 1 if looked else start
            answer.append(FetchedQueue(queue.topic, queue.qid, next_offset, taken))
        return answer

    async def ack(self, group: ConsumerGroup, offsets: Mapping[str, Mapping[str, int]]) -> None:
        """Store each offset as the group's position (the next offset to read) for that queue."""
        if not offsets:
            raise BadRequestError("AckResult.offsets names no queue")
        positions = await self._targets(group, offsets, allow_stored=False)
        async with self.broker.redis.pipeline(transaction=False) as pipe:
            for queue, offset in positions.items():
                pipe.set(keys.fetch_position(group.name, queue.topic, queue.qid), offset)
            await pipe.execute()

    async def positions(self, group: str, queues: list[QueueId]) -> dict[QueueId, int | None]:
        """The stored positions (None where none was stored)."""
        if not queues:
            return {}
        raws = await self.broker.get_many([keys.fetch_position(group, q.topic, q.qid) for q in queues])
        return {q: int(raw) if raw is not None else None for q, raw in zip(queues, raws, strict=True)}

    # --------------------------------------------------------------------------------------------

    async def _targets(
        self, group: ConsumerGroup, offsets: Mapping[str, Mapping[str, int]] | None, allow_stored: bool
    ) -> dict[QueueId, int]:
        """Validate the request's topic -> qid -> offset map; none given = every queue of the group."""
        if not offsets:
            every = {}
            for topic in group.consumers:
                for qid in range(await self._queues(topic)):
                    every[QueueId(topic, qid)] = FROM_STORED
            return every
        targets: dict[QueueId, int] = {}
        for topic, by_qid in offsets.items():
            if topic not in group.consumers:
                raise UnknownTopicError(f"group {group.name!r} does not consume topic {topic!r}")
            queues = await self._queues(topic)
            for raw_qid, offset in (by_qid or {}).items():
                try:
                    qid = int(raw_qid)
                except (TypeError, ValueError):
                    raise BadRequestError(f"{topic}: qid {raw_qid!r} is not a number") from None
                if not 0 <= qid < queues:
                    raise BadRequestError(f"{topic}: qid {qid} is outside 0..{queues - 1}")
                lowest = FROM_STORED if allow_stored else 0
                if not isinstance(offset, int) or offset < lowest:
                    raise BadRequestError(f"{topic}#{qid}: offset {offset!r} must be >= {lowest}")
                targets[QueueId(topic, qid)] = offset
                if len(targets) > MAX_FETCH_QUEUES:
                    raise BadRequestError(f"a request may name at most {MAX_FETCH_QUEUES} queues")
        if not targets:
            raise BadRequestError("fetchOffset names no queue")
        return targets

    async def _queues(self, topic: str) -> int:
        queues = await self.broker.topic_queues(topic)
        if not queues:
            raise UnknownTopicError(f"topic {topic!r} has no queues yet (no metadata in Redis)")
        return queues

    async def _resolve(self, group: str, wanted: dict[QueueId, int]) -> dict[QueueId, int]:
        stored = await self.positions(group, [q for q, offset in wanted.items() if offset == FROM_STORED])
        resolved = {}
        for queue, offset in wanted.items():
            if offset == FROM_STORED:
                offset = stored.get(queue) or FIRST_OFFSET
            resolved[queue] = max(offset, FIRST_OFFSET)
        return resolved

    async def _read(
        self, starts: dict[QueueId, int], count: int, block_ms: int | None
    ) -> dict[QueueId, tuple[list[StoredMessage], int]]:
        """One read over every queue (blocking when ``block_ms`` is given): messages and the offset of
        the last entry looked at, per queue; see :meth:`Broker.read_many`."""
        streams = {keys.stream(q.topic, q.qid): keys.stream_id_after(start - 1) for q, start in starts.items()}
        by_stream = {keys.stream(q.topic, q.qid): q for q in starts}
        replies = await self.broker.read_many(streams, count, block_ms)
        return {by_stream[stream]: page for stream, page in replies.items()}
