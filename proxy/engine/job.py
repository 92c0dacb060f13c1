"""UpstreamJob: one message travelling through its group's action chain."""

from __future__ import annotations

from collections.abc import Hashable
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Final, Protocol

from ddmq.proxy.core.types import QueueId, StoredMessage

if TYPE_CHECKING:
    from ddmq.proxy.engine.offsets import OffsetTracker


class JobState(IntEnum):
    NEW = 0  # read, running the actions before Order
    WAITING = 1  # behind an unfinished job with the same order key
    RUNNABLE = 2  # head of its key, queued for the rest of the chain
    READY = 3  # in the PullBuffer, waiting for a pull
    IN_FLIGHT = 4  # handed to a client, waiting for ack/fail/timeout
    RETRY_WAIT = 5  # failed, waiting for its retry interval
    FINISHED = 6  # acked, filtered, or dead-lettered
    PARKED = 7  # its key stopped here (on_exhausted: park, or an operator): see engine/parking.py


_NEW: Final = JobState.NEW  # enum members read through their class are slow; Final: a C static when compiled


#: ``data`` of a job whose body is not valid JSON (set by the Json action).
INVALID_JSON: Final[Any] = object()
#: ``data`` of a job no Json action has parsed.
NOT_PARSED: Final[Any] = object()


class RetrySettings(Protocol):
    """The settings of a job's topic that decide its delivery and redelivery."""

    @property
    def timeout_ms(self) -> int: ...

    @property
    def max_reply_bytes(self) -> int: ...

    @property
    def max_retry(self) -> int: ...

    @property
    def max_retry_after_ms(self) -> int: ...

    @property
    def max_extensions(self) -> int: ...

    @property
    def on_exhausted(self) -> str: ...

    def retry_delay_ms(self, retry: int) -> int: ...


class KeyHolds(Protocol):
    """What the pull buffer and redelivery ask of a consumer's parked keys."""

    def arrived(self, job: UpstreamJob) -> str | None:
        """``job`` reached the pull buffer: ``"parked"`` when its key holds it, a dead-letter reason when
        its key is sequenced, None to make it ready."""
        ...

    def exhausted(self, job: UpstreamJob, reason: str) -> bool:
        """``job`` used up ``max_retry`` under an ``on_exhausted`` other than dead_letter: True when it
        was parked, False to dead-letter it."""
        ...


class JobOwner(Protocol):
    """What the pull buffer, redelivery and push actions may ask of the consumer a job belongs to
    (:class:`~ddmq.proxy.groups.group.TopicConsumer`): nothing deeper, so neither can reach into its chain,
    key gate or readers."""

    @property
    def group(self) -> str: ...

    @property
    def topic(self) -> str: ...

    @property
    def config(self) -> RetrySettings: ...

    def may_serve(self, qid: int) -> bool:
        """Whether messages of queue ``qid`` may be handed out now (its lease confirmed lately)."""
        ...

    def is_head(self, job: UpstreamJob) -> bool:
        """Whether ``job`` is the unfinished head of its order key."""
        ...

    def pull_only(self, job: UpstreamJob) -> bool:
        """Whether all ``job`` has left to run is PullServer (so it may join its head's run)."""
        ...

    async def dead_letter(self, job: UpstreamJob) -> None:
        """Write ``job`` to the group's dead-letter stream (raises DdmqError when Redis fails)."""
        ...

    def finish(self, job: UpstreamJob) -> None:
        """``job`` is done: release its key, mark its offset finished."""
        ...

    @property
    def key_records(self) -> dict[int, Any]:
        """Parked or sequenced keys of the queues read here (empty while there are none): the pull
        buffer asks :attr:`parking` about a job only when this is not empty."""
        ...

    @property
    def parking(self) -> KeyHolds:
        """The consumer's parked and sequenced keys (:mod:`ddmq.proxy.engine.parking`)."""
        ...


class UpstreamJob:
    """A message plus its progress: chain position, order key, attempts, successor in its key chain."""

    __slots__ = (
        "attempts",
        "consumer",
        "data",
        "deadline",
        "extensions",
        "index",
        "last_error",
        "message",
        "next",
        "offset",
        "order_key",
        "qid",
        "queue",
        "state",
        "tracker",
    )

    def __init__(self, consumer: JobOwner, queue: QueueId, message: StoredMessage, tracker: OffsetTracker) -> None:
        self.consumer = consumer
        #: Built once per queue by its reader, not per job: the buffer keys its maps by it.
        self.queue = queue
        self.qid = queue.qid
        self.tracker = tracker
        self.message = message
        self.offset = message.offset  # read several times per job: a slot, not a property
        self.index = 0
        self.state = _NEW
        self.data: Any = NOT_PARSED
        self.order_key: Hashable | None = None
        self.next: UpstreamJob | None = None
        self.attempts = 0
        self.deadline = 0  # timing-wheel tick while in flight
        self.extensions = 0  # extendOffsets taken by the current delivery
        self.last_error = ""

    def __repr__(self) -> str:
        return (
            f"UpstreamJob({self.consumer.group}/{self.consumer.topic}#{self.qid}@{self.offset}, "
            f"key={self.order_key!r}, {self.state.name}, attempts={self.attempts})"
        )
