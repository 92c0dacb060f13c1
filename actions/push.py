"""The common part of push actions (``AsyncHttp``, ``Redis``): a bounded worker pool per group/topic.

A push action ends the chain. ``act()`` only appends the job to the action's ready queue and answers
``ASYNC``; a fixed number of worker tasks (``max_in_flight``) take jobs from it, push them, and report
the outcome:

- success: the job is finished (its key's successor becomes runnable, its offset committable);
- a failed attempt (non-2xx, timeout, connection error): ``Redelivery.retry_later``, the same code a
  pull client's fail goes through: retried after ``retry_intervals_ms``, dead-lettered after
  ``max_retry`` retries. When the retry is due the group's redelivery hands the job back here;
- a permanent failure (the message cannot be turned into a request, e.g. a Redis key part missing):
  dead-lettered at once, like an action answering ``FAIL``.

Per-key order holds as in a pull group: only key heads leave the blocking queue, and a head stays
unfinished (in flight, waiting for a retry, being dead-lettered) until one of the outcomes above.
Nothing grows with a slow upstream but the ready queue, and that is bounded by ``concurrency``: the
readers stop reading when that many jobs are unfinished. There is no task per message.

An operator's pause of the topic (``ddmq groups pause``) holds the workers before they push: each holds
the job it took, the rest wait in the ready queue, nothing is pushed and so no attempt is counted; a
push under way when the pause came finishes as usual. They go on when the pause lifts.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import NamedTuple

from ddmq.actions.base import ChainContext, Status
from ddmq.actions.job import Job, JobState

log = logging.getLogger(__name__)


class Failure(NamedTuple):
    """Why one push attempt failed; ``permanent`` failures skip the retries."""

    reason: str
    permanent: bool = False


#: The outcome of one job's attempt: None = success.
Outcome = Failure | None


class PushAction(ABC):
    """Base of push actions: subclasses implement :meth:`push` (and may open clients in :meth:`open`)."""

    #: Used in task names and log lines.
    name = "push"

    def __init__(self, ctx: ChainContext, workers: int, batch_size: int = 1) -> None:
        self._ctx = ctx
        self._redelivery = ctx.redelivery
        self._workers_wanted = max(1, min(workers, ctx.config.concurrency))
        self._batch_size = batch_size
        self._ready: asyncio.Queue[Job] = asyncio.Queue()
        self._workers: list[asyncio.Task[None]] = []
        self._busy = 0
        self._held = 0
        ctx.redelivery.route_retries(ctx.topic, self._enqueue)

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._workers:
            raise RuntimeError(f"{self.name} action of {self._ctx.group}/{self._ctx.topic} already started")
        self.open()
        label = f"{self.name}:{self._ctx.group}/{self._ctx.topic}"
        self._workers = [asyncio.create_task(self._work(), name=f"{label}#{i}") for i in range(self._workers_wanted)]

    async def close(self) -> None:
        """Stop the workers; jobs not pushed yet (or cut off mid-push) stay unfinished, hence uncommitted,
        and are delivered again by the queue's next reader."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        await self.aclose()

    def open(self) -> None:  # noqa: B027  (optional hook)
        """Create clients (the event loop is running)."""

    async def aclose(self) -> None:  # noqa: B027  (optional hook)
        """Close clients."""

    # the contract ------------------------------------------------------------------------------

    @abstractmethod
    async def push(self, jobs: list[Job]) -> list[Outcome]:
        """Push ``jobs`` (at most ``batch_size``, each the head of its key); one outcome per job.

        Errors of the upstream must come back as :class:`Failure`; an exception here is a bug and
        counts as a failed attempt of every job of the batch.
        """

    def act(self, job: Job) -> Status:
        self._enqueue(job)
        return Status.ASYNC

    # workers -----------------------------------------------------------------------------------

    def _enqueue(self, job: Job) -> None:
        job.state = JobState.READY
        self._ready.put_nowait(job)

    @property
    def waiting(self) -> int:
        """Jobs ready to push, not taken by a worker yet."""
        return self._ready.qsize()

    @property
    def held(self) -> int:
        """Workers holding a job while an operator's pause holds the topic."""
        return self._held

    @property
    def in_flight(self) -> int:
        """Workers pushing right now (at most ``max_in_flight``)."""
        return self._busy

    def _take_batch(self, first: Job) -> list[Job]:
        batch: list[Job] = []
        job: Job | None = first
        while job is not None:
            if job.dropped():  # its queue moved to another proxy, which delivers it again
                self._finish(job)
            else:
                batch.append(job)
            job = None
            if len(batch) < self._batch_size and not self._ready.empty():
                job = self._ready.get_nowait()
        return batch

    async def _work(self) -> None:
        ctx = self._ctx
        hold_of = ctx.buffer.push_hold
        while True:
            first = await self._ready.get()
            while (hold := hold_of(ctx.topic)) is not None:
                # Paused by an operator: the job waits here as its key's head, not pushed, no attempt
                # counted, until the pause lifts (its queue may have moved meanwhile: _take_batch sees it).
                self._held += 1
                try:
                    await hold.wait()
                finally:
                    self._held -= 1
            batch = self._take_batch(first)
            if not batch:
                continue
            for job in batch:
                job.state = JobState.IN_FLIGHT
                job.attempts += 1
            self._busy += 1
            try:
                outcomes = await self.push(batch)
            except Exception as exc:
                log.exception("%s action failed on %d job(s) of %s/%s", self.name, len(batch), ctx.group, ctx.topic)
                outcomes = [Failure(f"{self.name} raised {exc!r}")] * len(batch)
            finally:
                self._busy -= 1
            for job, outcome in zip(batch, outcomes, strict=True):
                self._settle(job, outcome)

    def _settle(self, job: Job, outcome: Outcome) -> None:
        if outcome is None:
            self._ctx.count("pushed")
            self._finish(job)
        elif outcome.permanent:
            self._ctx.count("push_rejected")
            log.info("%r cannot be pushed (%s); dead-lettering it", job, outcome.reason)
            self._redelivery.dead_letter(job, outcome.reason)
        else:
            self._ctx.count("push_failed")
            log.debug("push of %r failed: %s", job, outcome.reason)
            self._redelivery.retry_later(job, outcome.reason)

    @staticmethod
    def _finish(job: Job) -> None:
        job.state = JobState.FINISHED
        job.finish()
