"""The product on a real Redis Cluster (3 masters, 1 replica each; ``redis_cluster`` in conftest.py).

- two proxies share a topic whose queues live on all three masters; Thrift clients pull: per-key order,
  nothing lost, committed = produced;
- ``fetch``/``ack`` over queues of different shards (one read per slot, gathered), blocking too;
- dead letters and their replay; ``/metrics`` and the console's lag; ``ddmq produce`` and ``ddmq status``;
- a master is killed with SIGKILL mid-stream: its replica is promoted and delivery resumes by itself;
- one master's queue slots are resharded to another master mid-stream (MOVED, ASK);
- a topic's queues spread over every master.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from redis.crc import key_slot

from ddmq.client.thrift_client import ProxyClient
from ddmq.protocol import wire
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import sync_redis
from ddmq.protocol.redis.queues import ProduceError
from ddmq.proxy.store.embedded_cluster import EmbeddedCluster

from ..support import (
    Delivery,
    ProxyFleet,
    ProxyProcess,
    acked_prefixes,
    body,
    check_order_by_term,
    check_single_reader,
    produce_keyed,
    puller,
)

QUEUES = 8
LEASES = {"ttl_ms": 1500, "renew_ms": 400, "claim_interval_ms": 100, "handoff_drain_ms": 1000}
GROUP = {"order_key": "KEY", "timeout_ms": 3000, "max_retry": 50, "retry_intervals_ms": [20, 100]}


def masters_of(cluster: EmbeddedCluster, topic: str, queues: int) -> dict[int, int]:
    """qid -> port of the master serving its stream."""
    return {qid: cluster.master_of(keys.stream(topic, qid)).port for qid in range(queues)}


def queue_tails(url: str, topic: str, queues: int) -> tuple[list[int], list[int]]:
    """(next produce offset, committed offset of group g) per qid, read through the cluster client."""
    with sync_redis(url) as client:
        produced = [int(client.get(keys.sequence(topic, q)) or 0) + 1 for q in range(queues)]
        committed = [int(client.get(keys.committed("g", topic, q)) or 0) for q in range(queues)]
    return produced, committed


async def wait_for(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(180)
async def test_two_proxies_on_a_cluster_deliver_every_key_in_order(
    redis_cluster: EmbeddedCluster, cluster_url: str, tmp_path: Path
) -> None:
    rng = random.Random(14)
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce_keyed, cluster_url, 4000, produced, rng, keys=400, topic="t", queues=QUEUES)
    placement = masters_of(redis_cluster, "t", QUEUES)
    assert len(set(placement.values())) == 3, f"the 8 queues should span all 3 masters: {placement}"

    fleet = ProxyFleet(tmp_path, cluster_url, {"g": {"t": GROUP}}, {"t": {"queues": QUEUES}}, LEASES)
    log: list[Delivery] = []
    stop = asyncio.Event()
    tasks = []
    try:
        for name in ("proxy-1", "proxy-2"):
            port = (await asyncio.to_thread(fleet.start, name)).port
            for i in range(2):
                tasks.append(asyncio.create_task(puller(name, port, log, stop, random.Random(f"{name}{i}"),
                                                        fail_rate=0.01)))
        # more arrives while they consume
        await asyncio.to_thread(produce_keyed, cluster_url, 4000, produced, rng, keys=400, topic="t", pause_s=0.05)
        await wait_for(lambda: acked_prefixes(log) == produced, 60, "every message acked")
        stop.set()
        await asyncio.gather(*tasks)
        for proxy in fleet.proxies.values():
            assert await asyncio.to_thread(proxy.stop) == 0, proxy.log()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for proxy in fleet.proxies.values():
            proxy.stop()

    produce_next, committed = queue_tails(cluster_url, "t", QUEUES)
    assert committed == produce_next and sum(produce_next) == 8000 + QUEUES
    records = fleet.reads()
    check_single_reader(records)
    assert {r["owner"] for r in records} == {"proxy-1", "proxy-2"}, "both proxies should have read"
    checker = check_order_by_term(records, log)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}


@pytest.fixture
def single_proxy(tmp_path: Path, cluster_url: str) -> Any:
    proxy = ProxyProcess(
        tmp_path, cluster_url,
        groups={"g": {"t": {"order_key": "KEY", "max_retry": 0, "timeout_ms": 2000}}},
        topics={"t": {"queues": QUEUES}}, http={"enabled": True, "port": free_port()}, shutdown_grace_ms=0,
    ).start()
    try:
        yield proxy
    finally:
        assert proxy.stop() == 0, proxy.log()


def fetch(client: ProxyClient, offsets: dict[str, int] | None, batch: int = 1000, linger_ms: int = 0) -> Any:
    return client.fetch(wire.FetchRequest(
        consumerId="c", groupId="g", cluster="local", fetchOffset={"t": offsets} if offsets else None,
        maxBatchSize=batch, maxLingerTime=linger_ms))


@pytest.mark.timeout(60)
def test_fetch_and_ack_across_queues_on_different_shards(
    redis_cluster: EmbeddedCluster, single_proxy: ProxyProcess, cluster_url: str
) -> None:
    with Producer(cluster_url) as producer:
        producer.send_batch("t", [{"value": f"m{i}", "qid": i % QUEUES} for i in range(80)])
    assert len(set(masters_of(redis_cluster, "t", QUEUES).values())) == 3
    with ProxyClient("127.0.0.1", single_proxy.port) as client:
        response = fetch(client, {str(q): 1 for q in range(QUEUES)})
        pages = {int(page.qid): page for page in response.results}
        assert sorted(pages) == list(range(QUEUES))
        for qid, page in pages.items():
            assert [m.offset for m in page.messages] == list(range(1, 11))
            assert [m.value for m in page.messages] == [f"m{qid + QUEUES * i}".encode() for i in range(10)]
            assert page.nextRequestOffset == 11
        # ack positions on every shard, then read "from the stored position"
        client.ack(wire.AckResult(consumerId="c", groupId="g", cluster="local",
                                  offsets={"t": {str(q): 5 + q for q in range(QUEUES)}}))
        stored = {int(p.qid): p for p in fetch(client, None).results}
        firsts = {q: p.messages[0].offset if p.messages else None for q, p in stored.items()}
        assert firsts == {q: 5 + q if 5 + q <= 10 else None for q in range(QUEUES)}
        # a blocking fetch over every queue answers as soon as one shard has a message
        ends = {str(q): 11 for q in range(QUEUES)}
        timer = threading.Timer(0.3, lambda: Producer(cluster_url).send("t", "late", qid=5))
        timer.start()
        started = time.monotonic()
        late = fetch(client, ends, linger_ms=5000)
        waited = time.monotonic() - started
        timer.join()
    got = {int(p.qid): [m.value for m in p.messages] for p in late.results}
    assert got[5] == [b"late"] and all(not v for q, v in got.items() if q != 5)
    assert waited < 3, f"the fetch lingered {waited:.1f}s although a message arrived after 0.3s"


def http(proxy: ProxyProcess, path: str, payload: dict[str, Any] | None = None) -> bytes:
    """GET (or POST ``payload`` to) the proxy's HTTP server."""
    config = yaml.safe_load(proxy.config_path.read_text())
    request = urllib.request.Request(
        f"http://127.0.0.1:{config['http']['port']}/{path}",
        data=None if payload is None else json.dumps(payload).encode(), method="GET" if payload is None else "POST",
        headers={} if payload is None else {"Content-Type": "application/json"})  # the proxy takes JSON bodies only
    with urllib.request.urlopen(request, timeout=10) as answer:
        body: bytes = answer.read()
        return body


def admin(proxy: ProxyProcess, path: str, payload: dict[str, Any] | None = None) -> Any:
    return json.loads(http(proxy, f"admin/{path}", payload))


def pull_all(client: ProxyClient, count: int, fail: set[str]) -> list[str]:
    """Pull until ``count`` messages came; fail (once) those whose key is in ``fail``, ack the rest."""
    delivered: list[str] = []
    pending: list[wire.ConsumeResult] = []
    deadline = time.monotonic() + 30
    while len(delivered) < count:
        assert time.monotonic() < deadline, f"only {delivered} were delivered"
        response = client.pull(wire.PullRequest(groupId="g", topic="t", maxBatchSize=64, maxLingerTime=200,
                                                result=wire.link_results(pending)))
        ok, bad = [], []
        for message in response.messages:
            key = json.loads(message.value)["k"]
            delivered.append(key)
            (bad if key in fail else ok).append(message.offset)
        fail -= set(delivered)
        pending = [wire.ConsumeResult(context=response.context, successOffsets=ok, failOffsets=bad)]
    client.submit(wire.link_results(pending))
    return delivered


@pytest.mark.timeout(90)
def test_dead_letters_replay_and_status_on_a_cluster(single_proxy: ProxyProcess, cluster_url: str) -> None:
    with Producer(cluster_url) as producer:
        producer.send_batch("t", [{"key": f"k{i}", "value": body(f"k{i}", 0)} for i in range(20)])
    poison = {"k1", "k2", "k3", "k4", "k5"}  # spread over several queues, so several shards
    with ProxyClient("127.0.0.1", single_proxy.port) as client:
        assert sorted(pull_all(client, 20, set(poison))) == sorted(f"k{i}" for i in range(20))
        deadline = time.monotonic() + 10
        while admin(single_proxy, "groups/g/topics/t/dead-letters")["total"] < 5:  # max_retry 0: at once
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert admin(single_proxy, "groups/g/topics/t/dead-letters/replay", {"all": True})["replayed"] == 5
        assert sorted(pull_all(client, 5, set())) == sorted(poison)
    assert admin(single_proxy, "groups/g/topics/t/dead-letters")["total"] == 0
    # what /metrics and the console read from Redis: per-slot reads of offsets, leases, lag
    metrics = http(single_proxy, "metrics").decode()
    for line in ('ddmq_dead_letters{group="g"} 0.0', 'ddmq_queues_without_owner{group="g"} 0.0',
                 'ddmq_lag_messages{group="g",topic="t"}'):
        assert line in metrics, metrics[-3000:]
    deadline = time.monotonic() + 12  # the console samples every 5 s; the first may precede the consumer
    while not admin(single_proxy, "groups/g/lag-history")["topics"].get("t"):
        assert time.monotonic() < deadline, "the console's lag sampler read nothing"
        time.sleep(0.2)
    assert "metrics:" not in single_proxy.log() and "lag history" not in single_proxy.log(), single_proxy.log()

    cli = [sys.executable, "-m", "ddmq.client.cli"]
    produced = subprocess.run(
        [*cli, "produce", "--redis", cluster_url, "--topic", "t"], input='{"key": "k99", "value": "by the CLI"}\n',
        capture_output=True, text=True, timeout=30, check=True,
    )
    assert "sent 1 message(s)" in produced.stderr
    status = subprocess.run(
        [*cli, "status", "--redis", cluster_url, "--group", "g", "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    rows = json.loads(status.stdout)["queues"]
    assert [row["qid"] for row in rows] == list(range(QUEUES))
    assert {row["owner"] for row in rows} == {"e2e-proxy"}
    assert sum(row["produced"] - 1 for row in rows) == 26


class SteadyProducer(threading.Thread):
    """Produces keyed messages in batches until told to stop; retries a batch that fails (a master is
    down) until it goes through, and records only what Redis acknowledged. ``hold`` pauses it."""

    def __init__(self, url: str, keys_: int, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.url, self.keys, self.rng = url, keys_, rng
        self.acknowledged: list[tuple[str, int]] = []
        self.next_seq: dict[str, int] = {}
        self.failures = 0
        self.hold, self.held, self.stop = threading.Event(), threading.Event(), threading.Event()

    def run(self) -> None:
        with Producer(self.url) as producer:
            while not self.stop.is_set():
                if self.hold.is_set():
                    self.held.set()
                    time.sleep(0.01)
                    continue
                batch = []
                for _ in range(50):
                    key = f"key-{self.rng.randrange(self.keys)}"
                    seq = self.next_seq.get(key, 0)
                    self.next_seq[key] = seq + 1
                    batch.append((key, seq))
                while not self.stop.is_set():
                    try:
                        producer.send_batch("t", [{"key": k, "value": body(k, s)} for k, s in batch])
                        break
                    except ProduceError:
                        self.failures += 1
                        time.sleep(0.1)
                else:
                    return
                self.acknowledged.extend(batch)
                time.sleep(0.02)


def stored_messages(url: str, topic: str, queues: int) -> dict[tuple[int, int], tuple[str, int]]:
    """Every message in the topic's streams now: (qid, offset) -> (key, seq)."""
    found = {}
    with sync_redis(url) as client:
        for qid in range(queues):
            for entry_id, fields in client.xrange(keys.stream(topic, qid)):
                event = json.loads(fields[b"v"])
                found[(qid, keys.offset_of(entry_id))] = (event["k"], event["seq"])
    return found


def by_stream_position(stored: dict[tuple[int, int], tuple[str, int]], log: list[Delivery]) -> list[Delivery]:
    """``log`` with each delivery's seq replaced by its message's place among its key's stored messages.

    A producer batch retried after an error that had in fact been written is stored twice; the proxy
    owes the stream's order, copies included, so that is the order checked."""
    place: dict[tuple[int, int], int] = {}
    count: dict[str, int] = {}
    for (qid, offset), (key, _) in sorted(stored.items(), key=lambda item: item[1][1]):
        place[(qid, offset)] = count.get(key, 0)
        count[key] = place[(qid, offset)] + 1
    return [dataclasses.replace(d, seq=place[(d.qid, d.offset)]) for d in log]


class ProducingRun:
    """A backlog, then a proxy with two pullers on topic ``t`` while a :class:`SteadyProducer` writes;
    :meth:`finish` drains every stored message and checks the proxy rode through whatever happened."""

    def __init__(self, cluster_url: str, tmp_path: Path, leases: dict[str, Any]) -> None:
        self.url = cluster_url
        # The check reads every stored message back (copies of retried batches included), so the streams
        # keep what was consumed (no consumed trim).
        topics = {"t": {"queues": QUEUES, "retention": {"consumed": False}}}
        self.fleet = ProxyFleet(tmp_path, cluster_url, {"g": {"t": GROUP}}, topics, leases)
        self.producer = SteadyProducer(cluster_url, 300, random.Random(7))
        self.log: list[Delivery] = []
        self.stop = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, backlog: int) -> None:
        produced: dict[str, int] = {}
        await asyncio.to_thread(produce_keyed, self.url, backlog, produced, random.Random(1414), keys=300,
                                topic="t", queues=QUEUES)
        self.producer.next_seq.update(produced)
        self.producer.acknowledged.extend((k, s) for k, n in produced.items() for s in range(n))
        proxy = await asyncio.to_thread(self.fleet.start, "proxy-1")
        self.tasks = [asyncio.create_task(puller("proxy-1", proxy.port, self.log, self.stop, random.Random(i)))
                      for i in range(2)]
        self.producer.start()

    async def finish(self) -> dict[tuple[int, int], tuple[str, int]]:
        """Stop producing, wait until every stored message was acked, stop; returns what is stored."""
        await asyncio.sleep(1)  # keep producing and consuming on the new layout for a while
        self.producer.stop.set()
        await asyncio.to_thread(self.producer.join, 30)
        stored = await asyncio.to_thread(stored_messages, self.url, "t", QUEUES)
        per_key: dict[str, int] = {}
        for key, _ in stored.values():
            per_key[key] = per_key.get(key, 0) + 1
        await wait_for(lambda: acked_prefixes(by_stream_position(stored, self.log)) == per_key, 60,
                       "every stored message acked")
        self.stop.set()
        await asyncio.gather(*self.tasks)
        proxy = self.fleet.proxies["proxy-1"]
        assert proxy.proc is not None and proxy.proc.poll() is None, "the proxy must ride through without a restart"
        assert await asyncio.to_thread(proxy.stop) == 0, proxy.log()
        produce_next, committed = queue_tails(self.url, "t", QUEUES)
        assert committed == produce_next
        checker = check_order_by_term(self.fleet.reads(), by_stream_position(stored, self.log))
        assert checker.violations == [], checker.violations[:5]
        assert checker.missing(per_key) == {}
        self.duplicates = checker.duplicates
        return stored

    async def close(self) -> None:
        self.stop.set()
        self.producer.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for proxy in self.fleet.proxies.values():
            proxy.stop()


@pytest.mark.timeout(180)
async def test_a_killed_master_fails_over_and_delivery_resumes_in_order(
    redis_cluster: EmbeddedCluster, cluster_url: str, tmp_path: Path
) -> None:
    run = ProducingRun(cluster_url, tmp_path, {**LEASES, "ttl_ms": 3000, "renew_ms": 500})
    victim = redis_cluster.master_of(keys.stream("t", 0))
    victim_qids = {q for q, port in masters_of(redis_cluster, "t", QUEUES).items() if port == victim.port}
    try:
        await run.start(backlog=2000)
        await wait_for(lambda: sum(d.acked for d in run.log) >= 2500, 60, "consumption under way")
        # The producer pauses for 50 ms before the kill, so the replica has every acknowledged write
        # (see the README: writes acknowledged in the last moment before a crash may be lost).
        run.producer.hold.set()
        await asyncio.to_thread(run.producer.held.wait, 10)
        await asyncio.sleep(0.05)
        killed_at = time.monotonic()
        victim.kill()
        run.producer.hold.clear()
        deliveries_before = len(run.log)
        await wait_for(lambda: redis_cluster.master_of(keys.stream("t", 0)).port != victim.port, 30, "promotion")
        promoted_s = time.monotonic() - killed_at
        await wait_for(lambda: any(d.qid in victim_qids for d in run.log[deliveries_before:]), 30,
                       "deliveries from the failed-over shard")
        resumed_s = time.monotonic() - killed_at
        stored = await run.finish()
    finally:
        await run.close()

    acknowledged = set(run.producer.acknowledged)
    present = set(stored.values())
    lost = acknowledged - present
    assert not lost, f"{len(lost)} acknowledged messages are not in Redis after the failover: {sorted(lost)[:5]}"
    print(f"\nfailover: produced and acknowledged {len(acknowledged)}, in Redis after the failover "
          f"{len(present)} (+{len(stored) - len(present)} stored twice by a retried batch), lost {len(lost)}, "
          f"delivered {len({(d.key, d.seq) for d in run.log})} distinct ({len(run.log)} deliveries, "
          f"{run.duplicates} redelivered); promoted after {promoted_s:.1f}s, delivery from that shard "
          f"resumed after {resumed_s:.1f}s; {run.producer.failures} producer batch(es) retried")


@pytest.mark.timeout(120)
async def test_queues_resharded_to_another_master_mid_stream(
    redis_cluster: EmbeddedCluster, cluster_url: str, tmp_path: Path
) -> None:
    """MOVED and ASK: the slots of one master's queues move, key by key, to another master while a
    proxy reads, commits and renews leases there and a producer writes; nothing is restarted."""
    run = ProducingRun(cluster_url, tmp_path, LEASES)
    placement = masters_of(redis_cluster, "t", QUEUES)
    target = next(node for node in redis_cluster.master_nodes() if node.port != placement[0])
    moving = sorted(q for q, port in placement.items() if port == placement[0])
    try:
        await run.start(backlog=1000)
        await wait_for(lambda: len(run.log) >= 800, 30, "consumption under way")
        moved = 0
        for qid in moving:
            slot = key_slot(keys.stream("t", qid).encode())
            moved += await asyncio.to_thread(redis_cluster.migrate_slot, slot, target, 1, 0.05)
        assert moved >= 3 * len(moving)  # stream, sequence, committed offset, lease, ...
        assert {masters_of(redis_cluster, "t", QUEUES)[q] for q in moving} == {target.port}
        stored = await run.finish()
    finally:
        await run.close()
    assert set(run.producer.acknowledged) <= set(stored.values())
    print(f"\nreshard: {len(moving)} queue slot(s), {moved} keys moved to {target.port}; "
          f"{len(stored)} messages delivered in order; {run.producer.failures} producer batch(es) retried")


@pytest.mark.parametrize(("queues", "fewest"), [(8, 2), (64, 20)])
def test_a_topics_queues_spread_over_every_master(redis_cluster: EmbeddedCluster, queues: int, fewest: int) -> None:
    """Each queue's hash tag ``{rides:<qid>}`` picks its slot (CRC16 mod 16384); redis-cli gave each
    master a third of the slots. The README quotes these figures."""
    with redis_cluster.master_nodes()[0].client() as client:
        ranges = {(start, end): int(master[1]) for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS")}
        slots = [int(client.execute_command("CLUSTER", "KEYSLOT", keys.stream("rides", q))) for q in range(queues)]
    per_master = {port: 0 for port in ranges.values()}
    for slot in slots:
        per_master[next(port for (start, end), port in ranges.items() if start <= slot <= end)] += 1
    spread = sorted(per_master.values(), reverse=True)
    print(f"\n{queues} queues of 'rides' over 3 masters: {spread}")
    assert len(spread) == 3 and min(spread) >= fewest and sum(spread) == queues
