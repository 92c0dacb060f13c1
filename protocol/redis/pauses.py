"""A consumer group's pauses, shared by the proxy (which stops handing out messages) and the ``ddmq``
command (which pauses, resumes and shows them).

A pause is one field of the hash :func:`ddmq.protocol.redis.keys.paused`: a topic, or ``*`` for every
topic of the group, mapped to ``{"by", "at_ms", "until_ms"}`` (``until_ms`` null: until resumed). Its
times are Redis's (``TIME`` in :mod:`ddmq.protocol.redis.scripts.pause`); a pause whose end has come is
deleted by the next read, so ``--for`` needs no process to stay up.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

import redis

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import AsyncRedis, eval_script
from ddmq.protocol.redis.scripts.pause import PAUSE_LUA, PAUSES_LUA, RESUME_ALL_LUA

__all__ = ["ALL", "MAX_PAUSE_MS", "Pause", "covers", "parse_duration", "pause", "pause_async", "pauses",
           "pauses_async", "resume", "resume_async"]

#: The field of a pause of every topic of the group.
ALL: Final = "*"
#: Longest ``--for`` (30 days): a longer one is a typo more often than a plan; pause without an end instead.
MAX_PAUSE_MS: Final = 30 * 24 * 3600 * 1000

_DURATION = re.compile(r"^(\d{1,9})(ms|s|m|h|d)$")
_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@dataclass(frozen=True)
class Pause:
    #: None: every topic of the group.
    topic: str | None
    by: str
    at_ms: int
    until_ms: int | None

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "by": self.by, "at_ms": self.at_ms, "until_ms": self.until_ms}


def parse_duration(text: str) -> int:
    """``30s``, ``10m``, ``2h``, ``1d`` (or ``500ms``) in milliseconds; ValueError saying what is expected."""
    found = _DURATION.match(text.strip())
    if found is None:
        raise ValueError(f"a duration is a number and a unit (ms, s, m, h, d), e.g. 30s, 10m or 2h; got {text!r}")
    span = int(found[1]) * _UNIT_MS[found[2]]
    if not 0 < span <= MAX_PAUSE_MS:
        raise ValueError(f"a pause lasts more than 0 and at most 30d; got {text!r}")
    return span


def covers(found: list[Pause], topic: str) -> Pause | None:
    """The pause that holds ``topic`` (the group's, else the topic's own), if any."""
    return next((p for p in found if p.topic is None), None) or next((p for p in found if p.topic == topic), None)


def _field(topic: str | None) -> str:
    if topic == ALL:
        raise ValueError(f"{ALL!r} is not a topic name")
    return ALL if topic is None else topic


def _decode(field: bytes | str, raw: bytes | str) -> Pause:
    name = field.decode() if isinstance(field, bytes) else field
    try:
        data = json.loads(raw)
        until = data.get("until_ms")
        return Pause(None if name == ALL else name, str(data.get("by", "")), int(data.get("at_ms", 0)),
                     None if until is None else int(until))
    except (ValueError, TypeError, AttributeError):  # written by hand: a pause all the same, without details
        return Pause(None if name == ALL else name, "", 0, None)


def _reply(reply: Any) -> tuple[int, list[Pause]]:
    now, *flat = reply
    return int(now), [_decode(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


def pauses(client: redis.Redis, group: str) -> tuple[int, list[Pause]]:
    """Redis's time (ms) and the group's pauses in force (ended ones are deleted)."""
    return _reply(client.eval(PAUSES_LUA, 1, keys.paused(group)))


def pause(client: redis.Redis, group: str, topic: str | None, by: str, for_ms: int = 0) -> Pause:
    """Pause ``topic`` (None: every topic) of ``group`` for ``for_ms`` (0: until resumed)."""
    field = _field(topic)
    return _decode(field, client.eval(PAUSE_LUA, 1, keys.paused(group), field, by, for_ms))


def resume(client: redis.Redis, group: str, topic: str | None) -> int:
    """Lift the pause of ``topic`` (None: every pause of the group); how many pauses were lifted."""
    if topic is None:
        return int(client.eval(RESUME_ALL_LUA, 1, keys.paused(group)))
    return int(client.hdel(keys.paused(group), _field(topic)))


async def pauses_async(client: AsyncRedis, group: str) -> tuple[int, list[Pause]]:
    return _reply(await eval_script(client, PAUSES_LUA, [keys.paused(group)], []))


async def pause_async(client: AsyncRedis, group: str, topic: str | None, by: str, for_ms: int = 0) -> Pause:
    field = _field(topic)
    return _decode(field, await eval_script(client, PAUSE_LUA, [keys.paused(group)], [field, by, for_ms]))


async def resume_async(client: AsyncRedis, group: str, topic: str | None) -> int:
    if topic is None:
        return int(await eval_script(client, RESUME_ALL_LUA, [keys.paused(group)], []))
    return int(await client.hdel(keys.paused(group), _field(topic)))
