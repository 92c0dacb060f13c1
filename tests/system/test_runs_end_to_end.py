"""Ordered runs end to end: real proxy processes, real Redis, real Thrift clients.

Clients asking for runs (``maxPerKey``) and clients without, on the same group at once, with fails in
the middle of runs and runs abandoned (their rest times out); a second proxy joins (queues are handed
over while runs are in flight), a client process holding runs is killed, then a proxy is killed
mid-run and the other takes its queues over. Every message is acked and no message of a key is ever
handed out before all earlier messages of that key were acked. A client built from the IDL without
the new fields (an unchanged DDMQ client) gets one message per key on a group read with runs.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import thriftpy2
from thriftpy2.protocol import TCompactProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire

from ..support import OrderChecker, ProxyProcess, produce_keyed

QUEUES = 4
GROUP = "g"
TOPIC = "t"
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100}
GROUP_CONFIG = {
    "actions": ["Json", "Order", "PullServer"], "order_key": "$.k", "timeout_ms": 1000,
    "max_retry": 50, "retry_intervals_ms": [50, 100], "concurrency": 5000,
}

produce = functools.partial(produce_keyed, topic=TOPIC)


def start_proxy(tmp_path: Path, redis_url: str, name: str) -> ProxyProcess:
    home = tmp_path / name
    home.mkdir()
    return ProxyProcess(
        home, redis_url, {GROUP: {TOPIC: GROUP_CONFIG}}, {TOPIC: {"queues": QUEUES}},
        instance_id=name, leases=LEASES, shutdown_grace_ms=500,
    ).start()


class Client:
    """Pulls from one proxy (with runs when ``per_key`` > 1), processes each run in order and stops it at
    a fail or an abandoned message, as the run contract asks; reconnects when the proxy goes away."""

    def __init__(self, port: int, checker: OrderChecker, rng: random.Random, per_key: int | None) -> None:
        self.port = port
        self.checker = checker
        self.rng = rng
        self.per_key = per_key
        self.longest_run = 0
        self.errors = 0
        self.acked = 0

    async def run(self, stop: asyncio.Event) -> None:
        client = AsyncProxyClient("127.0.0.1", self.port, timeout_s=5)
        pending: list[wire.ConsumeResult] = []
        while not stop.is_set():
            request = wire.PullRequest(groupId=GROUP, topic=TOPIC, maxBatchSize=32, maxLingerTime=200,
                                       result=wire.link_results(pending), maxPerKey=self.per_key)
            try:
                response = await client.pull(request)
            except (ProxyClientError, OSError):
                self.errors += 1
                pending = []  # lost with the connection, as a crashed client's: redelivered
                await asyncio.sleep(0.1)
                continue
            pending = [self.handle(response)] if response.messages else []
        if pending:
            try:
                await client.submit(wire.link_results(pending))
            except (ProxyClientError, OSError):
                pass
        await client.close()

    def handle(self, response: wire.PullResponse) -> wire.ConsumeResult:
        messages = response.messages
        sizes = response.runs or [1] * len(messages)
        assert sum(sizes) == len(messages)
        if self.per_key is None:
            assert response.runs is None, "runs for a client that did not ask"
        ok: list[int] = []
        failed: list[int] = []
        start = 0
        for size in sizes:
            run = messages[start:start + size]
            start += size
            self.longest_run = max(self.longest_run, size)
            for message in run:
                event = json.loads(message.value)
                self.checker.delivered(event["k"], event["seq"])
                roll = self.rng.random()
                if roll < 0.03:
                    failed.append(message.offset)
                    break
                if roll < 0.04:
                    break  # abandoned: it and the rest of its run time out
                self.checker.acked(event["k"], event["seq"])
                ok.append(message.offset)
        self.acked += len(ok)
        context = response.context
        return wire.ConsumeResult(context=wire.Context(groupId=GROUP, topic=context.topic, qid=context.qid),
                                  successOffsets=ok, failOffsets=failed)


# A client process that pulls runs and never answers: killed with them in flight.
_HOLDER = """
import sys, time
from ddmq.protocol import wire
from ddmq.client.thrift_client import ProxyClient
with ProxyClient("127.0.0.1", int(sys.argv[1])) as client:
    while True:
        response = client.pull(wire.PullRequest(groupId="g", topic="t", maxBatchSize=64, maxLingerTime=500,
                                                maxPerKey=16))
        if response.runs and max(response.runs) > 1:
            print("holding", len(response.messages), flush=True)
            time.sleep(60)
"""


def ordering_violations(checker: OrderChecker) -> list[str]:
    """Deliveries of a message before every earlier message of its key was acked. (The checker's
    per-epoch head rule does not apply here: a proxy taking a queue over replays from the commit point.)"""
    return [v for v in checker.violations if "before seq" in v]


async def acked_at_least(checker: OrderChecker, count: int, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        while sum(checker.acked_upto.values()) < count:  # noqa: ASYNC110 - the clients' tasks move it
            await asyncio.sleep(0.02)


@pytest.mark.timeout(180)
async def test_runs_keep_order_and_lose_nothing_through_hand_off_client_and_proxy_kills(
    redis_url: str, tmp_path: Path
) -> None:
    rng = random.Random(13)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    proxy_a = start_proxy(tmp_path, redis_url, "proxy-a")
    proxy_b: ProxyProcess | None = None
    stop = asyncio.Event()
    clients: list[Client] = []
    tasks: list[asyncio.Task[None]] = []
    holder: asyncio.subprocess.Process | None = None

    def add_clients(proxy: ProxyProcess) -> None:
        for per_key in (16, 64, None):
            client = Client(proxy.port, checker, random.Random(len(clients)), per_key)
            clients.append(client)
            tasks.append(asyncio.create_task(client.run(stop)))

    try:
        await asyncio.to_thread(produce, redis_url, 6000, produced, rng, keys=60, queues=QUEUES)
        holder = await asyncio.create_subprocess_exec(sys.executable, "-c", _HOLDER, str(proxy_a.port),
                                                      stdout=asyncio.subprocess.PIPE)
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), 30)
        assert line.startswith(b"holding"), line
        add_clients(proxy_a)
        holder.kill()  # its runs stay in flight until they time out
        await holder.wait()
        await acked_at_least(checker, 1500, 60)
        proxy_b = start_proxy(tmp_path, redis_url, "proxy-b")  # A hands queues over, runs in flight
        add_clients(proxy_b)
        async with asyncio.timeout(60):  # keep the runs coming until B serves the queues it took
            while sum(c.acked for c in clients[3:]) < 200:
                await asyncio.to_thread(produce, redis_url, 500, produced, rng, keys=60)
                await asyncio.sleep(0.2)
        proxy_a.kill()  # mid-run: B takes A's queues over after the lease's ttl
        async with asyncio.timeout(90):
            while checker.missing(produced):  # noqa: ASYNC110 - the clients' tasks move it
                await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        assert ordering_violations(checker) == [], ordering_violations(checker)[:10]
        assert checker.missing(produced) == {}
        assert max(c.longest_run for c in clients if c.per_key) > 1, "no run was ever handed out"
        assert sum(c.errors for c in clients[:3]) > 0, "the kill of proxy A should have been seen"
        print(f"deliveries={checker.deliveries} duplicates={checker.duplicates} "
              f"longest runs={[c.longest_run for c in clients]}")
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        if holder is not None and holder.returncode is None:
            holder.kill()
            await holder.wait()
        proxy_a.stop()
        if proxy_b is not None:
            assert proxy_b.stop() == 0, proxy_b.log()


def _old_idl(tmp_path: Path) -> Any:
    """The IDL as DDMQ ships it: the consumer proxy's file without this project's field 80s."""
    text = wire.IDL_PATH.read_text()
    text = re.sub(r"\n\s*80: optional [^;]*;", "", text)
    path = tmp_path / "consumerProxy.thrift"
    path.write_text(text)
    old = thriftpy2.load(str(path), module_name="old_consumerProxy_thrift")
    assert 80 not in old.PullRequest.thrift_spec and 80 not in old.PullResponse.thrift_spec
    return old


async def test_an_unchanged_ddmq_client_gets_one_message_per_key_on_a_group_read_with_runs(
    redis_url: str, tmp_path: Path
) -> None:
    old = _old_idl(tmp_path)
    proxy = start_proxy(tmp_path, redis_url, "proxy-a")
    try:
        produced: dict[str, int] = {}
        await asyncio.to_thread(produce, redis_url, 400, produced, random.Random(3), keys=8, queues=QUEUES)
        async with AsyncProxyClient("127.0.0.1", proxy.port) as client:
            with_runs = await client.pull(wire.PullRequest(groupId=GROUP, topic=TOPIC, maxBatchSize=32,
                                                           maxLingerTime=2000, maxPerKey=8))
            assert with_runs.runs and max(with_runs.runs) > 1

            def old_client_pulls() -> list[list[str]]:
                stock = make_client(old.ConsumerService, "127.0.0.1", proxy.port, timeout=5000,
                                    proto_factory=TCompactProtocolFactory(),
                                    trans_factory=TFramedTransportFactory())
                keys = []
                try:
                    for _ in range(5):
                        response = stock.pull(old.PullRequest(groupId=GROUP, topic=TOPIC, maxBatchSize=32,
                                                              maxLingerTime=1000))
                        keys.append([json.loads(m.value)["k"] for m in response.messages])
                        stock.submit(old.ConsumeResult(context=response.context,
                                                       successOffsets=[m.offset for m in response.messages],
                                                       failOffsets=[]))
                finally:
                    stock.close()
                return keys

            pulls = await asyncio.to_thread(old_client_pulls)
            assert any(pulls), "the old client got nothing"
            for keys in pulls:
                assert len(keys) == len(set(keys)), f"two messages of one key in one reply: {keys}"
    finally:
        assert proxy.stop() == 0, proxy.log()
