"""Redelivery: what happens to a group's messages after a failed or unanswered attempt.

One :class:`Redelivery` per consumer group, beside its pull buffer, holds:

- a *timing wheel* of the deadlines of jobs in flight: buckets of ``TICK_S``, filled when a batch
  goes out and emptied by acks and fails, so the wheel holds only what is in flight, whatever the
  throughput. One timer task (not a handle per message) expires the buckets that are due;
- the *retry schedule*: a heap of failed jobs by the time their next attempt is due
  (``retry_intervals_ms``). A due job is made ready again for pulls, or handed back to the push
  action of its topic (:meth:`route_retries`);
- the *dead-letter writer*: after ``max_retry`` retries a job is written to the group's dead-letter
  stream, retrying while Redis fails, and then finished.

A failed attempt has one path whoever reports it: a pull client's fail or timeout (through the pull
buffer) or a push action's failed push (:meth:`retry_later`). Through all of it the job stays the
head of its order key, so its key's order holds.

While a pulled topic is *held* (:meth:`hold`: an operator's pause, or its breaker open or half-open)
its failed attempts count nothing: a fail, or a deadline that runs out, sends the job back to wait,
ready, as its key's head, to go out again after the hold, its attempt uncounted. Its acks still count.
A topic's :class:`~ddmq.proxy.engine.breaker.Breaker`, if it has one (:attr:`Redelivery.breakers`),
is told of every failed attempt before it is judged, so the failure that opens it is not counted either.

What expiry means for a job (its run, its stats) is the buffer's business: it is told through the
``expired`` callback, which may answer that a job waits behind its run's head (it is then timed again
for the next tick, and the head, due with it, normally returns it). Time comes from ``clock`` (monotonic
seconds), so all of this runs with a fake clock in tests.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.types import QueueId
from ddmq.proxy.engine.breaker import Breaker
from ddmq.proxy.engine.job import JobState, UpstreamJob

log: Final = logging.getLogger(__name__)

TICK_S: Final = 0.02

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_IN_FLIGHT: Final = JobState.IN_FLIGHT
_RETRY_WAIT: Final = JobState.RETRY_WAIT
_FINISHED: Final = JobState.FINISHED


@dataclass
class BufferStats:
    """Counts of what happened to a queue's messages (monotonic: exported as Prometheus counters)."""

    delivered: int = 0
    acked: int = 0
    failed: int = 0
    timed_out: int = 0
    retried: int = 0
    dead_lettered: int = 0
    unknown_acks: int = 0
    unknown_fails: int = 0
    late_acks: int = 0
    released: int = 0
    extended: int = 0
    ignored_verbs: int = 0


class Redelivery:
    """Deadlines of jobs in flight, the retry schedule and dead-letter writes of one group.

    ``expired(job)``: a job in flight passed its deadline; answers False when it is to wait one more tick.
    ``ready(job)``: a pulled job's retry is due. ``finish(job)``: a job was dead-lettered."""

    def __init__(
        self,
        group: str,
        stats: defaultdict[QueueId, BufferStats],
        expired: Callable[[UpstreamJob], bool],
        ready: Callable[[UpstreamJob], None],
        finish: Callable[[UpstreamJob], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group = group
        self._stats = stats
        self._expired = expired
        self._ready = ready
        self._finish = finish
        self._clock = clock
        self._wheel: dict[int, set[UpstreamJob]] = {}  # tick number -> jobs in flight due then
        self._cursor = int(clock() / TICK_S)  # the first tick not expired yet
        self._retries: list[tuple[float, int, UpstreamJob]] = []
        self._seq = itertools.count()
        self._requeue: dict[str, Callable[[UpstreamJob], None]] = {}  # topic -> its push action
        self._timer: asyncio.Task[None] | None = None
        #: Set while the wheel or the retry schedule may hold something: the timer sleeps on it when
        #: neither does, so an idle group costs no wake-ups (50 a second otherwise).
        self._pending = asyncio.Event()
        self._dead_letter_tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        #: What :meth:`hold` holds: every topic, or these.
        self._held_all = False
        self._held: frozenset[str] = frozenset()
        #: topic -> its breaker (topics with ``breaker.enabled``), told of every failed pulled attempt.
        self.breakers: dict[str, Breaker] = {}

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._timer is not None:
            raise RuntimeError("redelivery timer already started")
        self._cursor = int(self._clock() / TICK_S)
        self._timer = asyncio.create_task(self._run_timer(), name=f"pull-buffer-timers:{self.group}")

    async def close(self) -> None:
        """Stop the timer, wait for dead-letter writes under way (they give up soon once closed)."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            await asyncio.gather(self._timer, return_exceptions=True)
        if self._dead_letter_tasks:
            await asyncio.gather(*self._dead_letter_tasks, return_exceptions=True)

    async def _run_timer(self) -> None:
        while True:
            if not self._wheel and not self._retries:
                self._pending.clear()
                await self._pending.wait()
                # Nothing was due while idle: start at the earliest tick there is, not at every tick since.
                self._cursor = max(self._cursor, min([int(self._clock() / TICK_S), *self._wheel]))
            await asyncio.sleep(TICK_S)
            try:
                self.expire(self._clock())
            except Exception:  # a bug here must not stop redelivery forever
                log.exception("pull buffer timer failed for group %s", self.group)

    # deadlines ---------------------------------------------------------------------------------

    def watch(self, jobs: Iterable[UpstreamJob], timeout_ms: int) -> None:
        """``jobs`` went out now: each is due back within ``timeout_ms`` unless acked or failed first."""
        tick = max(math.ceil((self._clock() + timeout_ms / 1000) / TICK_S), self._cursor)
        self._pending.set()
        slot = self._wheel.get(tick)
        if slot is None:
            slot = self._wheel[tick] = set()
        for job in jobs:
            job.deadline = tick
            slot.add(job)

    def unwatch(self, job: UpstreamJob) -> None:
        """``job`` leaves the in-flight state: take it off the wheel."""
        slot = self._wheel.get(job.deadline)
        if slot is not None:
            slot.discard(job)
            if not slot:
                # A set never shrinks as it empties: dropped here, its table does not sit in memory until
                # the tick passes (timeout_ms later), which would grow RSS with throughput x timeout_ms.
                del self._wheel[job.deadline]

    def _watch_at(self, job: UpstreamJob, tick: int) -> None:
        slot = self._wheel.get(tick)
        if slot is None:
            slot = self._wheel[tick] = set()
        job.deadline = tick
        slot.add(job)

    def expire(self, now: float) -> None:
        """Expire the deadlines due by ``now``, then make the retries due by ``now`` ready."""
        current = int(now / TICK_S)
        wheel = self._wheel
        for tick in range(self._cursor, current + 1):
            slot = wheel.pop(tick, None)
            if not slot:
                continue
            behind: list[UpstreamJob] = []
            for job in slot:
                if job.state is _IN_FLIGHT and not self._expired(job):
                    behind.append(job)
            for job in behind:
                if job.state is _IN_FLIGHT:  # not returned by its head: must not stay in flight untimed
                    self._watch_at(job, current + 1)
        self._cursor = current + 1
        retries = self._retries
        while retries and retries[0][0] <= now:
            _, _, job = heapq.heappop(retries)
            if job.state is _RETRY_WAIT:
                self._stats[job.queue].retried += 1
                requeue = self._requeue.get(job.queue.topic)
                if requeue is None:
                    self._ready(job)
                else:
                    requeue(job)

    # holds -------------------------------------------------------------------------------------

    def hold(self, everything: bool, topics: frozenset[str]) -> None:
        """From now on failed attempts of pulled jobs of every topic (``everything``), or of ``topics``,
        count nothing: each job waits again, ready (its topic hands out nothing meanwhile)."""
        self._held_all, self._held = everything, topics

    def holds(self, topic: str) -> bool:
        """Whether a failed attempt of pulled ``topic`` counts nothing now."""
        return (self._held_all or topic in self._held) and topic not in self._requeue

    # retries -----------------------------------------------------------------------------------

    def route_retries(self, topic: str, requeue: Callable[[UpstreamJob], None]) -> None:
        """Jobs of ``topic`` are pushed, not pulled: when a retry is due, hand the job to ``requeue``."""
        self._requeue[topic] = requeue

    def retry_later(self, job: UpstreamJob, reason: str) -> None:
        """A push attempt of ``job`` failed: retry on schedule, or dead-letter after the last retry."""
        self._stats[job.queue].failed += 1
        self.failed_attempt(job, reason)

    def failed_attempt(self, job: UpstreamJob, reason: str, retry_after_ms: int | None = None) -> None:
        """``job``'s attempt failed (its caller counted it): schedule its next one (``retry_after_ms``
        from now when the client asked, within the topic's ``max_retry_after_ms``), or dead-letter it
        when ``max_retry`` retries are used up. While its topic is held (:meth:`hold`) it waits again,
        ready, its attempt uncounted."""
        job.last_error = reason
        if self.breakers or self._held_all or self._held:
            topic = job.queue.topic
            breaker = self.breakers.get(topic)
            if breaker is not None and topic not in self._requeue:
                breaker.failed(reason)  # may open it, and so hold this very job
            if self.holds(topic):
                job.attempts -= 1
                self._ready(job)
                return
        config = job.consumer.config
        if job.attempts > config.max_retry:
            if config.on_exhausted != "dead_letter" and job.consumer.parking.exhausted(job, reason):
                return
            self.dead_letter(job, reason)
            return
        job.state = _RETRY_WAIT
        if retry_after_ms is None:
            delay_ms = config.retry_delay_ms(job.attempts)
        else:
            delay_ms = min(max(retry_after_ms, 0), config.max_retry_after_ms)
        due = self._clock() + delay_ms / 1000
        heapq.heappush(self._retries, (due, next(self._seq), job))
        self._pending.set()

    # dead letters ------------------------------------------------------------------------------

    def dead_letter(self, job: UpstreamJob, reason: str) -> None:
        """Write ``job`` to the dead-letter stream, then finish it (its key's successor runs next)."""
        job.last_error = reason
        job.state = _RETRY_WAIT  # neither ready nor in flight while the write is under way
        task = asyncio.create_task(self._dead_letter(job), name=f"dead-letter:{job.queue}@{job.offset}")
        self._dead_letter_tasks.add(task)
        task.add_done_callback(self._dead_letter_tasks.discard)

    async def _dead_letter(self, job: UpstreamJob) -> None:
        delay = 0.1
        while True:
            if job.state is _FINISHED:  # acked late while we were trying
                return
            if self.closed and delay > 1:
                return  # shutting down with Redis away: unfinished, so redelivered after restart
            try:
                await job.consumer.dead_letter(job)
                break
            except DdmqError as exc:
                # Not finishing keeps the offset uncommitted: nothing is lost if we never succeed.
                log.warning("dead-letter write for %r failed (%s); retrying in %.1fs", job, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        if not _finished(job):  # an ack may have come in during the write
            self._stats[job.queue].dead_lettered += 1
            log.info("dead-lettered %r after %d attempts: %s", job, job.attempts, job.last_error)
            self._finish(job)

    # views -------------------------------------------------------------------------------------

    @property
    def timed(self) -> int:
        """Jobs on the timing wheel: equals in-flight jobs, however many were delivered before."""
        return sum(len(slot) for slot in self._wheel.values())

    @property
    def wheel_ticks(self) -> int:
        """Ticks of the timing wheel holding jobs (a tick whose jobs were all acked is dropped)."""
        return len(self._wheel)

    @property
    def scheduled(self) -> int:
        """Entries in the retry schedule (a job finished meanwhile leaves its entry until it is due)."""
        return len(self._retries)


def _finished(job: UpstreamJob) -> bool:
    # A function, so mypy does not narrow job.state across the await above.
    return job.state is _FINISHED
