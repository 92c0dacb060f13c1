"""A rolling restart with the default leases (30 s TTL), for ``tests/system/test_rolling_restart.py``
and bench row P6d: three proxies share 8 queues holding a backlog, clients pull from all three (per
proxy a bare Thrift client and the project's SDK consumer), and each proxy in turn is sent SIGTERM and
started again under the same instance id: once started when the others hold its queues (a hand-off on
the stop and one back to it), once started at once, as a supervisor does. What it records: every
delivery (the clients' log), the restarts, the read audit, and per queue the longest time without a
delivery while the restarts ran."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import time
from pathlib import Path

import redis.asyncio as aioredis

from ddmq.client.async_consumer import AsyncPullConsumer
from ddmq.client.pull_parts import ConsumedMessage
from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire
from ddmq.protocol.redis import keys
from ddmq.proxy.cluster.membership import assign
from tests.support import Delivery, ProxyProcess, produce_keyed, until

QUEUES = 8
KEYS = 1000
NAMES = ("proxy-1", "proxy-2", "proxy-3")
GROUP = {"order_key": "KEY", "timeout_ms": 5000, "max_retry": 50}
#: Per pull at most this many messages, then a pause: the clients consume slowly enough that every
#: queue keeps a backlog through the restarts (about 3,000 a second), and fast once they are over.
#: Much slower clients (16 a pull) lengthen the longest gap to about 2 s: a proxy taking a queue over
#: reads it once its topic's read-ahead (``concurrency``, full with a backlog) has room, which comes
#: back as fast as the clients ack.
BATCH, PAUSE_S = 24, 0.05
#: A queue with fewer messages left than this before a restart gets TOP_UP more over all queues.
TOP_UP_BELOW, TOP_UP = 3000, 24_000

produce = functools.partial(produce_keyed, keys=KEYS, key_prefix="rider-", queues=QUEUES)


def proxy(tmp_path: Path, redis_url: str, name: str) -> ProxyProcess:
    """A proxy with the default leases and shutdown grace, its read audit in its folder."""
    folder = tmp_path / name
    folder.mkdir()
    return ProxyProcess(folder, redis_url, {"g": {"t": GROUP}}, {"t": {"queues": QUEUES}}, instance_id=name,
                        audit_log=str(folder / "reads.jsonl"))


class Pullers:
    """Per proxy, a bare Thrift client (acks ride on its next pull, no request ids: what DDMQ's SDKs
    send) and the project's SDK consumer, all paced while ``slow``."""

    def __init__(self) -> None:
        self.log: list[Delivery] = []
        self.stop = asyncio.Event()
        self.slow = True
        self.tasks: list[asyncio.Task[None]] = []
        self.consumers: list[AsyncPullConsumer] = []

    async def add(self, owner: str, port: int) -> None:
        self.tasks.append(asyncio.create_task(self._pull(owner, port)))

        async def handle(message: ConsumedMessage) -> bool:
            event, now = json.loads(message.value), time.time()
            self.log.append(Delivery(owner, int(message.qid), message.offset, event["k"], event["seq"], True,
                                     t=now, received=now))
            if self.slow:
                await asyncio.sleep(PAUSE_S / BATCH)
            return True

        consumer = AsyncPullConsumer(f"127.0.0.1:{port}", "g", handle, topic="t", concurrency=1, batch_size=BATCH,
                                     linger_ms=200)
        await consumer.start()
        self.consumers.append(consumer)

    async def _pull(self, owner: str, port: int) -> None:
        pending: list[wire.ConsumeResult] = []
        async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
            while not self.stop.is_set():
                try:
                    response = await client.pull(wire.PullRequest(
                        groupId="g", topic="t", maxBatchSize=BATCH if self.slow else 256, maxLingerTime=200,
                        result=wire.link_results(pending)))
                except ProxyClientError:
                    pending.clear()  # lost with the connection: those messages come again
                    await asyncio.sleep(0.05)
                    continue
                pending.clear()
                now = time.time()
                for message in response.messages:
                    event = json.loads(message.value)
                    self.log.append(Delivery(owner, int(response.context.qid), message.offset, event["k"],
                                             event["seq"], True, t=now, received=now))
                if response.messages:
                    offsets = [m.offset for m in response.messages]
                    pending.append(wire.ConsumeResult(context=response.context, successOffsets=offsets,
                                                      failOffsets=[]))
                if self.slow:
                    await asyncio.sleep(PAUSE_S)
            if pending:
                try:
                    await client.submit(wire.link_results(pending))
                except ProxyClientError:
                    pass

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, *(c.close(grace_s=10) for c in self.consumers), return_exceptions=True)


def longest_gaps(log: list[Delivery], start: float, end: float) -> dict[int, float]:
    """Per queue, the longest time within [start, end] without a delivery of it."""
    times: dict[int, list[float]] = {qid: [start, end] for qid in range(QUEUES)}
    for d in log:
        if start <= d.received <= end:
            times[d.qid].append(d.received)
    return {qid: max(b - a for a, b in zip(sorted(ts), sorted(ts)[1:], strict=False)) for qid, ts in times.items()}


async def settled(redis_client: aioredis.Redis, members: tuple[str, ...] = NAMES) -> bool:
    """Every queue's lease held by its owner under the assignment of ``members``."""
    for name in members:
        for qid in assign(list(members), QUEUES, name):
            raw = await redis_client.get(keys.lease("g", "t", qid))
            if raw is None or raw.decode().rpartition(" ")[0] != name:
                return False
    return True


async def backlog(redis_client: aioredis.Redis) -> list[int]:
    """Per queue, how many messages are past its committed offset."""
    out = []
    for qid in range(QUEUES):
        produced = int(await redis_client.get(keys.sequence("t", qid)) or 0) + 1
        out.append(produced - int(await redis_client.get(keys.committed("g", "t", qid)) or 0))
    return out


def served_since(log: list[Delivery], since: float) -> bool:
    """Every queue delivered from at least once since ``since``."""
    return {d.qid for d in log if d.received >= since} == set(range(QUEUES))


async def served_again(redis_client: aioredis.Redis, log: list[Delivery], since: float, timeout_s: float = 30) -> None:
    """Wait until every queue with something left to finish (committed short of produced) has been
    delivered from since ``since``: on a slow host the clients may finish a queue's backlog before a
    restart is over, and a queue with nothing left has nothing to deliver."""
    deadline = time.monotonic() + timeout_s
    while True:
        served = {d.qid for d in log if d.received >= since}
        if served == set(range(QUEUES)):
            return
        left = await backlog(redis_client)
        waiting = [qid for qid in range(QUEUES) if qid not in served and left[qid] > 0]
        if not waiting:
            return
        assert time.monotonic() < deadline, f"queues {waiting} not served again within {timeout_s}s: backlog {left}"
        await asyncio.sleep(0.05)


class Fleet:
    """The three proxies, their pullers, and the restarts made (name, how, stop time, back-in-service time)."""

    def __init__(self, tmp_path: Path, redis_url: str, redis_client: aioredis.Redis) -> None:
        self.proxies = {name: proxy(tmp_path, redis_url, name) for name in NAMES}
        self.pullers = Pullers()
        self.redis = redis_client
        self.restarts: list[tuple[str, str, float, float]] = []

    async def start(self) -> None:
        for name, process in self.proxies.items():
            await asyncio.to_thread(process.start)
            await self.pullers.add(name, process.port)
        await self.wait_settled("start")
        await until("deliveries from every queue", lambda: served_since(self.pullers.log, 0), 30)

    async def wait_settled(self, what: str, members: tuple[str, ...] = NAMES) -> None:
        deadline = time.monotonic() + 60
        while not await settled(self.redis, members):
            assert time.monotonic() < deadline, f"{what}: the queues did not settle within 60 s"
            await asyncio.sleep(0.05)

    async def restart(self, name: str, wait_for_takeover: bool) -> None:
        """SIGTERM ``name`` and start it again under the same instance id: once the others hold its
        queues (both hand-offs happen), or at once (as a supervisor restarts it)."""
        process = self.proxies[name]
        stopped_at = time.time()
        assert await asyncio.to_thread(process.stop) == 0
        if wait_for_takeover:
            await self.wait_settled(f"after stopping {name}", tuple(n for n in NAMES if n != name))
        await asyncio.to_thread(process.start)
        await self.wait_settled(f"after restarting {name}")
        back = time.time()
        await served_again(self.redis, self.pullers.log, back)
        self.restarts.append((name, "after takeover" if wait_for_takeover else "at once", stopped_at, back))

    async def stop(self) -> list[int]:
        await self.pullers.close()
        return [await asyncio.to_thread(p.stop) for p in self.proxies.values()]

    def reads(self) -> list[dict[str, object]]:
        return [json.loads(line) for p in self.proxies.values()
                for line in (p.config_path.parent / "reads.jsonl").read_text().splitlines() if line.strip()]


async def rolling_restarts(fleet: Fleet, produced: dict[str, int], rng: random.Random, redis_url: str,
                           kinds: tuple[bool, ...] = (True, False)) -> tuple[float, float]:
    """Each proxy of ``fleet`` restarted in turn, once round per kind (True: started again once the
    others hold its queues; False: at once), the backlog topped up before a restart where a queue is
    short of it; the restarts' start and end (``time.time()``)."""
    started = time.time()
    for wait_for_takeover in kinds:
        for name in NAMES:
            # A gap means something only while its queue has a backlog: where a slow host's restarts
            # have used most of it, the backlog is topped up before the next one.
            if min(await backlog(fleet.redis)) < TOP_UP_BELOW:
                await asyncio.to_thread(produce, redis_url, TOP_UP, produced, rng)
            await fleet.restart(name, wait_for_takeover)
    return started, time.time()
