"""Key-level state in Redis: parked keys, and operator actions on keys for whichever proxy holds them.

- ``parked_keys(g, t)`` (hash): ``"<qid> <key>"`` → :class:`ParkRecord` as JSON. The holder of the queue
  writes it when a key parks and deletes it on retry, skip or resume; a proxy that takes the queue over
  (after a kill -9 or a lease hand-off) loads it before reading, so the key stays parked.
- ``key_commands(g, t)`` (stream, capped): operator actions (:class:`KeyCommand`). Every proxy consuming
  the topic reads it; the holder of the key's queue applies the action and answers on
  ``key_command_replies(g, t, id)`` (a list with a short expiry), which the proxy that took the admin
  call waits on. Queries (``list``) use the same path, so the keys view covers every proxy.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Final

from redis.asyncio import Redis as AsyncRedis

from ddmq.protocol import keys
from ddmq.proxy.store.broker import map_redis_errors
from ddmq.proxy.store.dead_letters import MAX_PAGE, DeadLetters

__all__ = ["COMMANDS_KEPT", "KeyCommand", "KeyCommandLog", "ParkRecord", "ParkStore", "dead_letter_ids_of_key"]

#: Commands kept in the stream (a proxy more than this many behind has missed some: its callers time out).
COMMANDS_KEPT: Final = 1000
#: How long an answer list lives: the admin call waits far less than this.
_REPLY_TTL_S: Final = 60


@dataclass(frozen=True)
class ParkRecord:
    """A parked key: where it stopped and why. ``offset`` None means an operator parked it ahead of time:
    it stops at its next message handed out (after the one in flight, if any)."""

    qid: int
    key: str
    offset: int | None
    reason: str
    attempts: int
    parked_by: str
    parked_at_ms: int

    @property
    def field(self) -> str:
        return field_of(self.qid, self.key)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> ParkRecord | None:
        try:
            data = json.loads(raw)
            return cls(
                int(data["qid"]), str(data["key"]), None if data["offset"] is None else int(data["offset"]),
                str(data["reason"]), int(data["attempts"]), str(data["parked_by"]), int(data["parked_at_ms"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


def field_of(qid: int, key: str) -> str:
    return f"{qid} {key}"


def now_ms() -> int:
    return int(time.time() * 1000)


class ParkStore:
    """The parked keys of one (group, topic) in Redis."""

    def __init__(self, redis: AsyncRedis, group: str, topic: str) -> None:
        self._redis = redis
        self._name = keys.parked_keys(group, topic)
        self._what = f"{group}/{topic}"

    async def all(self) -> list[ParkRecord]:
        with map_redis_errors(f"reading the parked keys of {self._what}"):
            raw: dict[bytes, bytes] = await self._redis.hgetall(self._name)
        return [r for r in map(ParkRecord.from_json, raw.values()) if r is not None]

    async def of_queue(self, qid: int) -> list[ParkRecord]:
        return [r for r in await self.all() if r.qid == qid]

    async def put(self, record: ParkRecord) -> None:
        with map_redis_errors(f"parking {record.key!r} of {self._what}#{record.qid}"):
            await self._redis.hset(self._name, record.field, record.to_json())

    async def delete(self, qid: int, key: str) -> bool:
        with map_redis_errors(f"unparking {key!r} of {self._what}#{qid}"):
            return bool(await self._redis.hdel(self._name, field_of(qid, key)))


@dataclass(frozen=True)
class KeyCommand:
    """An operator's action on a key (``retry``, ``skip``, ``park``, ``resume``) or a query (``list``)."""

    id: str
    action: str
    key: str | None
    qid: int | None
    by: str
    origin: str  # the proxy that took the admin call (it applies the action itself, it does not answer)


class KeyCommandLog:
    """The command stream of one (group, topic) and the answers to its commands."""

    def __init__(self, redis: AsyncRedis, group: str, topic: str) -> None:
        self._redis = redis
        self._group = group
        self._topic = topic
        self._name = keys.key_commands(group, topic)

    async def tail(self) -> str:
        """The id of the stream's last entry: read after it to see only new commands."""
        with map_redis_errors("reading the key command stream"):
            info: list[Any] = await self._redis.xrevrange(self._name, count=1)
        return info[0][0].decode() if info else "0-0"

    async def post(self, command: KeyCommand) -> None:
        fields = {"id": command.id, "action": command.action, "key": command.key or "",
                  "qid": "" if command.qid is None else str(command.qid), "by": command.by,
                  "origin": command.origin}
        with map_redis_errors("posting a key command"):
            await self._redis.xadd(self._name, fields, maxlen=COMMANDS_KEPT, approximate=True)

    async def read(self, after: str) -> tuple[str, list[KeyCommand]]:
        """Commands after stream id ``after``; returns the id to read after next."""
        with map_redis_errors("reading key commands"):
            reply: Any = await self._redis.xread({self._name: after}, count=100)
        commands = []
        for _, entries in reply or ():
            for entry_id, fields in entries:
                after = entry_id.decode()
                f = {k.decode(): v.decode() for k, v in fields.items()}
                qid = f.get("qid", "")
                commands.append(KeyCommand(
                    f.get("id", ""), f.get("action", ""), f.get("key") or None,
                    int(qid) if qid.isdigit() else None, f.get("by", ""), f.get("origin", ""),
                ))
        return after, commands

    async def answer(self, command_id: str, answer: dict[str, Any]) -> None:
        name = keys.key_command_replies(self._group, self._topic, command_id)
        with map_redis_errors("answering a key command"):
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.rpush(name, json.dumps(answer))
                pipe.expire(name, _REPLY_TTL_S)
                await pipe.execute()

    async def answers(self, command_id: str, expected: int, timeout_s: float) -> list[dict[str, Any]]:
        """Up to ``expected`` answers to command ``command_id``, waiting at most ``timeout_s`` in all."""
        name = keys.key_command_replies(self._group, self._topic, command_id)
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with map_redis_errors("waiting for key command answers"):
                popped: Any = await self._redis.blpop([name], timeout=max(left, 0.01))
            if popped is None:
                break
            try:
                out.append(json.loads(popped[1]))
            except ValueError:
                continue
        return out


async def dead_letter_ids_of_key(letters: DeadLetters, key: str) -> list[str]:
    """The ids of ``key``'s dead letters in the key's original order (queue, then offset)."""
    found: list[tuple[int, int, str]] = []
    after: str | None = None
    while True:
        page = await letters.read(after, MAX_PAGE, 1)
        found += [(letter.qid, letter.offset, letter.id) for letter in page.entries if letter.key == key]
        if not page.entries or not page.more:
            return [entry_id for _, _, entry_id in sorted(found)]
        after = page.entries[-1].id
