"""Operator key actions, whichever proxy holds the key's queue.

The proxy that takes an admin call (:mod:`ddmq.proxy.api.keys`) applies it to the queues it reads itself
and posts it (:class:`KeyCommandLog`); every other proxy consuming the topic hears of it at once
(:func:`command_handler`, called by the proxy's one watcher of the command bell), applies the command
to the queues it reads and answers, so the caller can say where it applied and in which state the key
is now. A ``list`` command answers the proxy's key rows, so the keys view covers every proxy.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

from ddmq.proxy.engine.parking import KEY_STATES
from ddmq.proxy.store.key_commands import CommandHandler, KeyCommand, KeyCommandLog

if TYPE_CHECKING:
    from ddmq.proxy.groups.group import TopicConsumer

log = logging.getLogger(__name__)

__all__ = ["ACTIONS", "apply_command", "command_handler"]

#: The actions on a key (``list`` is the query).
ACTIONS: Final = ("retry", "skip", "park", "resume")
#: Most key rows one proxy answers to ``list`` (stuck keys first): keeps an answer bounded.
MAX_ROWS: Final = 2000


def apply_command(consumer: TopicConsumer, command: KeyCommand) -> dict[str, Any]:
    """``command`` applied to the queues ``consumer`` reads: its answer."""
    owner = consumer.leases.owner
    if command.action == "list":
        rows = consumer.parking.rows()
        rows.sort(key=_stuck_first)
        return {"owner": owner, "rows": rows[:MAX_ROWS], "held": sorted(consumer.held)}
    if command.action not in ACTIONS or command.key is None:
        return {"owner": owner, "applied": []}
    applied = consumer.parking.act(command.action, command.key, command.qid, command.by or "unknown",
                                   sorted(consumer.held))
    for entry in applied:
        log.info("%s/%s#%s: %s of key %r by %s: now %s", consumer.group, consumer.topic, entry["qid"],
                 command.action, command.key, command.by, entry["state"])
    return {"owner": owner, "applied": applied}


def command_handler(consumer: TopicConsumer) -> CommandHandler:
    """What the proxy's :class:`KeyCommandWatcher` calls with each command posted for the consumer's
    group and topic: apply it to the queues the consumer reads, and answer (unless this proxy took the
    call: it applied the command itself)."""
    answers = KeyCommandLog(consumer.broker.redis, consumer.group, consumer.topic)

    async def handle(command: KeyCommand) -> None:
        if command.origin != consumer.leases.owner:
            await answers.answer(command.id, apply_command(consumer, command))

    return handle


def _stuck_first(row: dict[str, Any]) -> tuple[int, str, int]:
    state = row["state"]
    return (KEY_STATES.index(state) if state in KEY_STATES else len(KEY_STATES), str(row["key"]), row["qid"])
