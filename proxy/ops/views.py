"""Read-only snapshots of a running proxy's groups, for the admin endpoints.

Each function walks the engine's state once, in the event loop, and returns plain values; nothing
here changes the engine. Costs are proportional to the unfinished jobs (at most ``concurrency`` per
group and topic), never to throughput.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from ddmq.proxy.engine.end_to_end import Distribution, EndToEnd
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.tenants import TenantView
from ddmq.proxy.groups.group import ConsumerGroup
from ddmq.proxy.ops.families import TOP_TENANTS


@dataclass(frozen=True)
class Quantiles:
    """A distribution's count and its median and 99th percentile, read off its buckets (None when empty)."""

    count: int
    p50: float | None
    p99: float | None


def quantiles(distribution: Distribution) -> Quantiles:
    return Quantiles(distribution.count(), distribution.quantile(0.5), distribution.quantile(0.99))


@dataclass(frozen=True)
class TopicView:
    topic: str
    queues: int
    assigned: list[int]
    held: list[int]
    unfinished: int
    concurrency: int
    ready: int
    in_flight: int
    retry_wait: int
    order_keys: int
    #: Seconds from produce to first delivery (``delivered``) and to ack (``acked``), here since start-up.
    end_to_end: dict[str, Quantiles]
    #: Deliveries per message, of those ``acked`` and ``dead_lettered`` here since start-up.
    attempts: dict[str, Quantiles]
    #: The topic's breaker on this proxy: ``closed``, ``open``, ``half_open``; None without one.
    breaker: str | None
    #: Order keys at their ``key_buffer`` cap with messages left in Redis, and those messages (to be
    #: read again by offset when the key drains), over the queues this proxy reads.
    keys_at_cap: int
    held_in_redis: int
    #: With ``fair_key``: the tenants with the most messages here (in memory, keys held for them in
    #: Redis, weight, share of ``concurrency`` now), most first; None without tenants.
    tenants: list[TenantView] | None


@dataclass(frozen=True)
class GroupView:
    group: str
    parked_pulls: int
    topics: list[TopicView]


@dataclass(frozen=True)
class JobView:
    topic: str
    qid: int
    offset: int
    key: str
    order_key: str | None
    state: str
    attempts: int
    last_error: str


@dataclass(frozen=True)
class BlockedKey:
    topic: str
    order_key: str
    #: Unfinished messages of the key: its head and those waiting behind it.
    chain_length: int
    #: Milliseconds since the head message was produced.
    head_age_ms: int
    head: JobView
    #: What holds the key: ``failing`` (its head failed or timed out at least once: stuck), ``in_flight``
    #: (delivered, awaiting its first answer) or ``waiting`` (read, not delivered yet: mere backlog).
    state: str


#: The values of :attr:`BlockedKey.state`.
KEY_STATES: tuple[str, ...] = ("parked", "failing", "in_flight", "waiting")


def key_state(head: UpstreamJob) -> str:
    # ``attempts`` counts deliveries, so a head delivered before the current one failed or timed out.
    # (``last_error`` is no sign: an action may note one, such as a body that is not JSON, and go on.)
    if head.state is JobState.PARKED:
        return "parked"  # its key stops here until an operator acts (engine/parking.py)
    in_flight = head.state is JobState.IN_FLIGHT
    if head.state is JobState.RETRY_WAIT or head.attempts > (1 if in_flight else 0):
        return "failing"
    return "in_flight" if in_flight else "waiting"


def order_key_text(key: Hashable | None) -> str | None:
    """An order key as operators read it: the string itself, JSON text, or ``qid:<n>``."""
    if key is None or isinstance(key, str):
        return key
    if isinstance(key, tuple) and len(key) == 2 and key[0] in ("json", "qid"):
        return str(key[1]) if key[0] == "json" else f"qid:{key[1]}"
    return repr(key)


def job_view(job: UpstreamJob) -> JobView:
    return JobView(
        topic=job.queue.topic,
        qid=job.qid,
        offset=job.offset,
        key=job.message.key,
        order_key=order_key_text(job.order_key),
        state=job.state.name.lower(),
        attempts=job.attempts,
        last_error=job.last_error,
    )


def group_view(group: ConsumerGroup) -> GroupView:
    states: Counter[tuple[str, JobState]] = Counter((job.queue.topic, job.state) for job in group.buffer.jobs())
    topics = [
        TopicView(
            topic=topic,
            queues=consumer.queues,
            assigned=list(consumer.assigned),
            held=sorted(consumer.held),
            unfinished=consumer.unfinished,
            concurrency=consumer.config.concurrency,
            ready=states[topic, JobState.READY],
            in_flight=states[topic, JobState.IN_FLIGHT],
            retry_wait=states[topic, JobState.RETRY_WAIT],
            order_keys=consumer.blocking_queue.active_keys,
            end_to_end={"delivered": quantiles(figures.delivered), "acked": quantiles(figures.acked)},
            attempts={"acked": quantiles(figures.attempts_acked), "dead_lettered": quantiles(figures.attempts_dead)},
            breaker=group.breakers.state(topic),
            keys_at_cap=len(consumer.jobs.held),
            held_in_redis=sum(consumer.jobs.held.per_queue.values()),
            tenants=consumer.jobs.tenants.views(TOP_TENANTS) if consumer.jobs.tenants is not None else None,
        )
        for topic, consumer in sorted(group.consumers.items())
        for figures in (group.buffer.end_to_end.get(topic) or EndToEnd(),)
    ]
    return GroupView(group.name, group.buffer.parked, topics)


def in_flight(group: ConsumerGroup, topic: str | None, limit: int, offset: int = 0) -> tuple[int, list[JobView]]:
    """The group's in-flight jobs (all of ``topic`` when given): total count, and ``limit`` of them from
    position ``offset`` in order of most attempts (then lowest offset)."""
    jobs = [
        job
        for job in group.buffer.jobs()
        if job.state is JobState.IN_FLIGHT and (topic is None or job.queue.topic == topic)
    ]
    top = heapq.nsmallest(offset + limit, jobs, key=lambda job: (-job.attempts, job.queue, job.offset))
    return len(jobs), [job_view(job) for job in top[offset:]]


def blocked_keys(
    group: ConsumerGroup, topic: str | None, limit: int, offset: int = 0, now_ms: int | None = None,
    states: frozenset[str] | None = None,
) -> tuple[int, list[BlockedKey]]:
    """How many order keys have an unfinished message (whose :func:`key_state` is in ``states``, when
    given), and ``limit`` of them from position ``offset`` in order of their head's age (oldest produce
    time first; then the longest chains)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    heads: list[tuple[int, str, Hashable, UpstreamJob]] = []
    for name, consumer in group.consumers.items():
        if topic is None or name == topic:
            queue = consumer.blocking_queue
            heads.extend((queue.chain_length(key), name, key, head) for key, head in queue.heads()
                         if states is None or key_state(head) in states)
    oldest = heapq.nsmallest(offset + limit, heads, key=lambda item: (item[3].message.produce_ms, -item[0]))
    return len(heads), [
        BlockedKey(
            topic=name,
            order_key=order_key_text(key) or "",
            chain_length=length,
            head_age_ms=max(0, now_ms - head.message.produce_ms) if head.message.produce_ms else 0,
            head=job_view(head),
            state=key_state(head),
        )
        for length, name, key, head in oldest[offset:]
    ]


@dataclass(frozen=True)
class QueueCounts:
    in_flight: int
    ready: int
    retry_wait: int
    #: Keys of this queue at their ``key_buffer`` cap, and the queue's messages they left in Redis.
    keys_at_cap: int
    held_in_redis: int


def queue_counts(group: ConsumerGroup) -> dict[tuple[str, int], QueueCounts]:
    """(topic, qid) -> this proxy's jobs by state and its keys held at their cap, for every queue it reads."""
    states: Counter[tuple[str, int, JobState]] = Counter(
        (job.queue.topic, job.qid, job.state) for job in group.buffer.jobs()
    )
    counts = {}
    for topic, consumer in group.consumers.items():
        held = consumer.jobs.held
        at_cap = Counter(qid for queues in held.keys.values() for qid in queues)
        for qid in consumer.held:
            counts[topic, qid] = QueueCounts(states[topic, qid, JobState.IN_FLIGHT], states[topic, qid, JobState.READY],
                                             states[topic, qid, JobState.RETRY_WAIT], at_cap[qid], held.per_queue[qid])
    return counts

