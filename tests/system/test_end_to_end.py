"""End to end over Thrift: a real proxy process, real Redis, several real pull clients.

Random fails and dropped acks, then a SIGKILL of the proxy mid-stream and a restart: every message
is delivered and acked, each key's deliveries follow its order, and committed offsets reach the end.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from pathlib import Path

import pytest

from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire

from ..support import OrderChecker, ProxyProcess, produce_keyed

QUEUES = 8
KEYS = 1000
GROUP = "cg_e2e"
TOPIC = "events"


produce = functools.partial(produce_keyed, keys=KEYS, topic=TOPIC)


class Client:
    """A pull client that acks, fails or silently drops each message at random."""

    def __init__(self, proxy: ProxyProcess, checker: OrderChecker, rng: random.Random, fail_p: float,
                 drop_p: float) -> None:
        self.proxy = proxy
        self.client = AsyncProxyClient("127.0.0.1", proxy.port, timeout_s=5)
        self.epoch = 0
        self.checker = checker
        self.rng = rng
        self.fail_p = fail_p
        self.drop_p = drop_p
        self.pending: list[wire.ConsumeResult] = []
        self.errors = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            request = wire.PullRequest(
                groupId=GROUP, topic=TOPIC, maxBatchSize=32, maxLingerTime=200,
                result=wire.link_results(self.pending),
            )
            if not self.client.connected:
                self.epoch = self.proxy.incarnation  # the connection this pull opens
            try:
                response = await self.client.pull(request)
            except (ProxyClientError, OSError):
                # The proxy went away: results of this connection are dropped with it (as a client
                # crash would), so the restarted proxy redelivers those messages.
                self.errors += 1
                self.pending = []
                await asyncio.sleep(0.1)
                continue
            self.pending = []
            if response.messages:
                self.pending = [self.handle(response)]
        if self.pending:
            try:
                await self.client.submit(wire.link_results(self.pending))
            except (ProxyClientError, OSError):
                pass
        await self.client.close()

    def handle(self, response: wire.PullResponse) -> wire.ConsumeResult:
        ok, failed = [], []
        for message in response.messages:
            event = json.loads(message.value)
            self.checker.delivered(event["k"], event["seq"], self.epoch)
            roll = self.rng.random()
            if roll < self.fail_p:
                failed.append(message.offset)
            elif roll < self.fail_p + self.drop_p:
                pass  # neither ack nor fail: the proxy must redeliver it after timeout_ms
            else:
                self.checker.acked(event["k"], event["seq"], self.epoch)
                ok.append(message.offset)
        context = response.context
        return wire.ConsumeResult(
            context=wire.Context(groupId=GROUP, topic=context.topic, qid=context.qid),
            successOffsets=ok, failOffsets=failed,
        )


async def wait_until_done(checker: OrderChecker, produced: dict[str, int], timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while checker.missing(produced):
        if loop.time() > deadline:
            missing = checker.missing(produced)
            raise AssertionError(f"{len(missing)} keys not fully acked, e.g. {list(missing.items())[:5]}")
        await asyncio.sleep(0.1)


async def acked_at_least(checker: OrderChecker, count: int) -> None:
    while sum(checker.acked_upto.values()) < count:  # noqa: ASYNC110 - the clients' tasks move it
        await asyncio.sleep(0.01)


async def committed_reaches_end(port: int, timeout_s: float = 15) -> dict[str, int]:
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            (stats,) = await client.get_consume_stats(wire.ConsumeStatsRequest(group=GROUP, topic=TOPIC))
            if stats.consumeOffsets == stats.produceOffsets or loop.time() > deadline:
                assert stats.consumeOffsets == stats.produceOffsets
                return dict(stats.consumeOffsets)
            await asyncio.sleep(0.1)


@pytest.mark.timeout(240)
async def test_ordered_no_loss_with_fails_drops_and_a_sigkill(redis_url: str, tmp_path: Path) -> None:
    rng = random.Random(20261122)
    group = {
        TOPIC: {
            "actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 1000,
            "max_retry": 50, "retry_intervals_ms": [50, 100, 200], "concurrency": 2000,
        }
    }
    proxy = ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": QUEUES}}).start()
    checker = OrderChecker()
    produced: dict[str, int] = {}
    try:
        # Phase 1: 20k messages, 4 clients with random fails and dropped acks.
        await asyncio.to_thread(produce, redis_url, 20_000, produced, rng)
        stop = asyncio.Event()
        clients = [Client(proxy, checker, random.Random(i), fail_p=0.02, drop_p=0.01) for i in range(4)]
        tasks = [asyncio.create_task(c.run(stop)) for c in clients]
        await wait_until_done(checker, produced, 120)
        assert checker.violations == []
        offsets = await committed_reaches_end(proxy.port)
        assert sum(offsets.values()) == 20_000 + QUEUES  # next offset per queue: produced + 1

        # Phase 2: 10k more; SIGKILL the proxy mid-stream, restart it, finish.
        await asyncio.to_thread(produce, redis_url, 10_000, produced, rng)
        await asyncio.wait_for(acked_at_least(checker, 24_000), 60)
        proxy.kill()  # synchronous: no client task runs until the next incarnation is counted
        proxy.start()
        await wait_until_done(checker, produced, 120)
        # The clients keep pulling until the commit point reaches the end, as in phase 1: the checker
        # counts a message acked when the client decides to ack it, so an ack lost with the killed
        # connection means a redelivery after the restart, and that copy may be failed or dropped in
        # turn and need one more delivery after every key looks complete.
        offsets = await committed_reaches_end(proxy.port, timeout_s=60)
        stop.set()
        await asyncio.gather(*tasks)
        assert checker.violations == [], checker.violations[:10]
        assert sum(offsets.values()) == 30_000 + QUEUES
        assert sum(c.errors for c in clients) > 0, "the kill should have been seen by the clients"
        print(f"deliveries={checker.deliveries} duplicates={checker.duplicates} stale={checker.stale}")
    finally:
        assert proxy.stop() == 0, proxy.log()
