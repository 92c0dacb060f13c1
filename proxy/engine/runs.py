"""Ordered runs of the pull buffer: the successors waiting behind a reply's heads in their keys'
chains join the reply, one message per key per round (:func:`_grow`); their *run members* go in
flight but stay in their key's chain, in the buffer's map of their own (``_runs``), until each is its
key's head; a failed or timed-out message sends the rest of its run back to waiting. How the buffer
serves, acks and fails them is :class:`~ddmq.proxy.engine.pull_buffer.PullBuffer`'s; DESIGN.md
("Engine", ordered runs) has the whole story.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from ddmq.protocol.wire.pull_codec import MESSAGE_OVERHEAD_BYTES, UTF8_MAX_BYTES
from ddmq.proxy.core.types import THRIFT_REPLY, PullBatch, QueueId, ReplySize, StoredMessage
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.redelivery import Redelivery

# The buffer's logger: what is logged here is about the replies it serves.
log: Final = logging.getLogger("ddmq.proxy.engine.pull_buffer")

_EMPTY: Final = PullBatch(None, [])

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_IN_FLIGHT: Final = JobState.IN_FLIGHT
_WAITING: Final = JobState.WAITING


class RunBuffer:
    """The run-member half of the pull buffer (its base class): the maps it shares with it, and the
    steps that grow, continue, promote and put back runs."""

    _jobs: dict[QueueId, dict[int, UpstreamJob]]
    _runs: dict[QueueId, dict[int, UpstreamJob]]
    redelivery: Redelivery

    def _deliver(self, batch: list[UpstreamJob], timeout_ms: int | None = None) -> None:
        raise NotImplementedError

    def _continue_runs(
        self,
        topic: str | None,
        max_batch: int,
        timeout_ms: int | None,
        max_per_key: int,
        held: Sequence[UpstreamJob],
        reply: ReplySize,
    ) -> PullBatch:
        """No queue has ready heads: continue the runs of ``held`` keys, in one queue."""
        tried: set[QueueId] = set()
        for job in held:
            queue = job.queue
            if queue in tried or (topic is not None and queue.topic != topic) or not _may_continue(job):
                continue
            tried.add(queue)
            if not job.consumer.may_serve(queue.qid):
                continue
            room = job.consumer.config.max_reply_bytes - reply.overhead
            batch, runs = self._with_runs(queue, [], max_batch, max_per_key, held, room, reply)
            if batch:
                self._deliver(batch, timeout_ms)
                return PullBatch(queue, [job.message for job in batch], runs)
        return _EMPTY

    def _with_runs(
        self,
        queue: QueueId,
        heads: list[UpstreamJob],
        max_batch: int,
        max_per_key: int,
        held: Sequence[UpstreamJob],
        room_bytes: int,
        reply: ReplySize,
    ) -> tuple[list[UpstreamJob], list[int] | None]:
        """``heads`` with their keys' waiting successors behind them, then the ``held`` keys' runs
        continued: one more message per key per round, while the reply has room (``max_batch``
        messages, ``room_bytes`` bytes left as ``reply`` counts them), so no key's run crowds out the
        others'. Also returns the runs' sizes (None when no successor joined)."""
        runs = [[head] for head in heads]
        # A head out again after a failed attempt goes alone: its key's later messages wait until it is
        # finished, not sent along again and again with a message that keeps failing.
        growing = [(run, max_per_key) for run in runs if run[0].next is not None and run[0].attempts == 0]
        # A held key's run starts behind the message held (not sent again): one more allowed for it.
        continued = [[job] for job in held if job.queue == queue and _may_continue(job)]
        growing += [(run, max_per_key + 1) for run in continued]
        room = max_batch - len(heads)
        if growing:
            room = _grow(growing, queue, room, room_bytes, reply, not heads)
        if len(heads) + room == max_batch:  # no successor joined
            return heads, None
        members = self._runs.get(queue)
        if members is None:
            members = self._runs[queue] = {}
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

    def _run_head(self, queue: QueueId, offset: int) -> UpstreamJob | None:
        """The run member at ``offset`` when it is its key's head now (moved to the heads), else None."""
        members = self._runs[queue]
        job = members.get(offset)
        if job is None or not job.consumer.is_head(job):
            return None
        self._promote(job)
        return job

    def _promote(self, job: UpstreamJob) -> None:
        """Run member ``job`` became its key's head: keep it with the heads from now on."""
        queue = job.queue
        members = self._runs[queue]
        del members[job.offset]
        if not members:
            del self._runs[queue]
        jobs = self._jobs.get(queue)
        if jobs is None:
            jobs = self._jobs[queue] = {}
        jobs[job.offset] = job

    def _return_run(self, job: UpstreamJob) -> None:
        """``job`` failed or timed out: the rest of its run, still in flight, waits again in its key's
        chain (attempts not counted) and goes out once ``job`` is finished."""
        successor = job.next
        if successor is not None and successor.state is _IN_FLIGHT:
            self._put_back(successor)

    def _put_back(self, member: UpstreamJob) -> None:
        """Run member ``member`` and the in-flight members behind it wait in their key's chain again."""
        members = self._runs[member.queue]
        job: UpstreamJob | None = member
        while job is not None and job.state is _IN_FLIGHT:
            self.redelivery.unwatch(job)
            job.state = _WAITING
            job.attempts -= 1
            del members[job.offset]
            job = job.next
        if not members:
            del self._runs[member.queue]


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
    inline = reply is THRIFT_REPLY  # as in PullBuffer._take
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
            _log_alone(successor, needs)
            return None
        job = successor
        empty = False
    return room_bytes


def _log_alone(job: UpstreamJob, needs: int) -> None:
    """``job`` goes out alone in its reply: by itself it takes ``needs`` bytes, more than the room its
    topic's ``max_reply_bytes`` leaves. (DDMQ's SDKs refuse frames over 16,384,000 bytes.)"""
    log.warning(
        "group %s: message %s@%d takes %d bytes in a pull reply, more than max_reply_bytes (%d) of its "
        "topic allows: delivered alone",
        job.consumer.group, job.queue, job.offset, needs, job.consumer.config.max_reply_bytes,
    )


def _may_continue(held: UpstreamJob) -> bool:
    """Whether a reader holding ``held`` may get the messages behind it: still in flight on its first
    delivery (a message out again after a failed attempt goes alone, as a head does)."""
    return held.state is _IN_FLIGHT and held.attempts == 1 and held.next is not None
