"""DeadLetters: a (group, topic)'s dead-letter stream, for operators: list, read, replay, purge.

Dead letters are written by the pull buffer (``Broker.dead_letter``) to the stream
:func:`ddmq.protocol.redis.keys.dead_letters`, one entry per message with its qid, offset, attempts and last
error. Every read and every step of a replay or purge is bounded in bytes (``max_bytes``): a page
stops before the entry that would pass it and says whether more follow, and values are cut to
``value_cut`` bytes in listings (the full length is given; :meth:`DeadLetters.get` reads one entry
with a larger cut). A value larger than the budget still moves, alone.

Replay is exactly once per entry, whatever runs at the same time (the scripts are in
:mod:`ddmq.protocol.redis.scripts`):

1. *Claim*: one script moves a chunk of entries out of the dead-letter stream into the claims stream
   (:func:`ddmq.protocol.redis.keys.dead_letter_claims`). An entry is claimed by one call only; a purge or a
   second replay no longer sees it.
2. *Produce*: one script per queue produces the chunk's messages (dense offsets, the producer's own
   code) and records each dead-letter id as replayed into that queue, skipping ids already recorded.
3. *Release*: the claims are deleted.

A crash after 1 leaves the entries claimed, not lost: every replay first finishes the claims it finds
(anyone's: 2 is idempotent), so a crash between 2 and 3 produces nothing twice either. A replayed
message goes to the queue it came from (by its key's hash, or its dead-letter id's, when the topic
has fewer queues now), and is a new message at the end of it, so it comes after any later message of
its key that is already consumed. It carries the property
:data:`~ddmq.protocol.redis.stream_entry.REPLAY_GROUP` with the group's name: the topic's other groups,
which finished the message when it first came, take it as finished and never deliver it. Replays of
one (group, topic) in one proxy run one at a time, so the dead letters of a key are produced in their
order.

"All" means the entries present when the call starts: a replayed message that fails again and comes
back is not replayed a second time by the same call.

>>> letters = DeadLetters(redis, "cg_rides", "rides")
>>> page = await letters.read(limit=50)
>>> await letters.replay([page.entries[0].id])
>>> await letters.purge(None)        # everything dead-lettered so far
"""

from __future__ import annotations

import re
import time
import zlib
from collections import defaultdict
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Final, NamedTuple

from ddmq.protocol.produce.producer import AsyncProducer, ProduceError
from ddmq.protocol.redis import keys, stream_entry
from ddmq.protocol.redis.connection import AsyncRedis, eval_script
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.scripts import (
    CLAIM_LUA,
    CLAIMS_LUA,
    LAST_ID_LUA,
    PAGE_LUA,
    PURGE_LUA,
    REPLAY_LUA,
)
from ddmq.proxy.core.errors import BadRequestError, BrokerError
from ddmq.proxy.store.broker import map_redis_errors

#: Most entries moved per script call when replaying or purging.
CHUNK: Final = 500
#: Replay markers live this long; a claim left by a crash is finished by the next replay of its group and
#: topic, which must come within this time for the markers to still prevent a second copy.
MARKER_KEEP_MS: Final = 7 * 24 * 3600 * 1000
#: Largest page :meth:`DeadLetters.read` returns.
MAX_PAGE: Final = 1000
#: Default byte budget of one page or one replay/purge step.
DEFAULT_MAX_BYTES: Final = 4 * 1024 * 1024
#: Default cut of values in listings.
DEFAULT_VALUE_CUT: Final = 16 * 1024
#: Messages per produce script call (the producer's own bound).
_MESSAGES_PER_CALL: Final = 1000

_ENTRY_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}\Z")  # ASCII digits only, no trailing newline


class DeadLetter(NamedTuple):
    id: str
    qid: int
    offset: int
    key: str
    tag: str
    #: The value, cut to the read's ``value_cut`` when longer (see ``value_bytes``).
    value: bytes
    properties: dict[str, str]
    produce_ms: int
    attempts: int
    error: str
    dead_ms: int
    #: The value's full length.
    value_bytes: int

    @property
    def value_truncated(self) -> bool:
        return len(self.value) < self.value_bytes


class Page(NamedTuple):
    entries: list[DeadLetter]
    #: True when entries follow the last one (continue after ``entries[-1].id``).
    more: bool


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


def _fields(flat: Sequence[bytes]) -> dict[bytes, bytes]:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _decode(entry_id: bytes | str, fields: dict[bytes, bytes], value_bytes: int | None = None) -> DeadLetter:
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
    value = fields.get(stream_entry.VALUE, b"")
    return DeadLetter(
        id=entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
        qid=number(b"qid"),
        offset=number(b"offset"),
        key=text(stream_entry.KEY),
        tag=text(stream_entry.TAG),
        value=value,
        properties={str(k): str(v) for k, v in properties.items()} if isinstance(properties, dict) else {},
        produce_ms=number(stream_entry.PRODUCE_TIME),
        attempts=number(b"attempts"),
        error=text(b"error"),
        dead_ms=number(b"dead_ms"),
        value_bytes=len(value) if value_bytes is None else value_bytes,
    )


def target_queue(letter: DeadLetter, queues: int) -> int:
    """Where a replay produces ``letter``: its own queue while the topic has it; else by its key, else by
    its id, so every attempt at the same entry picks the same queue (and finds its replay marker)."""
    if 0 <= letter.qid < queues:
        return letter.qid
    if letter.key:
        return queue_for_key(letter.key, queues)
    return zlib.crc32(letter.id.encode()) % queues


class DeadLetters:
    """One (group, topic)'s dead-letter stream. ``redis`` must return bytes. ``max_bytes`` bounds every
    page and every step of a replay or purge."""

    def __init__(
        self, redis: AsyncRedis, group: str, topic: str, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self.group = group
        self.topic = topic
        self._redis = redis
        self._key = keys.dead_letters(group, topic)
        self._claims = keys.dead_letter_claims(group, topic)
        self._max_bytes = max_bytes

    def _errors(self, doing: str) -> AbstractContextManager[None]:
        return map_redis_errors(f"{doing} dead letters of {self.group}/{self.topic}")

    async def count(self) -> int:
        with self._errors("counting"):
            return int(await self._redis.xlen(self._key))

    async def read(self, after: str | None = None, limit: int = 100, value_cut: int = DEFAULT_VALUE_CUT) -> Page:
        """Up to ``limit`` entries, oldest first, after the id ``after`` (exclusive) when given; values cut
        to ``value_cut`` bytes; fewer when their bytes would pass ``max_bytes``."""
        if not 1 <= limit <= MAX_PAGE:
            raise BadRequestError(f"limit must be 1..{MAX_PAGE}, got {limit}")
        if after is not None and all(int(part) == (1 << 64) - 1 for part in check_id(after).split("-")):
            return Page([], False)  # nothing comes after the largest id (and Redis refuses that range)
        start = "(" + check_id(after) if after is not None else "-"
        with self._errors("reading"):
            reply: Any = await eval_script(
                self._redis, PAGE_LUA, [self._key], [start, limit, value_cut, self._max_bytes, stream_entry.VALUE]
            )
        more, *entries = reply
        return Page([_decode(entry_id, _fields(flat), length) for entry_id, length, flat in entries], bool(more))

    async def get(self, entry_id: str, value_cut: int) -> DeadLetter | None:
        """The entry ``entry_id`` with its value cut to ``value_cut`` bytes, or None."""
        check_id(entry_id)
        with self._errors("reading"):
            reply: Any = await eval_script(
                self._redis, PAGE_LUA, [self._key], [entry_id, 1, value_cut, value_cut, stream_entry.VALUE]
            )
        for found_id, length, flat in reply[1:]:
            if found_id.decode() == entry_id:
                return _decode(found_id, _fields(flat), length)
        return None

    async def replay(self, ids: list[str] | None) -> ReplayResult:
        """Produce the entries ``ids`` (None: all present now) back into the topic, exactly once each
        (see the module docstring); claims left by an interrupted replay are finished first."""
        if ids is not None:
            ids = [check_id(entry_id) for entry_id in dict.fromkeys(ids)]  # each entry once
        replayed = await self.finish_claims()
        if ids is None:
            end = await self._last_id()
            while end is not None:
                _, claimed = await self.claim(("range", end))
                if not claimed:
                    break
                replayed += await self.produce_claimed(claimed)
            return ReplayResult(replayed, [])
        taken: set[str] = set()
        remaining = ids
        while remaining:
            examined, claimed = await self.claim(("ids", *remaining))
            remaining = remaining[examined:]
            taken.update(_fields(flat)[b"dlq_id"].decode() for _, flat in claimed)
            replayed += await self.produce_claimed(claimed)
        return ReplayResult(replayed, [entry_id for entry_id in ids if entry_id not in taken])

    async def claim(self, what: tuple[str, ...]) -> tuple[int, list[tuple[bytes, list[bytes]]]]:
        """Step 1: move a chunk from the stream to the claims stream; ``what`` is ``("range", last_id)``
        or ``("ids", id, ...)``. Returns how many ids were examined and the claims (as XRANGE gives them)."""
        with self._errors("claiming"):
            reply: Any = await eval_script(
                self._redis,
                CLAIM_LUA,
                [self._key, self._claims],
                [int(time.time() * 1000), CHUNK, self._max_bytes, *what],
            )
        examined, *claimed = reply
        return int(examined), [(claim_id, flat) for claim_id, flat in claimed]

    async def finish_claims(self) -> int:
        """Produce and release every claim in the claims stream (left by a crash, or another replay
        under way: producing is idempotent). Returns how many messages this call produced."""
        produced = 0
        start = "-"
        while True:
            with self._errors("reading claimed"):
                claims: Any = await eval_script(
                    self._redis, CLAIMS_LUA, [self._claims], [start, CHUNK, self._max_bytes]
                )
            if not claims:
                return produced
            produced += await self.produce_claimed(claims)
            start = "(" + claims[-1][0].decode()

    async def produce_claimed(self, claims: list[tuple[bytes, list[bytes]]], release: bool = True) -> int:
        """Steps 2 and 3 for ``claims``: produce each message unless already produced, then (with
        ``release``) delete the claims. Returns how many messages were produced now."""
        if not claims:
            return 0
        letters = []
        for _, flat in claims:
            fields = _fields(flat)
            letters.append(_decode(fields.pop(b"dlq_id"), fields))
        try:
            queues = await AsyncProducer(self._redis).queue_count(self.topic)
        except ProduceError as exc:
            raise BrokerError(f"replaying dead letters of {self.group}/{self.topic}: {exc}") from exc
        by_queue: dict[int, list[DeadLetter]] = defaultdict(list)
        for letter in letters:
            by_queue[target_queue(letter, queues)].append(letter)
        produced = 0
        now_ms = int(time.time() * 1000)
        for qid, queued in by_queue.items():
            for start in range(0, len(queued), _MESSAGES_PER_CALL):
                produced += await self._produce(qid, queued[start : start + _MESSAGES_PER_CALL], now_ms)
        if release:
            with self._errors("releasing replayed"):
                await self._redis.xdel(self._claims, *[claim_id for claim_id, _ in claims])
        return produced

    async def _produce(self, qid: int, letters: list[DeadLetter], now_ms: int) -> int:
        args: list[bytes | int | str] = [len(letters), b""]
        for letter in letters:
            # Addressed to this group alone: the topic's other groups finished the message long ago.
            properties = {**letter.properties, stream_entry.REPLAY_GROUP: self.group}
            items = stream_entry.encode_entry(letter.value, letter.key or None, letter.tag or None, properties, now_ms)
            args.append(len(items))
            args.extend(items)
        args.extend(letter.id for letter in letters)
        args.extend((now_ms, MARKER_KEEP_MS))
        queue_keys = [
            keys.stream(self.topic, qid), keys.sequence(self.topic, qid), keys.replayed(self.group, self.topic, qid)
        ]
        with self._errors(f"replaying into queue {qid} the"):
            reply: Any = await eval_script(self._redis, REPLAY_LUA, queue_keys, args)
        return int(reply[1])

    async def purge(self, ids: list[str] | None) -> int:
        """Delete the entries ``ids`` (None: all present now); returns how many were deleted. Entries
        claimed by a replay under way are no longer in the stream: they are replayed, not purged."""
        if ids is not None:
            for entry_id in ids:
                check_id(entry_id)
            if not ids:
                return 0
            with self._errors("deleting"):
                return int(await self._redis.xdel(self._key, *ids))
        end = await self._last_id()
        purged = 0
        while end is not None:
            with self._errors("purging"):
                deleted = int(await eval_script(self._redis, PURGE_LUA, [self._key], [end, CHUNK, self._max_bytes]))
            if deleted == 0:
                break
            purged += deleted
        return purged

    async def _last_id(self) -> str | None:
        with self._errors("reading"):
            last: Any = await eval_script(self._redis, LAST_ID_LUA, [self._key], [])
        return last.decode() if last else None
