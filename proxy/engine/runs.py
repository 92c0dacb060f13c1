"""Ordered runs of the pull buffer: which successors waiting behind a reply's heads in their keys'
chains join the reply (:func:`with_runs`), one message per key per round (:func:`_grow`) down each
key's chain (:func:`_walk`), within the reply's count and bytes. They become *run members*: in flight
but still in their key's chain, kept by their queue's :class:`~ddmq.proxy.engine.queue_slot.QueueSlot`
apart from the heads until each is its key's head; the slot also puts a run back when a message of it
fails or times out. How a reply is filled is :class:`~ddmq.proxy.engine.delivery.Delivery`'s, how
acks and fails reach members :class:`~ddmq.proxy.engine.pull_buffer.PullBuffer`'s; docs/design/engine.md
("Ordered runs") has the whole story.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from ddmq.proxy.core.pull_codec import MESSAGE_OVERHEAD_BYTES, UTF8_MAX_BYTES
from ddmq.proxy.core.types import THRIFT_REPLY, QueueId, ReplySize, StoredMessage
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.queue_slot import QueueSlot

__all__ = ["log_alone", "may_continue", "with_runs"]

# The buffer's logger: what is logged here is about the replies it serves.
log: Final = logging.getLogger("ddmq.proxy.engine.pull_buffer")

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_IN_FLIGHT: Final = JobState.IN_FLIGHT
_WAITING: Final = JobState.WAITING


def with_runs(
    slot: QueueSlot,
    heads: list[UpstreamJob],
    max_batch: int,
    max_per_key: int,
    held: Sequence[UpstreamJob],
    room_bytes: int,
    reply: ReplySize,
) -> tuple[list[UpstreamJob], list[int] | None]:
    """``heads`` (of ``slot``'s queue) with their keys' waiting successors behind them, then the
    ``held`` keys' runs continued: one more message per key per round, while the reply has room
    (``max_batch`` messages, ``room_bytes`` bytes left as ``reply`` counts them), so no key's run
    crowds out the others'. The successors that join become the slot's run members. Also returns the
    runs' sizes (None when no successor joined)."""
    queue = slot.queue
    runs = [[head] for head in heads]
    # A head out again after a failed attempt goes alone: its key's later messages wait until it is
    # finished, not sent along again and again with a message that keeps failing.
    growing = [(run, max_per_key) for run in runs if run[0].next is not None and run[0].attempts == 0]
    # A held key's run starts behind the message held (not sent again): one more allowed for it.
    continued = [[job] for job in held if job.queue == queue and may_continue(job)]
    growing += [(run, max_per_key + 1) for run in continued]
    room = max_batch - len(heads)
    if growing:
        room = _grow(growing, queue, room, room_bytes, reply, not heads)
    if len(heads) + room == max_batch:  # no successor joined
        return heads, None
    members = slot.members
    batch: list[UpstreamJob] = []
    sizes: list[int] = []
    for run in runs:
        batch += run
        sizes.append(len(run))
        for member in run[1:]:
            members[member.offset] = member
    for run in continued:
        if len(run) > 1:
            batch += run[1:]
            sizes.append(len(run) - 1)
            for member in run[1:]:
                members[member.offset] = member
    return batch, sizes


def _grow(
    growing: list[tuple[list[UpstreamJob], int]],
    queue: QueueId,
    room: int,
    room_bytes: int,
    reply: ReplySize,
    empty: bool,
) -> int:
    """Append to each run (a key's messages so far, and its size limit) the successors waiting behind
    it, one per key per round while ``room`` (messages) and ``room_bytes`` last; returns the room
    left. Which successor joins, and when the bytes end the growing, is :func:`_walk`'s."""
    size = reply.message
    inline = reply is THRIFT_REPLY  # as in Delivery.take
    if len(growing) == 1:
        # One key grows (QID order, a hot key): one walk down its chain, without the rounds across keys.
        run, limit = growing[0]
        joined = len(run)
        _walk(run, min(room, limit - joined), queue, room_bytes, empty, inline, size)
        return room - (len(run) - joined)
    while room and growing:
        still = []
        for run, limit in growing:
            joined = len(run)
            left = _walk(run, 1, queue, room_bytes, empty, inline, size)
            if len(run) == joined:  # the key's chain has no successor to give
                if left is None:
                    return room
                continue
            room -= 1
            if left is None:
                return room
            room_bytes = left
            empty = False
            if not room:
                break
            if len(run) < limit:
                still.append((run, limit))
        growing = still
    return room


def _walk(
    run: list[UpstreamJob],
    steps: int,
    queue: QueueId,
    room_bytes: int,
    empty: bool,
    inline: bool,
    size: Callable[[StoredMessage], int],
) -> int | None:
    """Append to ``run`` up to ``steps`` successors down its key's chain; returns the bytes of
    ``room_bytes`` left, or None once the bytes end the whole reply's growing.

    A successor joins while it waits in the chain, belongs to the reply's queue and has nothing left to
    run but PullServer (the actions after Order run on a key's head only). The first successor that
    would pass ``room_bytes`` ends the growing (it and the rest wait in their chains), unless the reply
    is still ``empty``: a reply carries at least one message. ``inline`` counts a Thrift reply's bytes
    here, as ``size`` (the reply's own count) would, without a call per message.
    """
    job = run[-1]
    # A chain lives in one consumer's key gate, so its jobs share that owner.
    pull_only = job.consumer.pull_only
    for _ in range(steps):
        successor = job.next
        if successor is None or successor.state is not _WAITING or successor.queue != queue:
            break
        if not pull_only(successor):
            break
        m = successor.message
        if inline and not m.properties:
            needs = len(m.value) + (len(m.key) + len(m.tag)) * UTF8_MAX_BYTES + MESSAGE_OVERHEAD_BYTES
        else:
            needs = size(m)
        if needs > room_bytes and not empty:
            return None
        room_bytes -= needs
        run.append(successor)
        if room_bytes < 0:
            log_alone(successor, needs)
            return None
        job = successor
        empty = False
    return room_bytes


def log_alone(job: UpstreamJob, needs: int) -> None:
    """``job`` goes out alone in its reply: by itself it takes ``needs`` bytes, more than the room its
    topic's ``max_reply_bytes`` leaves. (DDMQ's SDKs refuse frames over 16,384,000 bytes.)"""
    log.warning(
        "group %s: message %s@%d takes %d bytes in a pull reply, more than max_reply_bytes (%d) of its "
        "topic allows: delivered alone",
        job.consumer.group, job.queue, job.offset, needs, job.consumer.config.max_reply_bytes,
    )


def may_continue(held: UpstreamJob) -> bool:
    """Whether a reader holding ``held`` may get the messages behind it: still in flight on its first
    delivery (a message out again after a failed attempt goes alone, as a head does)."""
    return held.state is _IN_FLIGHT and held.attempts == 1 and held.next is not None
