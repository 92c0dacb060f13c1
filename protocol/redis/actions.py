"""The record of operator actions: who paused, resumed, replayed, purged, acted on a key, reset offsets,
or opened and closed a breaker, what exactly, and when (Redis's time).

One capped stream, :func:`ddmq.protocol.redis.keys.actions`, holds the last :data:`MAX_KEPT` actions of
every group: each ``XADD`` trims it exactly to that length, so the record is bounded however busy the
operators are. The entry id is Redis's time (``*``), so the record's clock is the same on every proxy
and every operator's machine. An entry's fields: ``who`` (the admin token's holder and peer address, an
operator's user and host, ``proxy <instance>``, ``breaker``), ``action`` (``pause``, ``resume``,
``replay``, ``purge``, ``key <verb>``, ``offsets reset``, ``breaker open`` ...), ``group`` and ``topic``
(empty: none), and ``detail``, a JSON object of the call's parameters, each value bounded
(:data:`MAX_DETAIL_BYTES` in all) and never a secret: callers put in what the operator asked, not
credentials.

Every record is also a log line at INFO, ``operator action: ...``, written before the Redis write, so
an action whose record Redis refused is still in the log. Both proxy and command-line callers use the
same two functions::

    await record_action(redis, "breaker", "breaker open", group="cg_rides", detail={"reason": "..."})
    recent = await recent_actions(redis, limit=50, group="cg_rides")

A Redis failure is raised as the client raises it (the proxy's client: ``BrokerError``); a caller whose
own work is done catches it and logs, so a record that could not be written never undoes an action.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Final

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import AsyncRedis, SyncRedis

__all__ = ["MAX_DETAIL_BYTES", "MAX_KEPT", "MAX_WHO", "OperatorAction", "recent_actions", "recent_actions_sync",
           "record_action", "record_action_sync"]

log = logging.getLogger(__name__)

#: Actions kept (every group together); older ones are trimmed by the write that passes the cap.
MAX_KEPT: Final = 1000
#: Bytes of an action's detail (JSON); a longer one is kept cut, marked ``"cut": true``.
MAX_DETAIL_BYTES: Final = 2048
#: Characters of ``who``, an action's name, a group or a topic.
MAX_WHO: Final = 200
#: Characters of one string value of the detail, and items of one list.
_MAX_TEXT: Final = 200
_MAX_ITEMS: Final = 10


@dataclass(frozen=True)
class OperatorAction:
    #: The stream entry's id: Redis's time in ms, then a sequence number.
    id: str
    at_ms: int
    who: str
    action: str
    group: str | None
    topic: str | None
    detail: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "at_ms": self.at_ms, "who": self.who, "action": self.action, "group": self.group,
                "topic": self.topic, "detail": self.detail}


def _text(value: str, most: int = MAX_WHO) -> str:
    return value if len(value) <= most else value[:most - 1] + "…"


def _bounded(value: Any, depth: int = 0) -> Any:
    """``value`` with every string, list and object cut to a few items, as JSON can say it."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return _text(value, _MAX_TEXT)
    if depth >= 2:
        return _text(str(value), _MAX_TEXT)
    if isinstance(value, dict):
        items = list(value.items())
        out = {_text(str(k), 60): _bounded(v, depth + 1) for k, v in items[:_MAX_ITEMS * 2]}
        if len(items) > _MAX_ITEMS * 2:
            out["more_fields"] = len(items) - _MAX_ITEMS * 2
        return out
    if isinstance(value, list | tuple | set | frozenset):
        seq = sorted(value, key=str) if isinstance(value, set | frozenset) else list(value)
        shown: list[Any] = [_bounded(v, depth + 1) for v in seq[:_MAX_ITEMS]]
        if len(seq) > _MAX_ITEMS:
            shown.append(f"... {len(seq) - _MAX_ITEMS} more")
        return shown
    return _text(str(value), _MAX_TEXT)


def _detail_json(detail: dict[str, Any] | None) -> str:
    text = json.dumps(_bounded(detail or {}), ensure_ascii=False, sort_keys=True)
    if len(text.encode()) <= MAX_DETAIL_BYTES:
        return text
    return json.dumps({"cut": True, "text": text.encode()[:MAX_DETAIL_BYTES // 2].decode("utf-8", "ignore")})


def _fields(who: str, action: str, group: str | None, topic: str | None,
            detail: dict[str, Any] | None) -> dict[str, str]:
    fields = {"who": _text(who), "action": _text(action), "group": _text(group or ""), "topic": _text(topic or ""),
              "detail": _detail_json(detail)}
    where = f" on {fields['group']}" if group else ""
    where += f"/{fields['topic']}" if topic else ""
    # who and the detail are JSON-quoted: a name holding a newline cannot forge a second log line.
    log.info("operator action: %s%s by %s %s", fields["action"], where, json.dumps(fields["who"]), fields["detail"])
    return fields


async def record_action(client: AsyncRedis, who: str, action: str, *, group: str | None = None,
                        topic: str | None = None, detail: dict[str, Any] | None = None) -> str:
    """Log and keep one operator action; the id of its record (Redis's time in ms, ``-``, a sequence)."""
    fields = _fields(who, action, group, topic, detail)
    entry_id = await client.xadd(keys.actions(), fields, maxlen=MAX_KEPT, approximate=False)
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def record_action_sync(client: SyncRedis, who: str, action: str, *, group: str | None = None,
                       topic: str | None = None, detail: dict[str, Any] | None = None) -> str:
    """:func:`record_action` for a synchronous client (the ``ddmq`` command)."""
    fields = _fields(who, action, group, topic, detail)
    entry_id = client.xadd(keys.actions(), fields, maxlen=MAX_KEPT, approximate=False)
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def _str(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _decode(entry_id: Any, raw: dict[Any, Any]) -> OperatorAction:
    """One record; fields written by hand (or missing) read as empty, never as an error."""
    fields = {_str(k): _str(v) for k, v in raw.items()}
    ident = _str(entry_id)
    try:
        detail = json.loads(fields.get("detail", "{}"))
    except ValueError:
        detail = None
    if not isinstance(detail, dict):
        detail = {"text": _text(fields.get("detail", ""), _MAX_TEXT)}
    at_ms = ident.partition("-")[0]
    return OperatorAction(ident, int(at_ms) if at_ms.isdigit() else 0, _text(fields.get("who", "")),
                          _text(fields.get("action", "")), _text(fields.get("group", "")) or None,
                          _text(fields.get("topic", "")) or None, _bounded(detail))


def _newest(entries: list[Any], limit: int, group: str | None) -> list[OperatorAction]:
    found = [_decode(entry_id, raw) for entry_id, raw in entries]
    return [a for a in found if group is None or a.group == group][:limit]


async def recent_actions(client: AsyncRedis, limit: int = 50, group: str | None = None) -> list[OperatorAction]:
    """The last ``limit`` actions (of ``group``, or of every group and none), newest first."""
    # A group's actions are found among the whole record, which is at most MAX_KEPT entries.
    count = MAX_KEPT if group is not None else limit
    return _newest(await client.xrevrange(keys.actions(), count=count), limit, group)


def recent_actions_sync(client: SyncRedis, limit: int = 50, group: str | None = None) -> list[OperatorAction]:
    count = MAX_KEPT if group is not None else limit
    return _newest(client.xrevrange(keys.actions(), count=count), limit, group)
