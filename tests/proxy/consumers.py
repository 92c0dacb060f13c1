"""TopicConsumers of group "g" on topic "t" over the session's real Redis, without a service or servers:
a test plays the clients by pulling from and acking into each consumer's PullBuffer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType

import redis.asyncio as aioredis

from ddmq.config.schema import LeaseConfig, TopicGroupConfig
from ddmq.protocol.produce.producer import AsyncProducer, OutgoingMessage
from ddmq.proxy.cluster.audit import ReadAudit
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.core.types import PullBatch
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.groups.group import TopicConsumer
from ddmq.proxy.groups.parts import ProxyParts
from ddmq.proxy.store.broker import Broker

from ..support import OrderChecker, body

#: Short leases and a quick lease loop, so hand-offs and lapses happen within a test.
LEASES = LeaseConfig(ttl_ms=1000, renew_ms=300, claim_interval_ms=50, handoff_drain_ms=200)


class StallableMembership(Membership):
    """A real membership whose heartbeat can be held: the upkeep then stalls (no claims, no
    renewals) while readers and clients go on, as when only the lease loop is starved."""

    def __init__(self, redis: aioredis.Redis, instance_id: str, timeout_ms: int) -> None:
        super().__init__(redis, instance_id, timeout_ms)
        self._running = asyncio.Event()
        self._running.set()

    def stall(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def heartbeat_many(self, groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        await self._running.wait()
        return await super().heartbeat_many(groups)


class Proxy:
    """One proxy instance's consumer of g/t (started on enter; on exit it leaves and releases, as a
    graceful shutdown does)."""

    def __init__(
        self, redis: aioredis.Redis, instance: str, config: TopicGroupConfig | None = None,
        audit: ReadAudit | None = None,
    ) -> None:
        self.broker = Broker(redis)
        self.membership = StallableMembership(redis, instance, LEASES.ttl_ms)
        self.buffer = PullBuffer("g")
        parts = ProxyParts.of(self.broker, LeaseStore(redis, instance, LEASES.ttl_ms), LEASES, self.membership,
                              read_audit=audit)
        self.consumer = TopicConsumer("g", "t", config or TopicGroupConfig(), self.buffer, parts)

    async def __aenter__(self) -> Proxy:
        self.buffer.start()
        self.consumer.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.membership.resume()
        await self.consumer.stop_reading()
        await self.consumer.ownership.release_all()
        await self.consumer.close()
        await self.buffer.close()
        await self.broker.close()

    async def pull(self, max_batch: int = 100) -> PullBatch:
        return await self.buffer.pull("t", max_batch, 0)

    async def wait_held(self, qids: set[int]) -> None:
        """Until the consumer holds exactly ``qids`` and has opened each (a claim opens its queue after
        some Redis round trips: offsets, parked keys)."""
        async with asyncio.timeout(20):
            # the lease loop works in the background
            while set(self.consumer.held) != qids or set(self.consumer.trackers) != qids:  # noqa: ASYNC110
                await asyncio.sleep(0.01)


def events(batch: PullBatch) -> list[tuple[str, int]]:
    return [(json.loads(m.value)["k"], json.loads(m.value)["seq"]) for m in batch.messages]


def deliver(proxy: Proxy, batch: PullBatch, checker: OrderChecker, epoch: int = 0, ack: bool = True) -> None:
    """Record ``batch`` as delivered (and, with ``ack``, acked) in ``checker``, and ack it."""
    for key, seq in events(batch):
        checker.delivered(key, seq, epoch)
        if ack:
            checker.acked(key, seq, epoch)
    if ack and batch.queue is not None:
        proxy.buffer.ack(batch.queue, [m.offset for m in batch.messages])


async def produce(redis_url: str, produced: dict[str, int], keys: Iterable[str], qid: int | None = None) -> None:
    """One message per entry of ``keys``, each carrying its key's next sequence number."""
    batch = []
    for key in keys:
        seq = produced.get(key, 0)
        produced[key] = seq + 1
        batch.append(OutgoingMessage(body(key, seq), key, None, None, qid))
    async with AsyncProducer(redis_url) as producer:
        await producer.send_batch("t", batch)


async def consume_all(
    proxies: list[tuple[Proxy, int]], checker: OrderChecker, produced: dict[str, int], concurrency: int | None = None
) -> None:
    """Pull and ack from every (proxy, epoch) until every produced message was acked. With
    ``concurrency``, check that no consumer ever holds more unfinished jobs than that."""
    async with asyncio.timeout(30):
        while checker.missing(produced):
            idle = True
            for proxy, epoch in proxies:
                if concurrency is not None:
                    assert proxy.consumer.unfinished <= concurrency
                batch = await proxy.pull()
                if batch.messages:
                    idle = False
                    deliver(proxy, batch, checker, epoch)
            if idle:
                await asyncio.sleep(0.01)
