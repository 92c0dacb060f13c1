"""Key-level state in Redis: parked keys, and operator actions on keys for whichever proxy holds them.

- ``parked_keys(g, t)`` (hash): ``"<qid> <key>"`` → :class:`ParkRecord` as JSON. The holder of the queue
  writes it when a key parks and deletes it on retry, skip or resume; a proxy that takes the queue over
  (after a kill -9 or a lease hand-off) loads it before reading, so the key stays parked.
- ``key_command_bell()`` (one stream, capped) and ``key_commands(g, t)`` (stream, capped): operator
  actions (:class:`KeyCommand`), posted on both. Every proxy watches the bell (:class:`KeyCommandWatcher`,
  one blocking read for all its groups and topics); the per-(group, topic) stream is what a proxy
  that does not watch the bell polls, so a rolling upgrade between the two loses no command. The
  holder of the key's queue applies the action and answers on ``key_command_replies(g, t, id)`` (a
  list with a short expiry), which the proxy that took the admin call waits on. Queries (``list``) use
  the same path, so the keys view covers every proxy.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Final

from redis.asyncio import Redis as AsyncRedis

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import LONGEST_BLOCK_MS
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.supervise import supervised
from ddmq.proxy.store.broker import map_redis_errors
from ddmq.proxy.store.dead_letters import MAX_PAGE, DeadLetters

__all__ = ["COMMANDS_KEPT", "KeyCommand", "KeyCommandLog", "KeyCommandWatcher", "ParkRecord", "ParkStore",
           "dead_letter_ids_of_key"]

log = logging.getLogger(__name__)

#: Commands kept in the stream (a proxy more than this many behind has missed some: its callers time out).
COMMANDS_KEPT: Final = 1000
#: How long the bell read blocks: while no command comes, a proxy sends one command per this long.
BELL_BLOCK_MS: Final = LONGEST_BLOCK_MS
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
        """Post ``command`` on the bell (what proxies watch) and on the (group, topic)'s own stream
        (what a proxy that does not watch the bell polls, during a rolling upgrade)."""
        fields = _fields(command)
        with map_redis_errors("posting a key command"):
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xadd(keys.key_command_bell(), {**fields, "g": self._group, "t": self._topic},
                          maxlen=COMMANDS_KEPT, approximate=True)
                pipe.xadd(self._name, fields, maxlen=COMMANDS_KEPT, approximate=True)
                await pipe.execute()

    async def read(self, after: str) -> tuple[str, list[KeyCommand]]:
        """Commands after stream id ``after``; returns the id to read after next."""
        with map_redis_errors("reading key commands"):
            reply: Any = await self._redis.xread({self._name: after}, count=100)
        commands = []
        for _, entries in reply or ():
            for entry_id, fields in entries:
                after = entry_id.decode()
                commands.append(_command({k.decode(): v.decode() for k, v in fields.items()}))
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
                # In steps no longer than any block of the project's: the client's read timeout is set for those.
                popped: Any = await self._redis.blpop([name], timeout=max(min(left, LONGEST_BLOCK_MS / 1000), 0.01))
            if popped is None:
                continue
            try:
                out.append(json.loads(popped[1]))
            except ValueError:
                continue
        return out


def _fields(command: KeyCommand) -> dict[str, str]:
    return {"id": command.id, "action": command.action, "key": command.key or "",
            "qid": "" if command.qid is None else str(command.qid), "by": command.by, "origin": command.origin}


def _command(f: dict[str, str]) -> KeyCommand:
    qid = f.get("qid", "")
    return KeyCommand(f.get("id", ""), f.get("action", ""), f.get("key") or None,
                      int(qid) if qid.isdigit() else None, f.get("by", ""), f.get("origin", ""))


#: A command's handler: the consumer of its (group, topic) applies it and answers.
CommandHandler = Callable[[KeyCommand], Awaitable[None]]


class KeyCommandWatcher:
    """The key commands of every (group, topic) this proxy consumes, from one blocking read of the bell
    (:func:`~ddmq.protocol.redis.keys.key_command_bell`) for the whole proxy: nothing to poll while no
    command comes, and a command reaches its handlers as soon as it is posted. Runs while a handler
    is registered. A proxy hears the commands posted after it started watching."""

    def __init__(self, redis: AsyncRedis, block_ms: int = BELL_BLOCK_MS) -> None:
        self._redis = redis
        self._block_ms = block_ms
        self._handlers: dict[tuple[str, str], list[CommandHandler]] = {}
        self._task: asyncio.Task[None] | None = None
        #: Cancelled reads not finished yet (``close`` waits for them).
        self._stopping: set[asyncio.Task[None]] = set()

    def add(self, group: str, topic: str, handler: CommandHandler) -> None:
        self._handlers.setdefault((group, topic), []).append(handler)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(supervised("key-commands", self._run), name="key-commands")

    async def serve(self, group: str, topic: str, handler: CommandHandler) -> None:
        """Hand the commands of (``group``, ``topic``) to ``handler`` until cancelled."""
        self.add(group, topic, handler)
        try:
            # Until cancelled. A bare future, not an Event: an Event's waiter deque costs ~0.7 KB, per consumer.
            await asyncio.get_running_loop().create_future()
        finally:
            self.remove(group, topic, handler)

    def remove(self, group: str, topic: str, handler: CommandHandler) -> None:
        handlers = self._handlers.get((group, topic), [])
        if handler in handlers:
            handlers.remove(handler)
        if not handlers:
            self._handlers.pop((group, topic), None)
        if not self._handlers and self._task is not None:
            self._task.cancel()
            self._stopping.add(self._task)
            self._task.add_done_callback(self._stopping.discard)
            self._task = None

    async def close(self) -> None:
        """Stop reading the bell and wait until the read in flight gave its connection back (a task
        merely cancelled may outlive the event loop, its connection still open)."""
        self._handlers.clear()
        if self._task is not None:
            self._task.cancel()
            self._stopping.add(self._task)
            self._task = None
        await asyncio.gather(*self._stopping, return_exceptions=True)
        self._stopping.clear()

    async def _tail(self) -> str:
        with map_redis_errors("reading the key command bell"):
            last: Any = await self._redis.xrevrange(keys.key_command_bell(), count=1)
        return last[0][0].decode() if last else "0-0"

    async def _run(self) -> None:
        after: str | None = None
        delay = 0.1
        while True:
            try:
                if after is None:
                    after = await self._tail()
                with map_redis_errors("reading the key command bell"):
                    reply: Any = await self._redis.xread({keys.key_command_bell(): after}, count=100,
                                                         block=self._block_ms)
                delay = 0.1
            except DdmqError as exc:
                (log.debug if delay > 0.1 else log.warning)("reading key commands failed: %s (retried)", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            for _, entries in reply or ():
                for entry_id, raw in entries:
                    after = entry_id.decode()
                    fields = {k.decode(): v.decode() for k, v in raw.items()}
                    for handler in list(self._handlers.get((fields.get("g", ""), fields.get("t", "")), ())):
                        try:
                            await handler(_command(fields))
                        except DdmqError as exc:
                            log.warning("answering key command %s failed: %s", fields.get("id"), exc)


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
