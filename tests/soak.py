"""Soak: a proxy cluster under crashes of every part, checked message by message.

``python bench/soak.py [--messages N] [--quick] [--json PATH]`` runs it (everything on 127.0.0.1, bounded
in time, stops by itself); ``tests/system/test_soak.py`` runs a small one. It lives in ``tests/`` because it
checks correctness, with the harness the benchmarks use too (``tests/harness/``). What runs:

- a private redis-server with ``appendfsync always`` (``EmbeddedRedis``), so a kill -9 of Redis loses
  nothing it acknowledged: whatever the run loses, the proxies lost;
- ``proxies`` real ``ddmq-proxy`` processes (default 3) sharing one group with leases, each writing
  its stream reads with their lease term to an ``audit_log``;
- a steady keyed producer (``keys`` keys over 8 queues, each body ``{"k": key, "seq": n}`` with the
  key's next sequence number), in a thread of this process;
- ``consumers`` consumer processes (default 3), each with one Thrift connection to every proxy
  (``AsyncProxyClient``; batch 64, acks on the next pull, 1% failed on purpose so retries happen
  too), writing every delivery to a file as it is acknowledged;
- a fault schedule of ``rounds`` rounds (quick 1, full 2), each: **proxy-kill** (kill -9 of a proxy,
  restarted once the others took its queues over), **consumer-kill** (a consumer stops in the middle
  of a batch it has received, none of it acknowledged, and is killed with kill -9, then restarted),
  **redis-kill** (kill -9 of redis-server, started again on the same port from its AOF
  ``redis_down_s`` later) and **proxy-stop** (SIGSTOP of a proxy until the others took its queues
  over, past its lease TTL, then SIGCONT: it must be fenced off). The producer pauses at each fault's
  threshold (an even share of the messages) until that fault begins, so every fault strikes
  mid-stream; ``gap_s`` of steady running separates two faults.

At the end the consumers run until the committed offsets reach the produce offsets (bounded by
``drain_timeout_s``), everything stops, and the records are checked:

- **lost**: produced messages no consumer ever acknowledged (a consumer's acknowledgement counts once
  it was sent to the proxy: the batch a killed consumer held counts as delivered, not acked);
- **order**: the deliveries of all consumers merged by time and replayed through the tests'
  ``OrderChecker`` (``tests/support.py``), each delivery's epoch being the lease term its proxy read
  it under (from the audit; the latest read of that offset by that proxy before the delivery). Within
  a term a key is only ever delivered at its head (the first message not yet acked, or a redelivery
  of it); a new term may replay from its committed point (the at-least-once cost of a move); a
  delivery of a later message before its predecessor was acked is always a violation;
- **committed = produced**: per queue, the committed offset equals the next produce offset;
- **one reader per (queue, term)**: ``check_single_reader`` over the audit (one owner per term, each
  term's reads ending before the next term's begin), and the reads a stopped proxy made after SIGCONT
  under a term that had been taken over (``stale reads``).

Figures: messages produced, deliveries, redelivered (deliveries beyond one per message), failed on
purpose, order violations, lost, and per fault the time until delivery resumed: proxy-kill and
proxy-stop, until every queue the victim owned delivered again from a live proxy; consumer-kill, until
every message of the killed batch was delivered to another consumer; redis-kill, until every queue
delivered a message produced after Redis came back. Exit status: 0 when every check held, 3 when one
failed (the table says which), 1 when the harness broke.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.queues import ProduceError
from tests.harness.clientproc import ClientProcess, Ready
from tests.harness.machine import cpu_available, load_average, log, meta
from tests.harness.stack import HarnessError, ProxyRun, RedisServer
from tests.support import Delivery, OrderChecker, body, check_single_reader, term_of

__all__ = ["SoakConfig", "SoakResult", "main", "run_soak"]

TOPIC = "t"
GROUP = "g"
QUEUES = 8
LEASES = {"ttl_ms": 1500, "renew_ms": 400, "claim_interval_ms": 100, "handoff_drain_ms": 1500}
GROUP_CONFIG = {"order_key": "KEY", "timeout_ms": 3000, "max_retry": 50, "retry_intervals_ms": [20, 100]}
COMMIT_INTERVAL_MS = 200
FAULTS = ("proxy-kill", "consumer-kill", "redis-kill", "proxy-stop")
BATCH = 64
LINGER_MS = 200
#: How long a fault may take to play out (a takeover, a paused consumer) before the harness gives up.
FAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SoakConfig:
    messages: int = 60_000
    keys: int = 2_000
    proxies: int = 3
    consumers: int = 3
    rounds: int = 2
    #: Messages per second the producer aims at (it also waits at each fault's threshold).
    rate: float = 1500.0
    gap_s: float = 3.0
    redis_down_s: float = 1.0
    fail_rate: float = 0.01
    seed: int = 1
    drain_timeout_s: float = 120.0

    @property
    def faults(self) -> list[str]:
        return [kind for _ in range(self.rounds) for kind in FAULTS]


# -- the consumer processes -------------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerSpec:
    """One consumer incarnation: its name (``c2.1``: consumer 2, second start), the proxies it pulls
    from (one connection each) and its files: deliveries, and the flags the harness sets."""

    name: str
    proxies: tuple[tuple[str, int], ...]
    out: str
    stop: str
    pause: str
    paused: str
    seed: str
    fail_rate: float


async def consume(spec: ConsumerSpec, ready: Ready) -> dict[str, Any]:
    """Pull from every proxy until ``spec.stop`` exists; one JSON line per delivery (see ``_pull``)."""
    stop = asyncio.Event()
    counts = {"deliveries": 0}
    # Local files, a short write per batch: blocking calls on purpose (the flag files are one stat each).
    with open(spec.out, "a", encoding="utf-8") as out:  # noqa: ASYNC230
        tasks = [
            asyncio.create_task(_pull(spec, owner, port, out, stop, random.Random(f"{spec.seed}{owner}"), counts))
            for owner, port in spec.proxies
        ]
        ready()
        stop_path = Path(spec.stop)
        while not stop_path.exists():  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*tasks)
    return counts


async def _pull(spec: ConsumerSpec, owner: str, port: int, out: Any, stop: asyncio.Event, rng: random.Random,
                counts: dict[str, int]) -> None:
    """Pull, write the batch's lines, send its results with the next pull.

    A line is ``[t, ta, owner, qid, offset, key, seq, acked, produce_ms, consumer]``: ``t`` when the
    batch arrived, ``ta`` when its results were handed to the connection (written just before, so a
    line saying acked never describes an ack that was not sent). When ``spec.pause`` exists, the next
    batch of two or more messages is held, written as not acked with ``ta`` 0, ``spec.paused`` is
    created and the process blocks until the harness kills it: killed mid-batch, its results never sent.
    """
    pending: wire.ConsumeResult | None = None
    pause = Path(spec.pause)
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
        while not stop.is_set():
            try:
                response = await client.pull(wire.PullRequest(
                    groupId=GROUP, topic=TOPIC, maxBatchSize=BATCH, maxLingerTime=LINGER_MS, result=pending))
            except ProxyClientError:
                pending = None  # sent or not, the proxy redelivers what it did not get
                await asyncio.sleep(0.2)
                continue
            pending = None
            messages = response.messages or []
            if not messages:
                continue
            arrived = time.time()
            qid = int(response.context.qid)
            ok: list[int] = []
            failed: list[int] = []
            lines = []
            for message in messages:
                event = json.loads(message.value)
                acked = rng.random() >= spec.fail_rate
                (ok if acked else failed).append(message.offset)
                lines.append([arrived, 0.0, owner, qid, message.offset, event["k"], event["seq"], acked,
                              message.produceTime or 0, spec.name])
            if len(messages) >= 2 and pause.exists():  # noqa: ASYNC240
                _held_until_killed(spec, out, lines)
            sent = time.time()
            for line in lines:
                line[1] = sent
            out.write("".join(json.dumps(line) + "\n" for line in lines))
            out.flush()
            counts["deliveries"] += len(lines)
            pending = wire.ConsumeResult(context=response.context, successOffsets=ok, failOffsets=failed)
        if pending is not None:
            with contextlib.suppress(ProxyClientError):
                await client.submit(pending)


def _held_until_killed(spec: ConsumerSpec, out: Any, lines: list[list[Any]]) -> None:
    for line in lines:
        line[7] = False  # none of these results will ever be sent: not acked, and ``ta`` stays 0
    out.write("".join(json.dumps(line) + "\n" for line in lines))
    out.flush()
    staged = Path(spec.paused + ".tmp")
    staged.write_text(json.dumps({"held": len(lines), "t": time.time()}))
    staged.replace(spec.paused)  # the harness never reads it half written
    time.sleep(FAULT_TIMEOUT_S)  # blocks the whole process, every connection: the harness kills it now
    raise HarnessError(f"consumer {spec.name} was not killed while it held a batch")


class Consumer:
    """Consumer ``index``: its incarnations (one ClientProcess each) and files in ``folder``."""

    def __init__(self, index: int, folder: Path, proxies: tuple[tuple[str, int], ...], config: SoakConfig) -> None:
        self.index = index
        self.folder = folder
        self.proxies = proxies
        self.config = config
        self.incarnation = -1
        self.process: ClientProcess | None = None

    @property
    def name(self) -> str:
        return f"c{self.index}.{self.incarnation}"

    def path(self, what: str) -> Path:
        return self.folder / f"c{self.index}.{what}"

    def start(self) -> None:
        self.incarnation += 1
        spec = ConsumerSpec(
            self.name, self.proxies, str(self.folder / f"{self.name}.jsonl"), str(self.folder / "stop"),
            str(self.path("pause")), str(self.path("paused")), f"{self.config.seed}-{self.name}", self.config.fail_rate,
        )
        self.process = ClientProcess(consume, spec).start()
        self.process.wait_ready(60)

    def kill_mid_batch(self) -> dict[str, Any]:
        """Have it hold its next batch, then kill -9 it; returns what it held and when it died."""
        assert self.process is not None
        self.path("pause").touch()
        paused = self.path("paused")
        _wait_until(paused.exists, FAULT_TIMEOUT_S, f"consumer {self.name} holding a batch")
        held = json.loads(paused.read_text())
        killed_at = time.time()
        self.process.kill()
        self.process.stop()
        self.path("pause").unlink()
        paused.unlink()
        return {"victim": self.name, "held": held["held"], "t": killed_at}


# -- the producer ----------------------------------------------------------------------------------


class SteadyProducer(threading.Thread):
    """Produces ``config.messages`` keyed messages at ``config.rate``, never past :attr:`allowed`.

    A batch that fails (Redis went away) is checked against the streams once Redis answers again:
    what it finds already stored is not sent again, so a lost reply never duplicates a message (the
    producer's script writes one queue's share of a batch atomically, and a key always goes to the
    same queue, so per key a batch landed whole or not at all).
    """

    def __init__(self, redis_url: str, config: SoakConfig, first_allowed: int) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.redis_url = redis_url
        self.config = config
        self.rng = random.Random(config.seed)
        self.produced: dict[str, int] = {}
        self.count = 0
        self.allowed = first_allowed
        #: Batches that failed while Redis was away, and of their messages those found already stored.
        self.failed_batches = 0
        self.found_stored = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self._cond = threading.Condition()

    def allow(self, count: int) -> None:
        with self._cond:
            self.allowed = count
            self._cond.notify_all()

    def halt(self) -> None:
        self._halt.set()
        self.allow(self.config.messages)

    def wait_for(self, count: int, timeout_s: float) -> None:
        _wait_until(lambda: self.count >= count or self.error is not None, timeout_s, f"{count} messages produced")
        if self.error is not None:
            raise HarnessError(f"the producer failed: {self.error!r}")

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:
            self.error = exc

    def _produce(self) -> None:
        per_batch = max(1, min(500, round(self.config.rate / 20)))
        interval = per_batch / self.config.rate
        due = time.monotonic()
        # No redis-py retries: the checks need to know exactly which messages exist, so a failed batch
        # surfaces at once and _send settles what of it was stored.
        with redis.Redis.from_url(self.redis_url, retry=Retry(NoBackoff(), 0)) as client:
            producer = Producer(client)
            while self.count < self.config.messages and not self._halt.is_set():
                with self._cond:
                    while self.count >= self.allowed:
                        self._cond.wait()
                        due = time.monotonic()
                size = min(per_batch, self.allowed - self.count, self.config.messages - self.count)
                batch = []
                for _ in range(size):
                    key = f"k{self.rng.randrange(self.config.keys):05d}"
                    seq = self.produced.get(key, 0)
                    self.produced[key] = seq + 1
                    batch.append({"key": key, "value": body(key, seq)})
                self._send(producer, client, batch)
                self.count += size
                due += interval
                time.sleep(max(0.0, due - time.monotonic()))

    def _send(self, producer: Producer, client: redis.Redis, batch: list[dict[str, str]]) -> None:
        while batch:
            try:
                producer.send_batch(TOPIC, batch)
                return
            except ProduceError:
                self.failed_batches += 1
            while not self._halt.is_set():
                time.sleep(0.1)
                try:
                    missing = self._not_stored(client, batch)
                    self.found_stored += len(batch) - len(missing)
                    batch = missing
                    break
                except redis.RedisError:
                    continue
            else:
                raise HarnessError("halted while Redis was away")

    @staticmethod
    def _not_stored(client: redis.Redis, batch: list[dict[str, str]]) -> list[dict[str, str]]:
        stored: set[bytes] = set()
        for qid in {queue_for_key(m["key"], QUEUES) for m in batch}:
            for _, fields in client.xrevrange(keys.stream(TOPIC, qid), count=len(batch)):
                stored.add(fields[b"v"])
        return [m for m in batch if m["value"].encode() not in stored]


# -- the run ---------------------------------------------------------------------------------------


def _wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise HarnessError(f"soak: {what} did not happen within {timeout_s:g}s")
        time.sleep(0.02)


def _leases(redis_url: str) -> dict[int, str]:
    """Queue -> current lease owner (queues without a lease are left out); {} while Redis is away."""
    try:
        with redis.Redis.from_url(redis_url, socket_timeout=2) as client:
            raw = client.mget([keys.lease(GROUP, TOPIC, q) for q in range(QUEUES)])
    except redis.RedisError:
        return {}
    return {q: v.decode().rsplit(" ", 1)[0] for q, v in enumerate(raw) if v}


def _offsets(redis_url: str) -> tuple[list[int], list[int]]:
    """(committed, next produce offset) per queue."""
    with redis.Redis.from_url(redis_url, socket_timeout=2) as client:
        committed = client.mget([keys.committed(GROUP, TOPIC, q) for q in range(QUEUES)])
        sequence = client.mget([keys.sequence(TOPIC, q) for q in range(QUEUES)])
    return [int(c or 0) for c in committed], [int(s or 0) + 1 for s in sequence]


def _drained(redis_url: str) -> bool:
    try:
        committed, produce_next = _offsets(redis_url)
    except redis.RedisError:
        return False
    return committed == produce_next


class Soak:
    def __init__(self, config: SoakConfig, folder: Path) -> None:
        self.config = config
        self.folder = folder
        self.redis = RedisServer(appendfsync="always")
        self.proxies: dict[str, ProxyRun] = {}
        self._proxy_runs = contextlib.ExitStack()  # stops them and deletes their folders
        self.consumers: list[Consumer] = []
        self.faults: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return self.redis.url

    def start(self) -> None:
        self.redis.start()
        with Producer(self.url) as producer:
            producer.ensure_topic(TOPIC, QUEUES)
        for i in range(1, self.config.proxies + 1):
            name = f"proxy-{i}"
            self.proxies[name] = self._proxy_runs.enter_context(ProxyRun(
                # The producer finds what a failed batch wrote by reading the streams' tails back, so
                # consumed entries stay (no consumed trim).
                self.url, groups={GROUP: {TOPIC: GROUP_CONFIG}},
                topics={TOPIC: {"queues": QUEUES, "retention": {"consumed": False}}},
                instance_id=name, leases=LEASES, commit_interval_ms=COMMIT_INTERVAL_MS,
                audit_log=str(self.folder / f"{name}.reads.jsonl"),
            ))
        _wait_until(lambda: len(set(_leases(self.url).values())) == self.config.proxies, 30, "the queues split")
        addresses = tuple((name, proxy.port) for name, proxy in self.proxies.items())
        for i in range(1, self.config.consumers + 1):
            consumer = Consumer(i, self.folder, addresses, self.config)
            consumer.start()
            self.consumers.append(consumer)

    def owned_by(self, name: str) -> list[int]:
        return sorted(q for q, owner in _leases(self.url).items() if owner == name)

    def taken_over(self, name: str, queues: list[int]) -> Callable[[], bool]:
        def check() -> bool:
            owners = _leases(self.url)
            return all(owners.get(q) not in (None, name) for q in queues)
        return check

    def proxy_kill(self, name: str) -> dict[str, Any]:
        _wait_until(lambda: bool(self.owned_by(name)), FAULT_TIMEOUT_S, f"{name} holding a queue")
        owned = self.owned_by(name)
        began = time.time()
        self.proxies[name].kill()
        _wait_until(self.taken_over(name, owned), FAULT_TIMEOUT_S, f"{name}'s queues taken over")
        back = time.time()
        self.proxies[name].start()
        return {"victim": name, "queues": owned, "t": began, "t_back": back}

    def proxy_stop(self, name: str) -> dict[str, Any]:
        _wait_until(lambda: bool(self.owned_by(name)), FAULT_TIMEOUT_S, f"{name} holding a queue")
        owned = self.owned_by(name)
        pid = self.proxies[name].pid
        began = time.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            _wait_until(self.taken_over(name, owned), FAULT_TIMEOUT_S, f"{name}'s queues taken over")
            time.sleep(0.5)  # the new owners are serving them
        finally:
            back = time.time()
            os.kill(pid, signal.SIGCONT)
        return {"victim": name, "queues": owned, "t": began, "t_back": back}

    def redis_kill(self) -> dict[str, Any]:
        began = time.time()
        self.redis.kill()
        time.sleep(self.config.redis_down_s)
        self.redis.restart()
        return {"victim": "redis-server", "queues": list(range(QUEUES)), "t": began, "t_back": time.time()}

    def consumer_kill(self, consumer: Consumer) -> dict[str, Any]:
        fault = consumer.kill_mid_batch()
        consumer.start()
        fault["t_back"] = time.time()
        return fault

    def run_fault(self, kind: str, round_: int) -> dict[str, Any]:
        names = list(self.proxies)
        if kind == "proxy-kill":
            fault = self.proxy_kill(names[round_ % len(names)])
        elif kind == "proxy-stop":
            fault = self.proxy_stop(names[(round_ + 1) % len(names)])
        elif kind == "redis-kill":
            fault = self.redis_kill()
        else:
            fault = self.consumer_kill(self.consumers[round_ % len(self.consumers)])
        return {"kind": kind, **fault}

    def stop_consumers(self) -> None:
        (self.folder / "stop").touch()
        for consumer in self.consumers:
            if consumer.process is not None:
                consumer.process.result(30)
                consumer.process.stop()

    def close(self) -> None:
        for consumer in self.consumers:
            if consumer.process is not None:
                consumer.process.stop()
        for proxy in self.proxies.values():
            with contextlib.suppress(OSError, HarnessError):
                os.kill(proxy.pid, signal.SIGCONT)
        try:
            self._proxy_runs.close()
        finally:
            self.redis.stop()


@dataclass
class SoakResult:
    config: SoakConfig
    figures: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_json(self) -> dict[str, Any]:
        return {"config": asdict(self.config), "figures": self.figures, "faults": self.faults,
                "problems": self.problems, "ok": self.ok}


def run_soak(config: SoakConfig, folder: Path) -> SoakResult:
    """Run the whole soak with its files in ``folder``; returns the figures and every check's outcome."""
    began = time.time()
    faults = config.faults
    thresholds = [config.messages * (i + 1) // (len(faults) + 1) for i in range(len(faults))]
    soak = Soak(config, folder)
    producer: SteadyProducer | None = None
    try:
        soak.start()
        log(f"soak: {config.proxies} proxies, {config.consumers} consumers up; producing {config.messages} messages")
        producer = SteadyProducer(soak.url, config, thresholds[0] if thresholds else config.messages)
        producer.start()
        for i, kind in enumerate(faults):
            producer.wait_for(thresholds[i], FAULT_TIMEOUT_S + config.messages / config.rate)
            producer.allow(thresholds[i + 1] if i + 1 < len(faults) else config.messages)
            fault = soak.run_fault(kind, i // len(FAULTS))
            fault["produced_before"] = thresholds[i]
            soak.faults.append(fault)
            log(f"soak: {kind} ({fault['victim']}) done at {producer.count} produced")
            time.sleep(config.gap_s)
        producer.wait_for(config.messages, FAULT_TIMEOUT_S + config.messages / config.rate)
        drain_began = time.time()
        drained = True
        try:
            _wait_until(lambda: _drained(soak.url), config.drain_timeout_s, "the drain")
        except HarnessError:
            drained = False
        drain_s = time.time() - drain_began
        soak.stop_consumers()
        for proxy in soak.proxies.values():
            proxy.stop()
        committed, produce_next = _offsets(soak.url)
    finally:
        if producer is not None:
            producer.halt()
        soak.close()
    assert producer is not None
    result = check(config, folder, producer.produced, soak.faults)
    result.figures.update(
        wall_s=round(time.time() - began, 1), drain_s=round(drain_s, 1), drained=drained,
        producer_failed_batches=producer.failed_batches, producer_found_stored=producer.found_stored,
        committed=committed, produce_next=produce_next,
    )
    if committed != produce_next:
        result.problems.append(f"committed offsets {committed} != produce offsets {produce_next}")
    return result


# -- the checks ------------------------------------------------------------------------------------


@dataclass
class Received(Delivery):
    ta: float = 0.0
    produce_ms: int = 0
    consumer: str = ""


def read_deliveries(folder: Path) -> list[Received]:
    log_: list[Received] = []
    for path in sorted(folder.glob("c*.jsonl")):
        for line in path.read_text().splitlines():
            t, ta, owner, qid, offset, key, seq, acked, produce_ms, consumer = json.loads(line)
            log_.append(Received(owner, qid, offset, key, seq, acked, t, ta, produce_ms, consumer))
    log_.sort(key=lambda d: d.t or 0.0)
    return log_


def read_audit(folder: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted(folder.glob("*.reads.jsonl")):
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    records.sort(key=lambda r: r["t"])
    return records


def replay_order(records: list[dict[str, Any]], log_: list[Received]) -> tuple[OrderChecker, int]:
    """Every delivery at its arrival and every ack when it was sent, in time order, through an
    OrderChecker whose epochs are lease terms; also returns the deliveries with no read on record."""
    reads: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        reads[(record["owner"], record["qid"])].append(record)
    unread = 0
    terms = []
    for d in log_:
        try:
            terms.append(term_of(reads, d))
        except AssertionError:
            unread += 1
            terms.append(-1)
    events = [(d.t or 0.0, 0, i) for i, d in enumerate(log_)] + [(d.ta, 1, i) for i, d in enumerate(log_) if d.acked]
    events.sort()
    checker = OrderChecker()
    for _, kind, i in events:
        d = log_[i]
        if kind == 0:
            checker.delivered(d.key, d.seq, terms[i])
        else:
            checker.acked(d.key, d.seq, terms[i])
    return checker, unread


def _first_after(log_: list[Received], since: float, accept: Callable[[Received], bool]) -> dict[int, float]:
    first: dict[int, float] = {}
    for d in log_:
        if d.t is not None and d.t > since and d.qid not in first and accept(d):
            first[d.qid] = d.t
    return first


def resumed_ms(fault: dict[str, Any], log_: list[Received]) -> float | None:
    """Time from the fault until delivery resumed, as defined in the module docstring (None: never)."""
    began = fault["t"]
    if fault["kind"] == "consumer-kill":
        victim = fault["victim"]
        held = {(d.qid, d.offset) for d in log_ if d.consumer == victim and d.ta == 0}
        again: dict[tuple[int, int], float] = {}
        for d in log_:
            if d.t is not None and d.t > began and d.consumer != victim and (d.qid, d.offset) in held:
                again.setdefault((d.qid, d.offset), d.t)
        return 1000 * (max(again.values()) - began) if held and len(again) == len(held) else None
    if fault["kind"] == "redis-kill":
        back_ms = 1000 * fault["t_back"]
        first = _first_after(log_, began, lambda d: d.produce_ms >= back_ms)
    elif fault["kind"] == "proxy-kill":
        first = _first_after(log_, began, lambda d: d.owner != fault["victim"] or (d.t or 0) > fault["t_back"])
    else:
        first = _first_after(log_, began, lambda d: d.owner != fault["victim"])
    if not all(q in first for q in fault["queues"]):
        return None
    return 1000 * (max(first[q] for q in fault["queues"]) - began)


def stale_reads(fault: dict[str, Any], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reads a stopped proxy made after SIGCONT under a term another proxy had taken over by then."""
    newest: dict[int, int] = {}
    for record in records:
        if record["t"] <= fault["t_back"] and record["owner"] != fault["victim"]:
            newest[record["qid"]] = max(newest.get(record["qid"], 0), record["term"])
    return [r for r in records
            if r["owner"] == fault["victim"] and r["t"] > fault["t_back"] and r["term"] < newest.get(r["qid"], 0)]


def single_reader(records: list[dict[str, Any]]) -> tuple[str, int | None]:
    """``check_single_reader`` as a verdict ("ok" or "NO: why") and the number of queue moves."""
    try:
        return "ok", check_single_reader(records)
    except AssertionError as exc:
        return f"NO: {exc}", None


def check(config: SoakConfig, folder: Path, produced: dict[str, int], faults: list[dict[str, Any]]) -> SoakResult:
    result = SoakResult(config)
    log_ = read_deliveries(folder)
    records = read_audit(folder)
    checker, unread = replay_order(records, log_)
    every = {(key, seq) for key, count in produced.items() for seq in range(count)}
    delivered = {(d.key, d.seq) for d in log_}
    acked = {(d.key, d.seq) for d in log_ if d.acked}
    lost = every - acked
    one_reader, moves = single_reader(records)
    if one_reader != "ok":
        result.problems.append(f"one reader per (queue, term): {one_reader.removeprefix('NO: ')}")
    stale: list[dict[str, Any]] = []
    for fault in faults:
        fault["resumed_ms"] = None if (ms := resumed_ms(fault, log_)) is None else round(ms)
        if fault["kind"] == "proxy-stop":
            found = stale_reads(fault, records)
            fault["stale_reads"] = len(found)
            stale += found
            if found:
                result.problems.append(
                    f"{fault['victim']} read {len(found)} times after SIGCONT under a term taken over")
        if fault["resumed_ms"] is None:
            result.problems.append(f"{fault['kind']} ({fault['victim']}): delivery did not resume")
    # Whether the stale reads (a continued proxy reading under a term another proxy took over) are the
    # only second readers: the report then tells a fencing gap apart from two owners of one term.
    stale_ids = {id(r) for r in stale}
    besides_stale = single_reader([r for r in records if id(r) not in stale_ids])[0] if stale else one_reader
    result.faults = faults
    produced_total = sum(produced.values())
    result.figures.update(
        produced=produced_total, keys=len(produced), deliveries=len(log_), distinct_delivered=len(delivered),
        redelivered=len(log_) - len(delivered), failed_on_purpose=sum(1 for d in log_ if not d.acked),
        order_violations=len(checker.violations), stale_deliveries=checker.stale, lost=len(lost),
        never_delivered=len(every - delivered), unexpected=len(delivered - every), deliveries_without_read=unread,
        reads_audited=len(records), queue_moves=moves, single_reader=one_reader,
        stale_reads=len(stale), single_reader_besides_stale_reads=besides_stale,
        order_violation_examples=checker.violations[:5],
        lost_examples=sorted(lost)[:5],
    )
    if checker.violations:
        result.problems.append(f"{len(checker.violations)} order violations, e.g. {checker.violations[:3]}")
    if lost:
        result.problems.append(f"{len(lost)} messages never acked, e.g. {sorted(lost)[:5]}")
    if delivered - every:
        result.problems.append(f"{len(delivered - every)} deliveries of messages never produced")
    if unread:
        result.problems.append(f"{unread} deliveries without a recorded read")
    if produced_total != config.messages:
        result.problems.append(f"produced {produced_total} of {config.messages}")
    return result


# -- the report ------------------------------------------------------------------------------------


def format_report(result: SoakResult) -> str:
    f = result.figures
    rows = [
        ("messages produced", f"{f['produced']:,} over {f['keys']:,} keys, {QUEUES} queues"),
        ("deliveries", f"{f['deliveries']:,} ({f['distinct_delivered']:,} distinct messages)"),
        ("redelivered", f"{f['redelivered']:,} (of which {f['failed_on_purpose']:,} failed on purpose)"),
        ("lost (never acked)", f"{f['lost']:,}"),
        ("order violations", f"{f['order_violations']:,} ({f['stale_deliveries']} stale deliveries)"),
        ("committed = produced", "yes" if f["committed"] == f["produce_next"] else
         f"NO: committed {f['committed']}, produced {f['produce_next']}"),
        ("one reader per (queue, term)", f"{f['single_reader']} ({f['reads_audited']:,} reads"
         + ("" if f["queue_moves"] is None else f", {f['queue_moves']} queue moves") + ")"),
        *([("  without the stale reads", f"{f['single_reader_besides_stale_reads']} "
            f"({f['stale_reads']} reads after SIGCONT left out)")] if f["stale_reads"] else []),
        ("producer while Redis was away", f"{f['producer_failed_batches']} batches failed, "
         f"{f['producer_found_stored']} of their messages found stored (not sent again)"),
        ("wall time", f"{f['wall_s']} s (drain {f['drain_s']} s)"),
    ]
    width = max(len(name) for name, _ in rows)
    out = [f"{name.ljust(width)}  {value}" for name, value in rows]
    out.append("")
    out.append(f"{'fault':14}  {'victim':12}  {'at msg':>7}  {'resumed after':>13}  detail")
    for fault in result.faults:
        resumed = "never" if fault["resumed_ms"] is None else f"{fault['resumed_ms']:,} ms"
        if fault["kind"] == "consumer-kill":
            detail = f"held {fault['held']} unacked"
        elif fault["kind"] == "redis-kill":
            detail = f"down {1000 * (fault['t_back'] - fault['t']):,.0f} ms"
        else:
            detail = f"queues {fault['queues']}, back after {1000 * (fault['t_back'] - fault['t']):,.0f} ms"
            if "stale_reads" in fault:
                detail += f", {fault['stale_reads']} stale reads after SIGCONT"
        out.append(f"{fault['kind']:14}  {fault['victim']:12}  {fault['produced_before']:>7,}  {resumed:>13}  {detail}")
    out.append("")
    out.append("all checks held" if result.ok else "FAILED:\n" + "\n".join(f"- {p}" for p in result.problems))
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/soak.py",
        description="Soak a 3-proxy cluster with kill -9 of proxies, consumers and Redis and SIGSTOP fencing, "
        "and check every message (see bench/README.md, Soak).",
    )
    parser.add_argument("--quick", action="store_true", help="6,000 messages, each fault once (~30 s)")
    parser.add_argument("--messages", type=int, default=None, help="messages to produce (default 60,000; quick 6,000)")
    parser.add_argument("--rate", type=float, default=None, help="producer msg/s (default 1,500; quick 300)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of the four faults (default 2; quick 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the delivery and audit files (path printed)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    base = SoakConfig(messages=6_000, rate=300.0, rounds=1) if args.quick else SoakConfig()
    config = SoakConfig(
        messages=base.messages if args.messages is None else args.messages,
        rate=base.rate if args.rate is None else args.rate,
        rounds=base.rounds if args.rounds is None else args.rounds, seed=args.seed,
    )
    if config.messages < 1 or config.rate <= 0 or config.rounds < 0:
        build_parser().error("--messages and --rate must be positive, --rounds not negative")
    machine: dict[str, Any] = {"load_before": load_average(), "cores_available_before": cpu_available()}
    began = time.monotonic()
    with _folder(args.keep) as folder:
        log(f"soak: files in {folder}")
        try:
            result = run_soak(config, folder)
        except HarnessError as exc:
            print(f"soak: the harness broke: {exc}", file=sys.stderr)
            return 1
    machine.update(load_after=load_average(), cores_available_after=cpu_available())
    print(format_report(result))
    if args.json:
        document = {"soak": result.as_json(),
                    "meta": meta(args.quick, time.monotonic() - began, list(argv or sys.argv[1:]), machine)}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"\nresults: {args.json}")
    return 0 if result.ok else 3


@contextlib.contextmanager
def _folder(keep: bool) -> Iterator[Path]:
    if keep:
        yield Path(tempfile.mkdtemp(prefix="ddmq-soak-"))
        return
    with tempfile.TemporaryDirectory(prefix="ddmq-soak-") as name:
        yield Path(name)

