"""The keys of a (group, topic) across every proxy, and operator actions on one key.

A proxy answers for the queues it reads from its own engine; for queues other proxies read it posts a
command (:mod:`ddmq.proxy.groups.key_actions`) and waits for their answers; for queues nobody reads it
falls back on the parked keys stored in Redis. So any proxy can show and act on any key.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Final

from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.core.errors import BadRequestError, UnavailableError, UnknownEntryError
from ddmq.proxy.engine.parking import KEY_STATES, SEQUENCED, record_row
from ddmq.proxy.groups.group import TopicConsumer
from ddmq.proxy.groups.key_actions import ACTIONS, apply_command
from ddmq.proxy.store.key_commands import KeyCommand, KeyCommandLog, ParkRecord, ParkStore, now_ms

__all__ = ["ANSWER_WAIT_S", "key_action", "list_keys"]

#: How long a call waits for the other proxies' answers (they hear of the command as soon as it is
#: posted; a proxy that only polls its (group, topic)'s stream hears of it within 0.1 s).
ANSWER_WAIT_S: Final = 2.0
#: Rows in one page of the keys view.
PAGE: Final = 100


async def _other_holders(consumer: TopicConsumer, leases: LeaseStore) -> tuple[set[str], set[int]]:
    """Proxies other than this one holding a queue of the topic, and the queues nobody holds."""
    holders = await asyncio.gather(
        *(leases.holder(consumer.group, consumer.topic, qid) for qid in range(consumer.queues))
    )
    others = {h.owner for h in holders if h is not None and h.owner != leases.owner}
    free = {qid for qid, h in enumerate(holders) if h is None}
    return others, free


async def _ask(consumer: TopicConsumer, command: KeyCommand, others: set[str]) -> list[dict[str, Any]]:
    if not others:
        return []
    log_ = KeyCommandLog(consumer.broker.redis, consumer.group, consumer.topic)
    await log_.post(command)
    return await log_.answers(command.id, len(others), ANSWER_WAIT_S)


async def list_keys(
    consumer: TopicConsumer, leases: LeaseStore, states: frozenset[str] | None, key: str | None, offset: int
) -> dict[str, Any]:
    """The keys view of one (group, topic): counts per state and a page of rows, stuck keys first."""
    others, free = await _other_holders(consumer, leases)
    command = KeyCommand(uuid.uuid4().hex, "list", None, None, "", leases.owner)
    rows = list(apply_command(consumer, command)["rows"])
    for answer in await _ask(consumer, command, others):
        rows.extend(answer.get("rows", ()))
    if free:
        for record in await ParkStore(consumer.broker.redis, consumer.group, consumer.topic).all():
            if record.qid in free and record.parked_by != SEQUENCED:
                rows.append(record_row(record))
    counts = dict.fromkeys(KEY_STATES, 0)
    for row in rows:
        if row["state"] in counts:
            counts[row["state"]] += 1
    if key is not None:
        rows = [row for row in rows if row["key"] == key]
    if states is not None:
        rows = [row for row in rows if row["state"] in states]
    rows.sort(key=lambda r: (KEY_STATES.index(r["state"]) if r["state"] in KEY_STATES else 9, str(r["key"]),
                             r["qid"]))
    page = rows[offset:offset + PAGE]
    return {
        "group": consumer.group, "topic": consumer.topic, "counts": counts, "keys": page,
        "next_offset": offset + len(page) if offset + len(page) < len(rows) else None,
    }


async def key_action(
    consumer: TopicConsumer, leases: LeaseStore, action: str, key: str, qid: int | None, by: str
) -> dict[str, Any]:
    """Apply ``action`` to ``key`` wherever its queue is read; raises UnknownEntryError when no proxy
    knows the key (nothing unfinished, nothing parked), UnavailableError for a skip nobody can apply."""
    if action not in ACTIONS:
        raise BadRequestError(f"action must be one of {', '.join(ACTIONS)}, got {action[:50]!r}")
    if qid is not None and not 0 <= qid < max(consumer.queues, 1):
        raise BadRequestError(f"qid must be 0..{consumer.queues - 1}, got {qid}")
    if action == "park" and qid is None and consumer.queues:
        qid = queue_for_key(key, consumer.queues)  # where the producer puts the key's messages
    others, free = await _other_holders(consumer, leases)
    command = KeyCommand(uuid.uuid4().hex, action, key, qid, by, leases.owner)
    applied = list(apply_command(consumer, command)["applied"])
    for answer in await _ask(consumer, command, others):
        applied.extend(answer.get("applied", ()))
    if free and (qid is None or qid in free):
        applied.extend(await _unread_queues(consumer, action, key, qid, by, free))
    if not applied:
        raise UnknownEntryError(
            f"key {key!r} has no unfinished or parked message in {consumer.group}/{consumer.topic}"
            + (f"#{qid}" if qid is not None else "")
        )
    return {"action": action, "key": key, "applied": sorted(applied, key=lambda a: a["qid"])}


async def _unread_queues(
    consumer: TopicConsumer, action: str, key: str, qid: int | None, by: str, free: set[int]
) -> list[dict[str, Any]]:
    """The action on queues no proxy reads now: only the parked state in Redis can change."""
    store = ParkStore(consumer.broker.redis, consumer.group, consumer.topic)
    records = [r for r in await store.all() if r.key == key and r.qid in free and (qid is None or r.qid == qid)]
    applied: list[dict[str, Any]] = []
    if action == "park" and qid is not None and not records:
        await store.put(ParkRecord(qid, key, None, f"parked by {by}", 0, by, now_ms()))
        return [{"qid": qid, "state": "parked"}]
    for record in records:
        if action == "skip":
            raise UnavailableError(f"no proxy reads queue {record.qid} now: skip {key!r} once one does (retry, "
                                "resume and park work meanwhile)")
        if action in ("retry", "resume"):
            await store.delete(record.qid, key)
            applied.append({"qid": record.qid, "state": "idle"})
        else:
            applied.append({"qid": record.qid, "state": "parked"})
    return applied
