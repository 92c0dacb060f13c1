"""Group membership and queue assignment.

Every proxy heartbeats its instance id into the group's member set (a sorted set scored by the time
of the last heartbeat). A member whose last heartbeat is older than the member timeout is gone.
Every proxy computes the same assignment from the same sorted member list, so no coordinator is
needed: :func:`assign` averages the sorted queues over the sorted members in contiguous blocks,
the first ``queues % members`` members taking one extra (RocketMQ's
AllocateMessageQueueAveragely). Leases make the hand-over safe while members disagree for a moment.

Heartbeats are scored with Redis's clock (the scripts read ``TIME``), never a proxy's, so a proxy
whose clock is off or runs at another rate neither looks dead nor stays alive for ever to the
others; every round's reply also carries that time, which feeds the proxy's
:class:`~ddmq.proxy.cluster.lease_clock.LeaseClock`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from redis.asyncio.cluster import RedisCluster

from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import AsyncRedis, eval_script, eval_scripts
from ddmq.protocol.redis.scripts import HEARTBEAT_LUA, HEARTBEAT_MANY_LUA, REGISTER_GROUP_LUA
from ddmq.proxy.cluster.lease_clock import LeaseClock
from ddmq.proxy.core.errors import BrokerError

log = logging.getLogger(__name__)

#: Most groups one heartbeat script call covers on a single Redis.
HEARTBEAT_BATCH = 100
#: :meth:`Membership.heartbeat_many` removes silent members from the member sets once in this many
#: calls (they are left out of the live members by their score in every call).
SWEEP_EVERY = 10
#: How often :meth:`Membership.heartbeat_many` writes this proxy's heartbeat and its topics' stamps
#: (at most; a quarter of the member timeout when that is shorter). The live members are read every
#: call, so a newcomer is seen at once; writing the proxy's own score every second would only repeat
#: what a timeout of 30 s does not need. The retention trimmer adds this much slack to
#: ``group_idle_after_s``, so a stamp written late never makes a live group look idle.
STAMP_EVERY_MS = 5_000
#: How many joins and leaves a group's event stream keeps: a proxy only needs to see that one came.
EVENTS_KEPT = 32
#: Longest wait for a member change (no command of the proxy blocks longer than a second).
EVENTS_BLOCK_MS = 1000


def assign(members: list[str], queues: int, me: str) -> range:
    """The qids of ``0..queues-1`` that ``me`` owns among ``members`` (any order; sorted here)."""
    ordered = sorted(set(members))
    if me not in ordered or queues <= 0:
        return range(0)
    index, count = ordered.index(me), len(ordered)
    base, extra = divmod(queues, count)
    size = base + (1 if index < extra else 0)
    start = index * base + min(index, extra)
    return range(start, start + size)


class Membership:
    """This proxy's membership in the groups it serves."""

    def __init__(self, redis: AsyncRedis, instance_id: str, timeout_ms: int, clock: LeaseClock | None = None) -> None:
        self.redis = redis
        self.instance_id = instance_id
        self.timeout_ms = timeout_ms
        #: Sampled by every :meth:`heartbeat_many` that gets through.
        self.clock = clock or LeaseClock(timeout_ms, timeout_ms // 3)
        self._calls = 0
        #: group -> (loop time in ms of the last stamp sent, the topics it stamped).
        self._stamped: dict[str, tuple[float, tuple[str, ...]]] = {}
        #: The error of the last :meth:`heartbeat_many` whose call failed as a whole (None: it went through).
        self.failure: Exception | None = None
        #: group -> the id of the last member event :meth:`wait_for_change` saw in it.
        self._event_ids: dict[str, str] = {}

    async def heartbeat(self, group: str, topic: str | None = None) -> list[str]:
        """Record that we are alive (and, given ``topic``, that the group consumes it: the group
        registry ``ddmq groups`` reads); forget members silent for longer than the timeout; return
        the live members, sorted."""
        key = keys.members(group)
        live = await eval_script(self.redis, HEARTBEAT_LUA, [key, keys.group_topics(group)],
                                 [self.instance_id, self.timeout_ms, topic or ""])
        if topic is not None:
            await eval_script(self.redis, REGISTER_GROUP_LUA, [keys.groups()], [group])
        return sorted(member.decode() for member in live)

    async def heartbeat_many(self, groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """:meth:`heartbeat` for every group of ``groups`` (group -> the topics this proxy consumes of
        it) in one pipeline: on a single Redis one script call per :data:`HEARTBEAT_BATCH` groups, on
        a Cluster one per group (its slot), plus the group registry's. Returns the live members of each
        group whose heartbeat went through (a group left out keeps its last assignment)."""
        loop = asyncio.get_running_loop()
        now = loop.time() * 1000
        sweep = "1" if self._calls % SWEEP_EVERY == 0 else "0"
        self._calls += 1
        stale = now - self.clock.local_s(min(STAMP_EVERY_MS, self.timeout_ms // 4))
        stamp = {group for group, topics in groups.items()
                 if self._stamped.get(group, (stale, ()))[0] <= stale or self._stamped[group][1] != tuple(topics)}
        joining = [group for group in stamp if group not in self._stamped]
        batches, calls, registered = self._heartbeat_calls(groups, stamp, sweep)
        sent_at = loop.time()
        try:
            replies = await eval_scripts(self.redis, calls)
        except BrokerError as exc:
            self.failure = exc  # the upkeep says it once (see link_health), not every round
            return {}
        self.failure = None
        answered_at = loop.time()
        live: dict[str, list[str]] = {}
        sampled = False
        for batch, reply in zip(batches, replies, strict=False):
            if isinstance(reply, Exception):
                log.warning("heartbeating groups %s failed: %s", ", ".join(batch), reply)
                continue
            if not sampled:  # one sample a round: the rate needs samples seconds apart, not many at once
                sampled = True
                self.clock.sample(sent_at, int(reply[0]), answered_at)
            for group, members in zip(batch, reply[1:], strict=True):
                listed = sorted(member.decode() for member in members)
                if self.instance_id not in listed:
                    # Our heartbeat is gone (a Redis restarted empty, or ``ddmq groups delete``):
                    # stamp again next round, and keep the last assignment meanwhile, as the
                    # share computed without us would be none.
                    self._stamped.pop(group, None)
                    continue
                live[group] = listed
                if group in stamp:
                    self._stamped[group] = (now, tuple(groups[group]))
        if registered and isinstance(replies[-1], Exception):
            log.warning("registering groups failed: %s", replies[-1])
        joined = [group for group in joining if group in live]
        if joined:
            await self.announce(joined)
        return live

    def _heartbeat_calls(self, groups: Mapping[str, Sequence[str]], stamp: set[str], sweep: str,
                         ) -> tuple[list[list[str]], list[tuple[str, list[str], list[Any]]], list[str]]:
        """The script calls of :meth:`heartbeat_many`: the groups of each heartbeat call, the calls
        (the registry's last, when a group is stamped), the groups registered."""
        names = sorted(groups)
        size = 1 if isinstance(self.redis, RedisCluster) else HEARTBEAT_BATCH
        batches = [names[i:i + size] for i in range(0, len(names), size)]
        calls: list[tuple[str, list[str], list[Any]]] = []
        for batch in batches:
            keys_: list[str] = []
            args: list[Any] = [self.instance_id, self.timeout_ms, sweep]
            for group in batch:
                keys_ += [keys.members(group), keys.group_topics(group)]
                topics = groups[group] if group in stamp else ()
                args += ["1" if group in stamp else "0", len(topics), *topics]
            calls.append((HEARTBEAT_MANY_LUA, keys_, args))
        registered = [group for group in names if groups[group] and group in stamp]
        if registered:
            calls.append((REGISTER_GROUP_LUA, [keys.groups()], registered))
        return batches, calls, registered

    async def announce(self, groups: Sequence[str]) -> None:
        """Tell the other proxies of ``groups`` that this one joined or leaves: waiting in
        :meth:`wait_for_change`, they rebalance at once rather than at their next round. Best effort:
        without it they see the change at that round."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for group in groups:
                    pipe.xadd(keys.member_events(group), {"m": self.instance_id}, maxlen=EVENTS_KEPT, approximate=True)
                await pipe.execute()
        except BrokerError as exc:
            log.debug("announcing a member change of %s failed: %s", ", ".join(groups), exc)

    async def wait_for_change(self, groups: Sequence[str], block_ms: int = EVENTS_BLOCK_MS) -> bool:
        """Block until a proxy joins or leaves one of ``groups`` (True; this one's own changes count
        too) or ``block_ms`` passes (False). One multi-stream read, so a single Redis only: on a Cluster
        each group's stream is in a slot of its own. Raises BrokerError when Redis fails."""
        # Stream ids are Redis's milliseconds: a group seen for the first time is read from a second
        # back, so a change made just before never goes unseen (one seen twice costs a round).
        start = f"{max(0, self.clock.redis_now_ms() - 1000)}-0"
        ids = self._event_ids = {group: self._event_ids.get(group, start) for group in groups}
        streams = {keys.member_events(group): ids[group] for group in groups}
        by_stream = {name: group for group, name in zip(groups, streams, strict=True)}
        reply = await self.redis.xread(streams, block=block_ms)
        entries = reply.items() if isinstance(reply, dict) else (reply or [])
        for name, messages in entries:
            stream = name.decode() if isinstance(name, bytes) else name
            if messages and stream in by_stream:
                last = messages[-1][0]
                ids[by_stream[stream]] = last.decode() if isinstance(last, bytes) else last
        return bool(entries)

    async def leave(self, group: str) -> None:
        """Graceful exit: the others rebalance at once (:meth:`announce`) instead of after the timeout."""
        self._stamped.pop(group, None)
        await self.redis.zrem(keys.members(group), self.instance_id)
        await self.announce([group])
