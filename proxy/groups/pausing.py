"""A group's pause, as every proxy of the group follows it.

The pauses live in Redis (:mod:`ddmq.protocol.redis.pauses`: written by ``ddmq groups pause`` or the
admin API, whichever proxy or host). Each proxy reads them once per heartbeat (``claim_interval_ms``)
and tells its pull buffer what not to hand out; a ``--for`` pause ends by Redis's clock at the read
that finds it over. Until the first read succeeds the group hands out nothing, so a proxy restarted
while its group is paused does not deliver in between. A failed read keeps the last state (a paused
group stays paused while Redis does not answer, which also stops everything else).

What it applies to the buffer is the operator's pauses together with the group's open breakers
(:mod:`ddmq.proxy.groups.breaker`): a paused or open topic hands out nothing, a half-open one only its
probes; and the failed attempts of all of them (a client's fail, a deadline that runs out) count
nothing, the message waiting again as its key's head for the resume. Acks count as ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Final

from ddmq.protocol.redis.pauses import Pause, covers, pauses_async
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.core.supervise import supervised
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.groups.breaker import GroupBreakers
from ddmq.proxy.store.broker import Broker

__all__ = ["PauseWatch"]

log = logging.getLogger(__name__)

#: Longest wait between failed reads.
_MOST_BACKOFF_S: Final = 5.0


class PauseWatch:
    """Follows ``group``'s pauses for its pull buffer, one read per ``interval_ms``."""

    def __init__(self, group: str, buffer: PullBuffer, broker: Broker, interval_ms: int,
                 breakers: GroupBreakers | None = None) -> None:
        self.group = group
        self._buffer = buffer
        self.breakers = breakers if breakers is not None else GroupBreakers(group, buffer)
        self.breakers.changed = self.hold
        self.breakers.redis = broker.redis if broker is not None else None
        self._broker = broker
        self._interval_s = interval_ms / 1000
        #: The pauses in force at the last read (None: not read yet).
        self.pauses: list[Pause] | None = None
        self._task: asyncio.Task[None] | None = None
        #: Redis's time (ms) at the last read, and this host's monotonic clock then.
        self._read_at = (0, 0.0)

    def start(self) -> None:
        self.hold()
        self._task = asyncio.create_task(supervised("pause-watch", self._run, f"pause-watch {self.group}"),
                                         name=f"pause-watch {self.group}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.breakers.forget()

    async def read(self) -> None:
        """Read the pauses now and apply them (raises DdmqError)."""
        # A few groups at a time (Broker.opening): every group of the proxy starts its watch at once, and
        # a read each in flight would open a connection each.
        async with self._broker.opening:
            now_ms, found = await pauses_async(self._broker.redis, self.group)
        self._read_at = (now_ms, time.monotonic())
        self._apply(found)

    async def holds(self, topic: str) -> bool:
        """True while an operator's pause holds ``topic``; reads the pauses first when they were not read
        yet (raises DdmqError when that read fails)."""
        if self.pauses is None:
            await self.read()
        return covers(self.pauses or [], topic) is not None

    def paused_s(self, topic: str) -> float:
        """How long ``topic`` has been paused, in seconds (Redis's clock at the last read, carried on by
        this host's); 0 when it is not."""
        found = covers(self.pauses or [], topic)
        if found is None or not found.at_ms:
            return 0.0
        now_ms, read_mono = self._read_at
        return max(now_ms - found.at_ms, 0) / 1000 + time.monotonic() - read_mono

    def hold(self) -> None:
        """Apply the pauses and the breakers to the buffer (before the first read: everything paused)."""
        found = self.pauses
        everything = found is None or any(p.topic is None for p in found)
        paused = frozenset(p.topic for p in found or () if p.topic is not None)
        breakers = self.breakers
        self._buffer.pause(everything, paused | breakers.open_topics(), breakers.allowance)
        self._buffer.redelivery.hold(everything, paused | breakers.holding())

    def _apply(self, found: list[Pause]) -> None:
        before = {p.topic: p for p in self.pauses or ()}
        now = {p.topic: p for p in found}
        for topic, p in now.items():
            if before.get(topic) != p:
                until = f" until {p.until_ms} (ms, Redis time)" if p.until_ms is not None else " until resumed"
                log.warning("%s%s paused by %s%s: pulls get nothing, pushes wait; in-flight messages keep their "
                            "deadlines", self.group, f"/{topic}" if topic else "", p.by or "?", until)
        for topic in before.keys() - now.keys():
            log.warning("%s%s resumed", self.group, f"/{topic}" if topic else "")
        self.pauses = found
        self.hold()

    async def _run(self) -> None:
        delay = self._interval_s
        while True:
            try:
                await self.read()
                delay = self._interval_s
            except DdmqError as exc:
                (log.debug if self.pauses is not None else log.warning)("%s: %s (the last pause state holds)",
                                                                       self.group, exc)
                delay = min(max(delay * 2, 0.1), _MOST_BACKOFF_S)
            await asyncio.sleep(delay)
