"""UpstreamJob: one message travelling through its group's action chain, as the engine holds it.

The fields the actions read and write are :class:`~ddmq.actions.job.Job`'s (with ``JobState``,
``INVALID_JSON`` and ``NOT_PARSED``, re-exported here for the engine); this class adds what only the
engine uses: the consumer the job belongs to, its queue and offset tracker, its successor in its
key's chain, its delivery deadline and extensions.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol

from ddmq.actions.job import INVALID_JSON as INVALID_JSON
from ddmq.actions.job import NOT_PARSED as NOT_PARSED
from ddmq.actions.job import Job, JobState
from ddmq.proxy.core.types import QueueId, StoredMessage

if TYPE_CHECKING:
    from ddmq.proxy.engine.offsets import OffsetTracker

__all__ = ["INVALID_JSON", "NOT_PARSED", "JobOwner", "JobState", "KeyHolds", "RetrySettings", "UpstreamJob"]

_NEW: Final = JobState.NEW  # enum members read through their class are slow; Final: a C static when compiled


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

    @property
    def fair_weights(self) -> Mapping[str, float]: ...

    def retry_delay_ms(self, retry: int) -> int: ...


class KeyHolds(Protocol):
    """What the pull buffer and redelivery ask of a topic's parked keys."""

    def arrived(self, job: UpstreamJob) -> str | None:
        """``job`` reached the pull buffer: ``"parked"`` when its key holds it, a dead-letter reason when
        its key is sequenced, None to make it ready."""
        ...

    def exhausted(self, job: UpstreamJob, reason: str) -> bool:
        """``job`` used up ``max_retry`` under an ``on_exhausted`` other than dead_letter: True when it
        was parked, False to dead-letter it."""
        ...


class JobOwner(Protocol):
    """What the pull buffer, redelivery and push actions may ask of the owner a job belongs to
    (``job.consumer``), its topic's :class:`~ddmq.proxy.engine.topic_jobs.TopicJobs`: its settings,
    whether a queue may be served, whether a job heads its key, and finishing a job, all in the engine."""

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
        """``job`` is done: release its key's successor, mark its offset finished, let a reader waiting
        for room read."""
        ...

    @property
    def key_records(self) -> dict[int, Any]:
        """Parked or sequenced keys of the queues read here (empty while there are none): the pull
        buffer asks :attr:`parking` about a job only when this is not empty."""
        ...

    @property
    def parking(self) -> KeyHolds:
        """The topic's parked and sequenced keys (:mod:`ddmq.proxy.engine.parking`)."""
        ...


class UpstreamJob(Job):
    """A job as the engine holds it: its consumer, queue and tracker, its successor in its key chain."""

    __slots__ = ("consumer", "deadline", "extensions", "next", "queue", "tracker")

    def __init__(self, owner: JobOwner, queue: QueueId, message: StoredMessage, tracker: OffsetTracker) -> None:
        # Job's fields are set here rather than by Job.__init__: one call less for every message read.
        self.consumer = owner
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
        self.tenant: str | None = None
        self.next: UpstreamJob | None = None
        self.attempts = 0
        self.deadline = 0  # timing-wheel tick while in flight
        self.extensions = 0  # extendOffsets taken by the current delivery
        self.last_error = ""

    def dropped(self) -> bool:
        return self.tracker.dropped

    def finish(self) -> None:
        self.consumer.finish(self)

    def __repr__(self) -> str:
        return (
            f"UpstreamJob({self.consumer.group}/{self.consumer.topic}#{self.qid}@{self.offset}, "
            f"key={self.order_key!r}, {self.state.name}, attempts={self.attempts})"
        )
