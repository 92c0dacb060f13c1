"""Lag in messages and in time, read from Redis, and the proxy's own short history of it.

Lag in messages is what a group has not finished yet: the next produce offset minus the first
unfinished offset (the committed offset, or a held queue's live commit point). Lag in time is the
age of the oldest unfinished message: now minus the produce time (``ts``) of the entry at the first
unfinished offset. A queue whose stream has nothing there (caught up, or trimmed) has no time lag.

:class:`LagHistory` samples every group and topic this proxy serves, for every queue of the topic
whoever owns it, every ``interval_s`` into a bounded deque per series, so the console can draw the
last hour without a Prometheus server. Memory is ``points`` samples per (group, topic). Each sample
also goes to a capped Redis stream per (group, topic) (``ddmq:lag:{<g>:<t>}``, ``points`` entries),
read back when the series starts here: the history survives a restart and is shared by the group's
proxies (one sample per interval between them).

>>> times = await produce_times(redis, "rides", {0: 41, 3: 7})      # {0: 1763776220123, 3: ...}
>>> history = LagHistory(registry, interval_s=5, points=720)
>>> await history.sample()
>>> history.series("cg_rides")                                    # {"rides": [LagSample, ...]}
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final, NamedTuple

from redis.exceptions import ResponseError

from ddmq.protocol import keys
from ddmq.protocol.connection import AsyncRedis
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.store.broker import get_many, map_redis_errors

if TYPE_CHECKING:
    from ddmq.proxy.groups.registry import GroupRegistry

log = logging.getLogger(__name__)

#: One sample every 5 s for an hour.
SAMPLE_INTERVAL_S: Final = 5.0
SAMPLE_POINTS: Final = 720
#: The fields of a lag-history stream entry (its id holds the sample's time).
_FIELDS: Final = ("m", "a", "p", "c")


def now_ms() -> int:
    return int(time.time() * 1000)


async def produce_times(redis: AsyncRedis, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
    """qid -> produce time (ms) of the entry at ``offsets[qid]``, or of the first one after it when
    that offset is gone; qids whose stream has nothing from there are left out."""
    times = await produce_times_at(redis, [(topic, qid, offset) for qid, offset in offsets.items()])
    return {qid: ms for (_, qid, _), ms in times.items()}


Position = tuple[str, int, int]


async def produce_times_at(redis: AsyncRedis, positions: Iterable[Position]) -> dict[Position, int]:
    """Position (topic, qid, offset) -> produce time (ms) of the entry at that offset of the queue's stream, or
    of the first one after it when that offset is gone; positions with nothing from there are left
    out. One pipeline for them all (one round trip; on a cluster, one per master)."""
    wanted = sorted(set(positions))
    if not wanted:
        return {}
    with map_redis_errors(f"reading produce times of {len(wanted)} queues"):
        async with redis.pipeline(transaction=False) as pipe:
            for topic, qid, offset in wanted:
                pipe.xrange(keys.stream(topic, qid), f"0-{offset}", "+", count=1)
            replies = await pipe.execute()
    times: dict[Position, int] = {}
    for position, entries in zip(wanted, replies, strict=True):
        if entries:
            raw = entries[0][1].get(b"ts")
            if raw is not None and raw.isdigit():
                times[position] = int(raw)
    return times


class QueueLag(NamedTuple):
    qid: int
    #: First unfinished offset as committed in Redis (1 when the group never committed here).
    committed: int
    produced: int
    lag: int
    #: Produce time of the message at ``committed`` when lag > 0, else None.
    oldest_ms: int | None


async def topic_lag(redis: AsyncRedis, group: str, topic: str, queues: int) -> list[QueueLag]:
    """Every queue of ``topic`` for ``group``, from committed offsets (two round trips; on a cluster, two
    rounds of one per master)."""
    with map_redis_errors(f"reading the lag of {group}/{topic}"):
        raws = await get_many(
            redis,
            [keys.committed(group, topic, qid) for qid in range(queues)]
            + [keys.sequence(topic, qid) for qid in range(queues)],
        )
    committed_raw, sequence_raw = raws[:queues], raws[queues:]
    committed = [int(raw) if raw is not None else 1 for raw in committed_raw]
    produced = [int(raw) + 1 if raw is not None else 1 for raw in sequence_raw]
    behind = {qid: committed[qid] for qid in range(queues) if produced[qid] > committed[qid]}
    oldest = await produce_times(redis, topic, behind)
    return [
        QueueLag(qid, committed[qid], produced[qid], max(0, produced[qid] - committed[qid]), oldest.get(qid))
        for qid in range(queues)
    ]


class LagSample(NamedTuple):
    at_ms: int
    #: Unfinished messages over the topic's queues.
    messages: int
    #: Age of the oldest unfinished message over the topic's queues (0 when none).
    age_ms: int
    #: Messages ever produced into the topic, and consumed by the group (committed), at ``at_ms``:
    #: two samples give the rates in and out.
    produced: int = 0
    consumed: int = 0


def rates(samples: list[LagSample], window_ms: int = 60_000) -> tuple[float, float] | None:
    """Messages per second produced and consumed, from the last sample and the oldest one at most
    ``window_ms`` before it; None with fewer than two samples in that window."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    first = next((s for s in samples if last.at_ms - s.at_ms <= window_ms), last)
    seconds = (last.at_ms - first.at_ms) / 1000
    if seconds <= 0:
        return None
    return (max(0, last.produced - first.produced) / seconds, max(0, last.consumed - first.consumed) / seconds)


class LagHistory:
    """The last ``points`` lag samples per (group, topic); :meth:`run` samples every ``interval_s``."""

    def __init__(
        self, registry: GroupRegistry, interval_s: float = SAMPLE_INTERVAL_S, points: int = SAMPLE_POINTS
    ) -> None:
        self._registry = registry
        self.interval_s = interval_s
        self.points = points
        self._series: dict[tuple[str, str], deque[LagSample]] = {}

    async def run(self) -> None:
        """Sample until cancelled; a failed sample is logged and the next one tried on time."""
        while True:
            try:
                await self.sample()
            except DdmqError as exc:
                log.warning("lag history: sample skipped: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def sample(self) -> None:
        registry = self._registry
        if registry.redis is None:
            return
        at = now_ms()
        current: set[tuple[str, str]] = set()
        for group_name, group in list(registry.groups.items()):
            for topic, consumer in list(group.consumers.items()):
                if not consumer.queues:
                    continue
                rows = await topic_lag(registry.redis, group_name, topic, consumer.queues)
                ages = [at - row.oldest_ms for row in rows if row.oldest_ms is not None]
                sample = LagSample(at, sum(row.lag for row in rows), max(0, max(ages, default=0)),
                                   sum(row.produced - 1 for row in rows), sum(row.committed - 1 for row in rows))
                series = self._series.get((group_name, topic))
                if series is None:
                    series = self._series[group_name, topic] = deque(
                        await self._stored(group_name, topic), maxlen=self.points)
                series.append(sample)
                await self._store(group_name, topic, sample)
                current.add((group_name, topic))
        # A group or topic removed by a reload stops taking memory.
        for gone in self._series.keys() - current:
            del self._series[gone]

    async def _stored(self, group: str, topic: str) -> list[LagSample]:
        """The samples kept in Redis (by this proxy before a restart, or by another proxy of the
        group), oldest first: the console's chart survives a restart."""
        assert self._registry.redis is not None
        with map_redis_errors(f"reading the lag history of {group}/{topic}"):
            entries = await self._registry.redis.xrevrange(keys.lag_history(group, topic), "+", "-", count=self.points)
        samples = []
        for entry_id, fields in reversed(entries):
            try:
                values = (int(fields[name.encode()]) for name in _FIELDS)
                samples.append(LagSample(int(entry_id.split(b"-")[0]), *values))
            except (KeyError, ValueError):
                continue  # not written by a proxy: skipped
        return samples

    async def _store(self, group: str, topic: str, sample: LagSample) -> None:
        """Append ``sample`` to the stream of (group, topic), capped at ``points`` entries. Its id is
        the start of its interval, so the proxies of a group write one sample per interval between
        them: a second one in the same interval is refused by Redis (an id not above the last) and
        dropped here."""
        assert self._registry.redis is not None
        interval_ms = max(1, int(self.interval_s * 1000))
        entry_id = f"{sample.at_ms - sample.at_ms % interval_ms}-0"
        fields = dict(zip(_FIELDS, sample[1:], strict=True))
        with map_redis_errors(f"writing the lag history of {group}/{topic}"):
            try:
                await self._registry.redis.xadd(keys.lag_history(group, topic), fields,
                                               id=entry_id, maxlen=self.points, approximate=False)
            except ResponseError as exc:
                if "equal or smaller" not in str(exc):
                    raise
                # another proxy of the group (or this one, sampling again) took this interval's sample

    def series(self, group: str) -> dict[str, list[LagSample]]:
        """topic -> samples, oldest first."""
        return {topic: list(samples) for (name, topic), samples in sorted(self._series.items()) if name == group}
