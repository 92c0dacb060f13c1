"""Operator key actions, whichever proxy holds the key's queue.

The proxy that takes an admin call (:mod:`ddmq.proxy.api.keys`) applies it to the queues it reads itself
and posts it to the (group, topic)'s command stream (:class:`KeyCommandLog`); every other proxy
consuming the topic reads that stream (:func:`serve_key_commands`), applies the command to the queues it
reads and answers, so the caller can say where it applied and in which state the key is now. A ``list``
command answers the proxy's key rows, so the keys view covers every proxy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.engine.parking import KEY_STATES
from ddmq.proxy.store.key_commands import KeyCommand, KeyCommandLog

if TYPE_CHECKING:
    from ddmq.proxy.groups.group import TopicConsumer

log = logging.getLogger(__name__)

__all__ = ["ACTIONS", "POLL_S", "apply_command", "serve_key_commands"]

#: The actions on a key (``list`` is the query).
ACTIONS: Final = ("retry", "skip", "park", "resume")
#: How often a proxy looks for new commands: an admin call waits about this long for other proxies.
POLL_S: Final = 0.1
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


async def serve_key_commands(consumer: TopicConsumer) -> None:
    """Apply the commands other proxies post for the topic, for as long as the consumer runs."""
    log_ = KeyCommandLog(consumer.broker.redis, consumer.group, consumer.topic)
    after: str | None = None
    delay = POLL_S
    while True:
        await asyncio.sleep(delay)
        try:
            if after is None:
                after = await log_.tail()
            after, commands = await log_.read(after)
            for command in commands:
                if command.origin == consumer.leases.owner:
                    continue  # the proxy that took the call applied it itself
                await log_.answer(command.id, apply_command(consumer, command))
            delay = POLL_S
        except DdmqError as exc:
            log.warning("%s/%s: reading key commands failed: %s", consumer.group, consumer.topic, exc)
            delay = min(delay * 2, 5.0)


def _stuck_first(row: dict[str, Any]) -> tuple[int, str, int]:
    state = row["state"]
    return (KEY_STATES.index(state) if state in KEY_STATES else len(KEY_STATES), str(row["key"]), row["qid"])
