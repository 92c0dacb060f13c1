"""ChainRun: where a topic's jobs run down its action chain, in the engine.

What a reader reads comes here (:meth:`ChainRun.accept`): each message becomes a job of the topic's
:class:`~ddmq.proxy.engine.topic_jobs.TopicJobs`, waits for room under ``concurrency``, and runs the chain
(:meth:`ChainRun.run`) until an action takes it over: ``Order`` puts it behind its key's unfinished jobs,
``PullServer`` hands it to the pull buffer, a push action to its workers. The key gate's runnable jobs
(a finished head's successor) continue from where they stopped (:meth:`ChainRun.dispatch`).

It is the chain's :class:`~ddmq.actions.base.ChainContext`: the actions see the topic's names, its live
settings, the key gate, the pull buffer, the retry schedule and the counters, and nothing above the
engine; so a message goes reader → chain → buffer without leaving the engine and the actions it runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Hashable
from time import perf_counter
from typing import Final

from ddmq.actions import Action, Status, build_chain
from ddmq.config.schema import TopicGroupConfig
from ddmq.protocol.redis.stream_entry import REPLAY_GROUP
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.core.supervise import Backoff, supervised
from ddmq.proxy.core.types import QueueId, StoredMessage
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.engine.ordering import UpstreamJobBlockingQueue
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.redelivery import Redelivery
from ddmq.proxy.engine.topic_jobs import TopicJobs
from ddmq.proxy.store.offset_reads import read_offsets

log = logging.getLogger(__name__)

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_CONTINUE: Final = Status.CONTINUE
_ASYNC: Final = Status.ASYNC
_FAIL: Final = Status.FAIL
_FINISHED: Final = JobState.FINISHED
_REPLAY_GROUP: Final = REPLAY_GROUP

#: Most held keys read again in one round (one read per queue for all of them): a tenant's share split
#: between many keys comes back a message or two per key, and one round trip per key would cap its
#: throughput at the round trips the resumer makes.
RESUME_KEYS: Final = 256


class ChainRun:
    """The chain of ``jobs``' topic (built from ``actions``) and what runs jobs down it;
    ``tracker_of(qid)`` is the offsets of a queue read now (None once it was dropped)."""

    def __init__(
        self,
        jobs: TopicJobs,
        buffer: PullBuffer,
        actions: list[str],
        tracker_of: Callable[[int], OffsetTracker | None],
    ) -> None:
        self.jobs = jobs
        self.group = jobs.group
        self.topic = jobs.topic
        self.buffer = buffer
        self.redelivery: Redelivery = buffer.redelivery
        self.blocking_queue: UpstreamJobBlockingQueue = jobs.blocking_queue
        self.counters: Counter[str] = jobs.counters
        self._tracker_of = tracker_of
        self.chain: list[Action] = build_chain(actions, self)
        #: The chain's ``act`` methods, bound once (compiled, a lookup and a binding per job otherwise).
        self._acts: list[Callable[[UpstreamJob], Status]] = [action.act for action in self.chain]
        #: One duration observer per action of the chain (set by ProxyMetrics.instrument), or None.
        self.action_timers: list[Callable[[float], None]] | None = None

    @property
    def config(self) -> TopicGroupConfig:
        """The topic's live settings (a reload changes them in place)."""
        return self.jobs.config

    def count(self, what: str, n: int = 1) -> None:
        self.counters[what] += n

    async def accept(self, queue: QueueId, messages: list[StoredMessage]) -> None:
        """Messages read from ``queue``, in order (one read's batch: one call, not one per message)."""
        tracker = self._tracker_of(queue.qid)
        if tracker is None:
            return  # dropped meanwhile: untracked, so the queue's next reader reads them again
        # tracker.track and self.run without local aliases: compiled, an alias is a call through Python
        jobs = self.jobs
        tags = jobs.tags
        counters = jobs.counters
        concurrency = jobs.config.concurrency
        group = self.group
        read = 0
        try:
            for message in messages:
                if jobs.unfinished >= concurrency:
                    # Several readers size their reads before the others' land: hold the rest of this
                    # batch (untracked, so a stop here loses nothing) until there is room again.
                    await jobs.wait_for_room()
                    concurrency = jobs.config.concurrency  # a reload may have changed it meanwhile
                if tracker.track(message.offset):
                    counters["skipped_finished"] += 1  # a previous owner finished it
                    continue
                if tags and message.tag not in tags:
                    tracker.finish(message.offset)
                    counters["filtered"] += 1
                    continue
                properties = message.properties
                if properties and properties.get(_REPLAY_GROUP, group) != group:
                    # Another group's replayed dead letter: this group finished that message long ago,
                    # and delivering it again now would put it after its key's later messages.
                    tracker.finish(message.offset)
                    counters["other_groups_replays"] += 1
                    continue
                jobs.unfinished += 1
                read += 1
                self.run(UpstreamJob(jobs, queue, message, tracker))
        finally:
            counters["read"] += read
            self.buffer.answer_parked()

    def run(self, job: UpstreamJob) -> None:
        """Run ``job`` from its current position in the chain until an action takes it over."""
        acts = self._acts
        timers = self.action_timers
        while job.index < len(acts):
            index = job.index
            job.index = index + 1
            started = perf_counter() if timers is not None else 0.0
            try:
                status = acts[index](job)
            except Exception as exc:
                name = type(self.chain[index]).__name__
                log.exception("action %s failed on %r", name, job)
                job.last_error = f"{name} raised {exc!r}"
                status = _FAIL
            if timers is not None:
                timers[index](perf_counter() - started)
            if status is _CONTINUE:
                continue
            if status is _ASYNC:
                return
            if status is _FAIL:
                self.redelivery.dead_letter(job, job.last_error or "action failed")
                return
            break
        job.state = _FINISHED
        self.jobs.finish(job)

    async def dispatch(self) -> None:
        """Continue the chain of jobs the key gate made runnable (reactivated first), and run the held
        messages of keys that drained (:meth:`resume_held`); runs until cancelled."""
        resumer = asyncio.create_task(supervised("resumer", self.resume_held, f"resumer {self.group}/{self.topic}"))
        try:
            await self._dispatch_runnable()
        finally:
            resumer.cancel()
            await asyncio.gather(resumer, return_exceptions=True)

    async def _dispatch_runnable(self) -> None:
        queue = self.blocking_queue
        jobs = self.jobs
        while True:
            await queue.wait()
            while (job := queue.pop()) is not None:
                if job.tracker.dropped:  # its queue moved away: let its key's successor go on
                    job.state = _FINISHED
                    jobs.finish(job)
                    continue
                self.run(job)

    # held keys ----------------------------------------------------------------------------------

    async def resume_held(self) -> None:
        """Read the held messages of the keys the gate wants again, oldest want first, up to
        :data:`RESUME_KEYS` keys per round (see :mod:`ddmq.proxy.engine.held_keys`); Redis failing is
        retried with backoff. Runs until cancelled."""
        held = self.jobs.held
        backoff = Backoff(0.1, 5.0)
        while True:
            keys = await held.next_wanted(RESUME_KEYS)
            try:
                resumed = await self._resume(keys)
            except BrokerError as exc:
                log.warning("%s/%s: %s; retrying", self.group, self.topic, exc)
                for key in keys:
                    held.want(key)
                await asyncio.sleep(backoff.take())
                continue
            backoff.reset()
            # Still short of its cap with messages held (a refill cut short by filtered or gone ones, or
            # by its tenant's share): no release of the key may come to want it again.
            gate = self.blocking_queue
            for key in resumed:
                if key in held.keys and gate.chain_length(key) <= gate.key_cap // 2:
                    held.want(key)

    async def _resume(self, keys: list[Hashable]) -> list[Hashable]:
        """Run, for each of ``keys``, its oldest held messages down the chain, in order: up to the room
        under its cap (and with tenants its part of its tenant's room), the round's messages one key's
        cap past the window at most; one read per queue for the round. Returns the keys that ran any."""
        jobs, gate, held = self.jobs, self.blocking_queue, self.jobs.held
        cap = gate.key_cap
        # Held keys come before new reads, up to one key's cap past the window, so they never starve.
        while jobs.unfinished >= jobs.config.concurrency + cap:
            await jobs.wait_for_room()
        plans, later = self._plan(keys, jobs.config.concurrency + cap - jobs.unfinished)
        if later:  # no room left in this round: the next one (after a wait for room) takes them
            jobs.count("resume_deferred", len(later))
            for key in later:
                held.want(key)
        by_queue: dict[int, list[int]] = {}
        for _, qid, offsets in plans:
            by_queue.setdefault(qid, []).extend(offsets)
        read: dict[int, tuple[OffsetTracker, dict[int, StoredMessage]]] = {}
        for qid, offsets in by_queue.items():
            tracker = self._tracker_of(qid)
            if tracker is not None:  # else dropped: its held offsets go with it (HeldKeys.forget)
                read[qid] = tracker, await read_offsets(jobs.broker, self.topic, qid, sorted(offsets))
        resumed = []
        try:
            for key, qid, offsets in plans:
                tracker, messages = read.get(qid, (None, {}))
                if tracker is None or self._tracker_of(qid) is not tracker or tracker.dropped \
                        or not held.taken(key, qid, offsets):
                    continue  # dropped while the read was out: the queue's next owner reads them
                self._run_held(key, QueueId(self.topic, qid), tracker, offsets, messages)
                resumed.append(key)
        finally:
            self.buffer.answer_parked()
        return resumed

    def _plan(
        self, keys: list[Hashable], total: int
    ) -> tuple[list[tuple[Hashable, int, list[int]]], list[Hashable]]:
        """Which held offsets of ``keys`` to read now, ``total`` at most: (key, qid, offsets) each; and
        the keys left for a later round once ``total`` is used up (a key whose chain is empty may have
        no release left to want it again)."""
        gate, held, tenants = self.blocking_queue, self.jobs.held, self.blocking_queue.tenants
        budgets: dict[str, int] = {}  # each tenant's room left in this round
        plans: list[tuple[Hashable, int, list[int]]] = []
        for index, key in enumerate(keys):
            if total <= 0:
                return plans, keys[index:]
            room = min(gate.key_cap - gate.chain_length(key), total)
            if tenants is not None:
                tenant = held.tenant_of.get(key, "")
                budget = budgets.get(tenant)
                if budget is None:
                    budget = tenants.room(tenant)
                # A key's part counts what it holds already: its messages behind a head are not ready,
                # and another key's head in their place would be.
                room = min(room, budget, tenants.part(tenant) - gate.chain_length(key))
                budgets[tenant] = budget - max(room, 0)
            if room <= 0:
                continue  # the key (or its tenant) drains first; releasing its jobs wants it again
            oldest = held.oldest(key, room)
            if oldest is not None:
                plans.append((key, *oldest))
                total -= len(oldest[1])
        return plans, []

    def _run_held(self, key: Hashable, queue: QueueId, tracker: OffsetTracker, offsets: list[int],
                  messages: dict[int, StoredMessage]) -> None:
        """Run ``key``'s held ``offsets``, read again as ``messages``, down the chain in order."""
        jobs, gate = self.jobs, self.blocking_queue
        gate.resuming = key
        try:
            for offset in offsets:
                message = messages.get(offset)
                if message is None:  # trimmed meanwhile (retention by age or length): nothing to deliver
                    log.warning("%s/%s#%d: held offset %d is gone from the stream", self.group, self.topic,
                                queue.qid, offset)
                    jobs.count("held_gone")
                    tracker.finish(offset)
                    continue
                jobs.unfinished += 1
                self.run(UpstreamJob(jobs, queue, message, tracker))
        finally:
            gate.resuming = None
        jobs.count("resumed", len(offsets))
