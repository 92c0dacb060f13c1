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
proxies (one sample per interval between them); a sample equal to the last one stored is left out
for up to a minute. A sample also counts the (group, topic)'s dead letters. All series are read in
three round trips per sample, whatever their number.

What only a proxy knows, its keys by state and its end-to-end latency (produce to ack, p50 and p99 of
the messages acked here since its previous sample), goes into :class:`LocalSample` series, kept the same
way in one capped stream per (group, topic) (``ddmq:lagl:{<g>:<t>}``, each entry naming its proxy),
from which a proxy reads back its own entries when it starts.

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

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import AsyncRedis
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.engine.end_to_end import Distribution
from ddmq.proxy.engine.parking import KEY_STATES
from ddmq.proxy.store.broker import get_many

if TYPE_CHECKING:
    from ddmq.proxy.groups.registry import GroupRegistry

log = logging.getLogger(__name__)

#: One sample every 5 s for an hour.
SAMPLE_INTERVAL_S: Final = 5.0
SAMPLE_POINTS: Final = 720
#: A sample equal to the last one stored is stored again only this long after it (idle series).
STORE_EVERY_S: Final = 60.0
#: The fields of a lag-history stream entry (its id holds the sample's time); ``d`` is optional (entries
#: written before samples counted dead letters lack it).
_FIELDS: Final = ("m", "a", "p", "c", "d")
#: Local samples kept per (group, topic) in Redis: enough for a few proxies' hour each.
LOCAL_PROXIES: Final = 8


def now_ms() -> int:
    return int(time.time() * 1000)


async def produce_times(redis: AsyncRedis, topic: str, offsets: Mapping[int, int]) -> dict[int, int]:
    """qid -> produce time (ms) of the entry at ``offsets[qid]``, or of the first one after it when
    that offset is gone; qids whose stream has nothing from there are left out."""
    qids = sorted(offsets)
    found = await _produce_times(redis, [(topic, qid, offsets[qid]) for qid in qids])
    return {qid: at for qid, at in zip(qids, found, strict=True) if at is not None}


#: (topic, qid, offset): a place in a queue's stream.
Position = tuple[str, int, int]


async def produce_times_at(redis: AsyncRedis, positions: Iterable[Position]) -> dict[Position, int]:
    """Position -> produce time (ms) of the entry there, or of the first one after it when that offset
    is gone; positions with nothing from there are left out. One pipeline for them all (one round
    trip; on a cluster, one per master)."""
    wanted = sorted(set(positions))
    found = await _produce_times(redis, wanted)
    return {position: at for position, at in zip(wanted, found, strict=True) if at is not None}


async def _produce_times(redis: AsyncRedis, wanted: list[tuple[str, int, int]]) -> list[int | None]:
    """Per (topic, qid, offset): what :func:`produce_times` finds, in one pipeline."""
    if not wanted:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for topic, qid, offset in wanted:
            pipe.xrange(keys.stream(topic, qid), f"0-{offset}", "+", count=1)
        replies = await pipe.execute()
    times: list[int | None] = []
    for entries in replies:
        raw = entries[0][1].get(b"ts") if entries else None
        times.append(int(raw) if raw is not None and raw.isdigit() else None)
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
    (rows,) = await topic_lags(redis, [(group, topic, queues)])
    return rows


async def topic_lags(redis: AsyncRedis, pairs: list[tuple[str, str, int]]) -> list[list[QueueLag]]:
    """:func:`topic_lag` of many (group, topic, queues) at once: still two round trips (one ``MGET`` of
    every committed offset and sequence, one pipeline of the produce times of the queues behind)."""
    sequences = {(topic, qid): keys.sequence(topic, qid) for _, topic, queues in pairs for qid in range(queues)}
    committed_names = [keys.committed(group, topic, qid) for group, topic, queues in pairs for qid in range(queues)]
    raws = await get_many(redis, committed_names + list(sequences.values()))
    produced_of = {where: int(raw) + 1 if raw is not None else 1
                   for where, raw in zip(sequences, raws[len(committed_names):], strict=True)}
    committed_raws = iter(raws[:len(committed_names)])
    table: list[list[tuple[int, int, int]]] = []
    behind: list[tuple[str, int, int]] = []
    for _, topic, queues in pairs:
        rows = []
        for qid in range(queues):
            raw = next(committed_raws)
            committed, produced = int(raw) if raw is not None else 1, produced_of[topic, qid]
            rows.append((qid, committed, produced))
            if produced > committed:
                behind.append((topic, qid, committed))
        table.append(rows)
    oldest = dict(zip(behind, await _produce_times(redis, behind), strict=True))
    return [
        [QueueLag(qid, committed, produced, max(0, produced - committed), oldest.get((topic, qid, committed)))
         for qid, committed, produced in rows]
        for (_, topic, _), rows in zip(pairs, table, strict=True)
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
    #: Dead letters of the group's topic (its dead-letter stream's length) at ``at_ms``.
    dead: int = 0


class LocalSample(NamedTuple):
    """What one proxy alone knows of a (group, topic) at ``at_ms``: its order keys by state (the queues it
    reads) and the end-to-end latency, produce to ack, of the messages acked here since its previous
    sample (milliseconds, -1 when none was)."""

    at_ms: int
    parked: int
    failing: int
    in_flight: int
    waiting: int
    acked_p50_ms: int
    acked_p99_ms: int


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
        #: Per (group, topic): the last sample this proxy stored in Redis.
        self._last_stored: dict[tuple[str, str], LagSample] = {}
        self._local: dict[tuple[str, str], deque[LocalSample]] = {}
        self._last_local: dict[tuple[str, str], LocalSample] = {}
        #: Per (group, topic): the acked latency buckets at the previous sample (this interval's are the difference).
        self._acked_before: dict[tuple[str, str], list[int]] = {}

    async def run(self) -> None:
        """Sample until cancelled; a failed sample is logged and the next one tried on time."""
        while True:
            try:
                await self.sample()
            except DdmqError as exc:
                log.warning("lag history: sample skipped: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def sample(self) -> None:
        """One sample of every (group, topic) served, read from Redis in two round trips for them all;
        stored in Redis when it differs from the last one stored, or that one is older than
        :data:`STORE_EVERY_S` (an idle series costs one entry a minute)."""
        registry = self._registry
        if registry.redis is None:
            return
        # Redis's time (every proxy's samples on one clock) once the upkeep has sampled it.
        upkeep = registry.upkeep
        at = upkeep.clock.redis_now_ms() if upkeep is not None else now_ms()
        pairs = [(group_name, topic, consumer.queues) for group_name, group in list(registry.groups.items())
                 for topic, consumer in list(group.consumers.items()) if consumer.queues]
        to_store: list[tuple[str, str, LagSample]] = []
        lags = await topic_lags(registry.redis, pairs)
        dead = await dead_letter_counts(registry.redis, [(group_name, topic) for group_name, topic, _ in pairs])
        for (group_name, topic, _), rows, letters in zip(pairs, lags, dead, strict=True):
            ages = [at - row.oldest_ms for row in rows if row.oldest_ms is not None]
            sample = LagSample(at, sum(row.lag for row in rows), max(0, max(ages, default=0)),
                               sum(row.produced - 1 for row in rows), sum(row.committed - 1 for row in rows),
                               letters)
            series = self._series.get((group_name, topic))
            if series is None:
                series = self._series[group_name, topic] = deque(
                    await self._stored(group_name, topic), maxlen=self.points)
            series.append(sample)
            last = self._last_stored.get((group_name, topic))
            if last is None or last[1:] != sample[1:] or at - last.at_ms >= STORE_EVERY_S * 1000:
                to_store.append((group_name, topic, sample))
        await self._store(to_store)
        await self._sample_local(at, [(group, topic) for group, topic, _ in pairs])
        # A group or topic removed by a reload stops taking memory.
        served = {(group, topic) for group, topic, _ in pairs}
        for gone in self._series.keys() - served:
            del self._series[gone]
            self._last_stored.pop(gone, None)
        for gone in self._local.keys() - served:
            del self._local[gone]
            self._last_local.pop(gone, None)
            self._acked_before.pop(gone, None)

    async def _sample_local(self, at: int, pairs: list[tuple[str, str]]) -> None:
        """This proxy's keys by state and latency of each (group, topic), into memory and, when it
        changed or a minute passed, into Redis."""
        registry = self._registry
        to_store: list[tuple[str, str, LocalSample]] = []
        for group_name, topic in pairs:
            group = registry.groups.get(group_name)
            consumer = group.consumers.get(topic) if group is not None else None
            if group is None or consumer is None:
                continue
            states = consumer.parking.counts()
            figures = group.buffer.end_to_end.get(topic)
            p50 = p99 = -1
            if figures is not None:
                counts = list(figures.acked.counts)
                before = self._acked_before.get((group_name, topic))
                self._acked_before[group_name, topic] = counts
                interval = Distribution(figures.acked.bounds, figures.acked.divisor)
                interval.counts = [now - then for now, then in zip(counts, before or [0] * len(counts), strict=True)]
                found = interval.quantile(0.5), interval.quantile(0.99)
                if found[0] is not None and found[1] is not None:
                    p50, p99 = round(found[0] * 1000), round(found[1] * 1000)
            parked, failing, in_flight, waiting = (states[state] for state in KEY_STATES)
            sample = LocalSample(at, parked, failing, in_flight, waiting, p50, p99)
            series = self._local.get((group_name, topic))
            if series is None:
                series = self._local[group_name, topic] = deque(await self._stored_local(group_name, topic),
                                                                maxlen=self.points)
            series.append(sample)
            last = self._last_local.get((group_name, topic))
            if last is None or last[1:] != sample[1:] or at - last.at_ms >= STORE_EVERY_S * 1000:
                to_store.append((group_name, topic, sample))
        await self._store_local(to_store)

    def _instance(self) -> str:
        return self._registry.config.instance_id

    async def _stored_local(self, group: str, topic: str) -> list[LocalSample]:
        """This proxy's own local samples kept in Redis (before a restart), oldest first."""
        assert self._registry.redis is not None
        entries = await self._registry.redis.xrevrange(keys.local_history(group, topic), "+", "-",
                                                       count=self.points * LOCAL_PROXIES)
        me = self._instance().encode()
        samples = []
        for _, fields in reversed(entries):
            if fields.get(b"i") != me:
                continue
            try:
                parked, failing, in_flight, waiting, p50, p99 = (int(part) for part in fields[b"s"].split())
                samples.append(LocalSample(int(fields[b"t"]), parked, failing, in_flight, waiting, p50, p99))
            except (KeyError, ValueError):  # not six numbers: not written by a proxy
                continue  # not written by a proxy: skipped
        return samples[-self.points:]

    async def _store_local(self, samples: list[tuple[str, str, LocalSample]]) -> None:
        redis = self._registry.redis
        if not samples or redis is None:
            return
        me = self._instance()
        async with redis.pipeline(transaction=False) as pipe:
            for group, topic, sample in samples:
                pipe.xadd(keys.local_history(group, topic),
                          {"i": me, "t": sample.at_ms, "s": " ".join(map(str, sample[1:]))},
                          maxlen=self.points * LOCAL_PROXIES, approximate=True)
            replies = await pipe.execute(raise_on_error=False)
        for (group, topic, sample), reply in zip(samples, replies, strict=True):
            if isinstance(reply, Exception):
                log.warning("local history of %s/%s: %s", group, topic, reply)
            else:
                self._last_local[group, topic] = sample

    async def _stored(self, group: str, topic: str) -> list[LagSample]:
        """The samples kept in Redis (by this proxy before a restart, or by another proxy of the
        group), oldest first: the console's chart survives a restart."""
        assert self._registry.redis is not None
        entries = await self._registry.redis.xrevrange(keys.lag_history(group, topic), "+", "-", count=self.points)
        samples = []
        for entry_id, fields in reversed(entries):
            try:
                messages, age, produced, consumed = (int(fields[name.encode()]) for name in _FIELDS[:4])
                samples.append(LagSample(int(entry_id.split(b"-")[0]), messages, age, produced, consumed,
                                         int(fields.get(b"d", 0))))
            except (KeyError, ValueError):
                continue  # not written by a proxy: skipped
        return samples

    async def _store(self, samples: list[tuple[str, str, LagSample]]) -> None:
        """Append each (group, topic, sample) to the stream of (group, topic), capped at ``points``
        entries, in one pipeline. A sample's id is the start of its interval, so the proxies of a group
        write one sample per interval between them: a second one in the same interval is refused by
        Redis (an id not above the last) and dropped here."""
        redis = self._registry.redis
        if not samples or redis is None:
            return
        interval_ms = max(1, int(self.interval_s * 1000))
        async with redis.pipeline(transaction=False) as pipe:
            for group, topic, sample in samples:
                pipe.xadd(keys.lag_history(group, topic), dict(zip(_FIELDS, sample[1:], strict=True)),
                          id=f"{sample.at_ms - sample.at_ms % interval_ms}-0", maxlen=self.points,
                          approximate=False)
            replies = await pipe.execute(raise_on_error=False)
        for (group, topic, sample), reply in zip(samples, replies, strict=True):
            if not isinstance(reply, Exception):
                self._last_stored[group, topic] = sample
            elif "equal or smaller" not in str(reply):  # Redis's refusal of an id not above the last
                log.warning("lag history of %s/%s: %s", group, topic, reply)
            # else another proxy of the group (or this one, sampling again) took this interval's sample

    def series(self, group: str) -> dict[str, list[LagSample]]:
        """topic -> samples, oldest first."""
        return {topic: list(samples) for (name, topic), samples in sorted(self._series.items()) if name == group}

    def local_series(self, group: str) -> dict[str, list[LocalSample]]:
        """topic -> this proxy's local samples, oldest first."""
        return {topic: list(samples) for (name, topic), samples in sorted(self._local.items()) if name == group}


async def dead_letter_counts(redis: AsyncRedis, pairs: list[tuple[str, str]]) -> list[int]:
    """The length of each (group, topic)'s dead-letter stream, in one pipeline."""
    if not pairs:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for group, topic in pairs:
            pipe.xlen(keys.dead_letters(group, topic))
        return [int(n) for n in await pipe.execute()]
