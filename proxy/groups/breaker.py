"""A group's breakers on this proxy: one :class:`~ddmq.proxy.engine.breaker.Breaker` per topic whose
``breaker.enabled`` is set, the timers that half-open them, and what they hold.

The breakers sit where the engine finds them: the group's redelivery tells each of its topic's failed
attempts (``Redelivery.breakers``), the results path its acks. What an open or half-open breaker holds
is applied to the pull buffer together with the operator's pauses, by the group's
:class:`~ddmq.proxy.groups.pausing.PauseWatch` (``changed``): an open topic hands out nothing, a
half-open one its probes, and both count no failed attempt. State is per proxy (each proxy judges the
queues it serves) and starts closed: a restart or a reload that changes the topic starts it afresh.
Each opening and closing is also kept in the record of operator actions
(:mod:`ddmq.protocol.redis.actions`, by ``breaker``), and a breaker that holds its topic is shown in
:func:`ddmq.protocol.redis.keys.breakers` under this proxy's instance id (for ``ddmq status``, which
reads Redis), once the watch has given it Redis (:attr:`redis`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from ddmq.config.schema import BreakerConfig
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.actions import record_action
from ddmq.protocol.redis.connection import AsyncRedis
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.engine.breaker import Breaker, BreakerState
from ddmq.proxy.engine.pull_buffer import PullBuffer

__all__ = ["GroupBreakers"]

log = logging.getLogger(__name__)


def _nothing() -> None:
    pass


class GroupBreakers:
    """The breakers of ``group``'s topics on this proxy (see the module's docstring)."""

    def __init__(self, group: str, buffer: PullBuffer, instance: str = "") -> None:
        self.group = group
        self.instance = instance
        #: topic -> breaker: the redelivery's own dict, so it sees every change.
        self.breakers: dict[str, Breaker] = buffer.redelivery.breakers
        #: topic -> probes a half-open breaker may still let out (the delivery counts it down).
        self.allowance: dict[str, int] = {}
        #: Called after every change of what the breakers hold (set by the group's PauseWatch).
        self.changed: Callable[[], None] = _nothing
        self._timers: dict[str, asyncio.TimerHandle] = {}
        #: Where openings and closings are recorded (None: not recorded).
        self.redis: AsyncRedis | None = None
        self._records: set[asyncio.Task[None]] = set()
        #: Topics whose state is still to be shown in Redis, and the task showing them.
        self._unshown: set[str] = set()
        self._showing: asyncio.Task[None] | None = None

    def configure(self, topic: str, config: BreakerConfig) -> None:
        """``topic``'s breaker settings (a new or replaced consumer): a fresh, closed breaker, or none."""
        old = self.breakers.pop(topic, None)
        self._cancel(topic)
        if config.enabled:
            self.breakers[topic] = Breaker(self.group, topic, config, self._moved, self.allowance)
        if old is not None and old.holds:
            self.allowance.pop(topic, None)
            self.changed()

    def remove(self, topic: str) -> None:
        """``topic`` left the group."""
        self.configure(topic, BreakerConfig())

    def close(self) -> None:
        for topic in list(self._timers):
            self._cancel(topic)
        for task in self._records:
            task.cancel()

    async def forget(self) -> None:
        """Take this proxy's breakers out of Redis (it stops): they judge nothing any more."""
        self.close()
        if self._showing is not None:
            self._showing.cancel()
        if self.redis is not None and self.breakers:
            try:
                await self.redis.hdel(keys.breakers(self.group), *(self._field(t) for t in self.breakers))
            except DdmqError as exc:
                log.debug("%s: breakers left in Redis: %s", self.group, exc)

    # what they hold -----------------------------------------------------------------------------

    def open_topics(self) -> frozenset[str]:
        """Topics that hand out nothing now (open)."""
        return frozenset(t for t, b in self.breakers.items() if b.state is BreakerState.OPEN)

    def holding(self) -> frozenset[str]:
        """Topics whose failed attempts count nothing now (open or half-open)."""
        return frozenset(t for t, b in self.breakers.items() if b.holds)

    def state(self, topic: str) -> str | None:
        """``topic``'s breaker state (``closed``, ``open``, ``half_open``); None without a breaker."""
        breaker = self.breakers.get(topic)
        return breaker.state.value if breaker is not None else None

    def snapshot(self) -> dict[str, dict[str, object]]:
        """topic -> its breaker's state, for views (console, status)."""
        return {topic: {"state": b.state.value, "since_s": round(b.age_s, 1),
                        "failure_share": round(b.failure_share, 3), "open_for_ms": b.open_for_ms}
                for topic, b in self.breakers.items()}

    # transitions --------------------------------------------------------------------------------

    def _moved(self, breaker: Breaker) -> None:
        if self.breakers.get(breaker.topic) is not breaker:
            return  # replaced by a reload meanwhile
        if breaker.state is BreakerState.OPEN:
            self._cancel(breaker.topic)
            loop = asyncio.get_running_loop()
            self._timers[breaker.topic] = loop.call_later(breaker.open_for_ms / 1000, self._due, breaker)
            self._record(breaker, "breaker open", {"reason": breaker.why, "open_ms": breaker.open_for_ms})
        elif breaker.state is BreakerState.CLOSED:
            self._cancel(breaker.topic)
            self._record(breaker, "breaker close", {"probes": breaker.probes_ok})
        self._show(breaker.topic)
        self.changed()

    def _show(self, topic: str) -> None:
        if self.redis is None:
            return
        self._unshown.add(topic)
        if self._showing is None or self._showing.done():
            self._showing = asyncio.create_task(self._write_states(self.redis))

    async def _write_states(self, redis: AsyncRedis) -> None:
        # One writer, reading each breaker's state as it writes: the last state wins whatever the timing.
        while self._unshown:
            topic = self._unshown.pop()
            breaker = self.breakers.get(topic)
            try:
                if breaker is None or not breaker.holds:
                    await redis.hdel(keys.breakers(self.group), self._field(topic))
                else:
                    state = {"state": breaker.state.value, "why": breaker.why, "open_ms": breaker.open_for_ms}
                    await redis.hset(keys.breakers(self.group), self._field(topic), json.dumps(state))
            except DdmqError as exc:
                log.debug("%s/%s: breaker state not shown in Redis: %s", self.group, topic, exc)

    def _field(self, topic: str) -> str:
        return json.dumps([self.instance, topic])

    def _record(self, breaker: Breaker, action: str, detail: dict[str, object]) -> None:
        if self.redis is not None:
            task = asyncio.create_task(self._write(self.redis, breaker.topic, action, detail))
            self._records.add(task)
            task.add_done_callback(self._records.discard)

    async def _write(self, redis: AsyncRedis, topic: str, action: str, detail: dict[str, object]) -> None:
        try:
            await record_action(redis, "breaker", action, group=self.group, topic=topic, detail=detail)
        except DdmqError as exc:  # the log has the action already (record_action logs it first)
            log.warning("%s/%s: %s not recorded: %s", self.group, topic, action, exc)

    def _due(self, breaker: Breaker) -> None:
        self._timers.pop(breaker.topic, None)
        if self.breakers.get(breaker.topic) is breaker:
            breaker.tick(float("inf"))

    def _cancel(self, topic: str) -> None:
        timer = self._timers.pop(topic, None)
        if timer is not None:
            timer.cancel()
