"""DeadLetters: a (group, topic)'s dead-letter stream, for operators: list, replay, purge.

Dead letters are written by the pull buffer (``Broker.dead_letter``) to the stream
:func:`ddmq.protocol.keys.dead_letters`, one entry per message with its qid, offset, attempts and last
error. Replaying produces the message again into its topic, into the queue it came from, with the
project's producer (dense offsets), and then deletes the entry: a crash in between replays it twice,
never loses it. A replayed message is a new message at the end of its queue, so it comes after any
later message of its key that is already consumed.

"All" means the entries present when the call starts: a replayed message that fails again and comes
back is not replayed a second time by the same call.

>>> letters = DeadLetters(redis, "cg_rides", "rides")
>>> page = await letters.read(limit=50)
>>> await letters.replay([page[0].id])
>>> await letters.purge(None)        # everything dead-lettered so far
"""

from __future__ import annotations

import re
from typing import Any, Final, NamedTuple

from ddmq.protocol import keys, stream_entry
from ddmq.protocol.connection import AsyncRedis
from ddmq.protocol.producer import AsyncProducer, OutgoingMessage, ProduceError
from ddmq.proxy.broker import map_redis_errors
from ddmq.proxy.errors import BadRequestError, BrokerError

#: Entries moved per round trip when replaying or listing everything.
CHUNK: Final = 500
#: Largest page :meth:`DeadLetters.read` returns.
MAX_PAGE: Final = 1000

_ENTRY_ID = re.compile(r"^\d{1,20}-\d{1,20}$")


class DeadLetter(NamedTuple):
    id: str
    qid: int
    offset: int
    key: str
    tag: str
    value: bytes
    properties: dict[str, str]
    produce_ms: int
    attempts: int
    error: str
    dead_ms: int


class ReplayResult(NamedTuple):
    replayed: int
    #: Asked-for ids that are not in the stream (already replayed or purged).
    missing: list[str]


def check_id(entry_id: str) -> str:
    """``entry_id`` if it is a stream entry id (two unsigned 64-bit numbers), else BadRequestError."""
    if not _ENTRY_ID.match(entry_id) or any(int(part) >= 1 << 64 for part in entry_id.split("-")):
        raise BadRequestError(
            f"invalid dead-letter id {entry_id!r}: expected <ms>-<seq>, two numbers below 2^64, e.g. 1763776220123-0"
        )
    return entry_id


def _decode(entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
    def text(name: bytes) -> str:
        return fields.get(name, b"").decode("utf-8", "replace")

    def number(name: bytes) -> int:
        raw = fields.get(name)
        try:
            return int(raw) if raw else 0
        except ValueError:
            return 0

    try:
        properties = stream_entry.decode_properties(fields.get(stream_entry.PROPERTIES))
    except ValueError:
        properties = {}
    return DeadLetter(
        id=entry_id.decode(),
        qid=number(b"qid"),
        offset=number(b"offset"),
        key=text(stream_entry.KEY),
        tag=text(stream_entry.TAG),
        value=fields.get(stream_entry.VALUE, b""),
        properties={str(k): str(v) for k, v in properties.items()} if isinstance(properties, dict) else {},
        produce_ms=number(stream_entry.PRODUCE_TIME),
        attempts=number(b"attempts"),
        error=text(b"error"),
        dead_ms=number(b"dead_ms"),
    )


def _next_id(entry_id: str) -> str:
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq) + 1}"


class DeadLetters:
    """One (group, topic)'s dead-letter stream. ``redis`` must return bytes."""

    def __init__(self, redis: AsyncRedis, group: str, topic: str) -> None:
        self.group = group
        self.topic = topic
        self._redis = redis
        self._key = keys.dead_letters(group, topic)

    async def count(self) -> int:
        with map_redis_errors(f"counting dead letters of {self.group}/{self.topic}"):
            return int(await self._redis.xlen(self._key))

    async def read(self, after: str | None = None, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` entries, oldest first, after the id ``after`` (exclusive) when given."""
        if not 1 <= limit <= MAX_PAGE:
            raise BadRequestError(f"limit must be 1..{MAX_PAGE}, got {limit}")
        start = "(" + check_id(after) if after is not None else "-"
        with map_redis_errors(f"reading dead letters of {self.group}/{self.topic}"):
            entries: Any = await self._redis.xrange(self._key, start, "+", count=limit)
        return [_decode(entry_id, fields) for entry_id, fields in entries]

    async def replay(self, ids: list[str] | None) -> ReplayResult:
        """Produce the entries ``ids`` (None: all present now) back into the topic, then delete them."""
        if ids is not None:
            ids = [check_id(entry_id) for entry_id in dict.fromkeys(ids)]  # each entry once
            found = await self._fetch(ids)
            present = {letter.id for letter in found}
            missing = [entry_id for entry_id in ids if entry_id not in present]
            await self._replay_batch(found)
            return ReplayResult(len(found), missing)
        end = await self._last_id()
        replayed = 0
        while end is not None:
            with map_redis_errors(f"reading dead letters of {self.group}/{self.topic}"):
                entries: Any = await self._redis.xrange(self._key, "-", end, count=CHUNK)
            if not entries:
                break
            batch = [_decode(entry_id, fields) for entry_id, fields in entries]
            await self._replay_batch(batch)
            replayed += len(batch)
        return ReplayResult(replayed, [])

    async def purge(self, ids: list[str] | None) -> int:
        """Delete the entries ``ids`` (None: all present now); returns how many were deleted."""
        if ids is not None:
            for entry_id in ids:
                check_id(entry_id)
            if not ids:
                return 0
            with map_redis_errors(f"deleting dead letters of {self.group}/{self.topic}"):
                return int(await self._redis.xdel(self._key, *ids))
        end = await self._last_id()
        if end is None:
            return 0
        with map_redis_errors(f"purging dead letters of {self.group}/{self.topic}"):
            return int(await self._redis.xtrim(self._key, minid=_next_id(end), approximate=False))

    async def _last_id(self) -> str | None:
        with map_redis_errors(f"reading dead letters of {self.group}/{self.topic}"):
            last: Any = await self._redis.xrevrange(self._key, "+", "-", count=1)
        return last[0][0].decode() if last else None

    async def _fetch(self, ids: list[str]) -> list[DeadLetter]:
        found: list[DeadLetter] = []
        with map_redis_errors(f"reading dead letters of {self.group}/{self.topic}"):
            for start in range(0, len(ids), CHUNK):
                pipe = self._redis.pipeline(transaction=False)
                for entry_id in ids[start : start + CHUNK]:
                    pipe.xrange(self._key, entry_id, entry_id)
                for entries in await pipe.execute():
                    found.extend(_decode(entry_id, fields) for entry_id, fields in entries)
        return found

    async def _replay_batch(self, letters: list[DeadLetter]) -> None:
        if not letters:
            return
        producer = AsyncProducer(self._redis)
        try:
            queues = await producer.queue_count(self.topic)
            await producer.send_batch(
                self.topic,
                [
                    OutgoingMessage(
                        value=letter.value,
                        key=letter.key or None,
                        tag=letter.tag or None,
                        properties=letter.properties or None,
                        qid=letter.qid if 0 <= letter.qid < queues else None,
                    )
                    for letter in letters
                ],
            )
        except ProduceError as exc:
            raise BrokerError(f"replaying dead letters of {self.group}/{self.topic}: {exc}") from exc
        with map_redis_errors(f"deleting replayed dead letters of {self.group}/{self.topic}"):
            await self._redis.xdel(self._key, *[letter.id for letter in letters])
