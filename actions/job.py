"""The job the chain runs on: one message and what the actions read and write of it on its way.

An action gets a :class:`Job` and may use what is here: the message, its queue and offset, the body
parsed by ``Json`` (``data``), the order key ``Order`` gives it, its attempts, its last error and its
state. The engine's job (:class:`~ddmq.proxy.engine.job.UpstreamJob`) extends it with what only the
engine uses (the consumer it belongs to, its queue's offset tracker, its successor in its key's chain,
its delivery deadline), so the actions' contract needs nothing of the proxy.

Compiled with the engine (``protocol/native.py``): the engine's job is a native class, and a native
class can extend only a native one; the chain reads these fields for every message.
"""

from __future__ import annotations

from collections.abc import Hashable
from enum import IntEnum
from typing import Any, Final

from ddmq.protocol.redis.stream_entry import StoredMessage

__all__ = ["INVALID_JSON", "NOT_PARSED", "Job", "JobState"]


class JobState(IntEnum):
    NEW = 0  # read, running the actions before Order
    WAITING = 1  # behind an unfinished job with the same order key
    RUNNABLE = 2  # head of its key, queued for the rest of the chain
    READY = 3  # in the PullBuffer (or a push action's queue), waiting to be handed out
    IN_FLIGHT = 4  # handed to a client or an upstream, waiting for ack/fail/timeout
    RETRY_WAIT = 5  # failed, waiting for its retry interval
    FINISHED = 6  # acked, filtered, or dead-lettered
    PARKED = 7  # its key stopped here (on_exhausted: park, or an operator): see proxy/engine/parking.py


_NEW: Final = JobState.NEW  # enum members read through their class are slow; Final: a C static when compiled


#: ``data`` of a job whose body is not valid JSON (set by the Json action).
INVALID_JSON: Final[Any] = object()
#: ``data`` of a job no Json action has parsed.
NOT_PARSED: Final[Any] = object()


class Job:
    """A message plus its progress through the chain (``index``: the next action to run)."""

    __slots__ = ("attempts", "data", "index", "last_error", "message", "offset", "order_key", "qid", "state", "tenant")

    def __init__(self, qid: int, message: StoredMessage) -> None:
        self.qid = qid
        self.message = message
        self.offset = message.offset  # read several times per job: a slot, not a property
        self.index = 0
        self.state = _NEW
        self.data: Any = NOT_PARSED
        self.order_key: Hashable | None = None
        #: The tenant ``Order`` names with ``fair_key`` (None without tenants).
        self.tenant: str | None = None
        self.attempts = 0
        self.last_error = ""

    # What an action may ask of the consumer the job belongs to, which only the engine's job knows.

    def dropped(self) -> bool:
        """Whether the job's queue left this proxy (another proxy reads it now, and delivers the job
        again): an action holding the job finishes it instead of working on it."""
        return False

    def finish(self) -> None:
        """The job is done (pushed, or let go): its key's successor may run, its offset be committed."""
        raise NotImplementedError("only a job of the engine belongs to a consumer")

    def __repr__(self) -> str:
        return f"Job(#{self.qid}@{self.offset}, key={self.order_key!r}, {self.state.name}, attempts={self.attempts})"
