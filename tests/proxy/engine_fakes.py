"""A job's owner and a clock for unit tests of the pull buffer and redelivery (no Redis, no consumer).

:class:`Owner` plays the :class:`~ddmq.proxy.engine.job.JobOwner` of a consumer whose chain is ``Order,
PullServer``: it keeps the real key gate, and a key's successor released by a finished head goes to the
buffer at once (as the dispatcher and PullServer would do)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from typing import Any

from ddmq.config.schema import TopicGroupConfig
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.core.types import QueueId, StoredMessage
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.engine.ordering import UpstreamJobBlockingQueue
from ddmq.proxy.engine.pull_buffer import PullBuffer


class Clock:
    """Monotonic seconds that move only when told to."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


class Owner:
    group = "g"
    topic = "t"

    def __init__(self, buffer: PullBuffer | None = None, **config: Any) -> None:
        self.config = TopicGroupConfig(**config)
        self.buffer = buffer
        self.keys = UpstreamJobBlockingQueue()
        #: Queues whose lease is not confirmed: nothing of them may be handed out.
        self.unconfirmed: set[int] = set()
        self.finished: list[UpstreamJob] = []
        self.dead_lettered: list[UpstreamJob] = []
        #: How many dead-letter writes fail (as with Redis away) before they succeed.
        self.dead_letter_errors = 0
        self._offsets: defaultdict[int, int] = defaultdict(int)

    def may_serve(self, qid: int) -> bool:
        return qid not in self.unconfirmed

    def is_head(self, job: UpstreamJob) -> bool:
        return self.keys.is_head(job)

    def pull_only(self, job: UpstreamJob) -> bool:
        return True

    #: No parked keys here (tests/system/test_failures.py parks them in a real proxy).
    key_records: dict[int, Any] = {}

    @property
    def parking(self) -> Owner:
        return self

    def arrived(self, job: UpstreamJob) -> str | None:
        return None

    def exhausted(self, job: UpstreamJob, reason: str) -> bool:
        return False

    async def dead_letter(self, job: UpstreamJob) -> None:
        if self.dead_letter_errors:
            self.dead_letter_errors -= 1
            raise BrokerError("redis away")
        self.dead_lettered.append(job)

    def finish(self, job: UpstreamJob) -> None:
        self.finished.append(job)
        successor = self.keys.release(job)
        if successor is not None and successor.state is JobState.RUNNABLE and self.buffer is not None:
            self.buffer.add(successor)

    def job(self, key: Hashable, qid: int = 0, size: int = 0) -> UpstreamJob:
        """The next message of queue ``qid`` (offsets 0, 1, ...; a value of ``size`` bytes), through the
        key gate: a head goes to the buffer, a successor waits behind its key's tail."""
        offset = self._offsets[qid]
        self._offsets[qid] = offset + 1
        message = StoredMessage(offset, b"x" * size, str(key), "", {}, 0)
        job = UpstreamJob(self, QueueId("t", qid), message, OffsetTracker(0))
        job.order_key = key
        if self.keys.put(job) and self.buffer is not None:
            self.buffer.add(job)
        return job
