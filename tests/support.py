"""Test support: the tests' proxy process (the harness's, :mod:`tests.harness.stack`), and the per-key
order/no-loss checker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddmq.client.thrift_client import AsyncProxyClient, ProxyClientError
from ddmq.protocol import wire
from ddmq.protocol.produce.producer import Producer
from tests.harness.stack import ProxyRun


class ProxyProcess(ProxyRun):
    """The tests' :class:`~tests.harness.stack.ProxyRun`: its config and log in ``tmp_path``, its log at
    the proxy's default level, offsets committed every 100 ms; restartable on the same port."""

    INSTANCE_ID = "e2e-proxy"
    SETTINGS: dict[str, Any] = {"commit_interval_ms": 100}
    ARGS: tuple[str, ...] = ()

    def __init__(self, tmp_path: Path, redis_url: str, groups: dict[str, Any], topics: dict[str, Any],
                 **extra: Any) -> None:
        super().__init__(redis_url, groups=groups, topics=topics, folder=tmp_path, **extra)
        #: Counts starts: connections opened after a start talk to that incarnation.
        self.incarnation = 0

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.proc

    def start(self, before_exec: Callable[[], None] | None = None, *, timeout_s: float = 30,
              max_open_files: int | None = None) -> ProxyProcess:
        """Start and wait until it listens; ``max_open_files`` lowers its descriptor limit (RLIMIT_NOFILE).
        A start that fails raises :class:`~ddmq.client.cli.proxy_process.ProxyProcessError`."""
        self.incarnation += 1

        def limit_files() -> None:
            if before_exec is not None:
                before_exec()
            if max_open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (max_open_files, max_open_files))

        self.child.start(timeout_s, before_exec=limit_files)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.child.kill()

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM and wait; a proxy that needs SIGKILL to end is a failure."""
        if not self.child.running():
            return self.proc.returncode if self.proc else 0
        code = self.child.stop(timeout_s)
        if code == -signal.SIGKILL:
            raise RuntimeError(f"the proxy did not exit within {timeout_s}s of SIGTERM:\n{self.child.log_tail()}")
        return code

    def log(self) -> str:
        """The whole log: tests look for lines anywhere in it (a tail could cut off what they look for
        behind the retries' warnings that follow it)."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""


@dataclass
class OrderChecker:
    """Per-key order and no-loss over a whole run, across proxy crashes.

    Each key's messages carry ``seq`` 0, 1, 2, ... Every delivery is tagged with the *epoch* (proxy
    incarnation) of the connection it came on. Within an epoch a delivery is legal when it is the
    key's head (first delivery, or a redelivery of the head). A key's first delivery in a new epoch
    may replay from its committed offset: any seq up to what was acked, and from there head by head
    again. A delivery from an older epoch (a response the dead proxy had already sent) is stale and
    does not move the new epoch's head. A delivery past an unacked predecessor is always a violation.
    """

    acked_upto: dict[str, int] = field(default_factory=dict)  # key -> seqs 0..n-1 acked at least once
    heads: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (epoch, head seq)
    deliveries: int = 0
    duplicates: int = 0
    stale: int = 0
    violations: list[str] = field(default_factory=list)

    def delivered(self, key: str, seq: int, epoch: int = 0) -> None:
        self.deliveries += 1
        acked = self.acked_upto.get(key, 0)
        if seq > acked:
            self.violations.append(f"{key}: seq {seq} delivered before seq {acked} was acked (epoch {epoch})")
        elif seq < acked:
            self.duplicates += 1
        known_epoch, head = self.heads.get(key, (-1, 0))
        if epoch < known_epoch:
            self.stale += 1
        elif epoch > known_epoch:
            self.heads[key] = (epoch, seq)  # start of this epoch's replay (or first delivery ever)
        elif seq != head:
            self.violations.append(f"{key}: seq {seq} delivered while the head is {head} (epoch {epoch})")

    def acked(self, key: str, seq: int, epoch: int = 0) -> None:
        if seq + 1 > self.acked_upto.get(key, 0):
            self.acked_upto[key] = seq + 1
        known_epoch, _ = self.heads.get(key, (-1, 0))
        if epoch == known_epoch:
            self.heads[key] = (epoch, seq + 1)

    def missing(self, produced: dict[str, int]) -> dict[str, tuple[int, int]]:
        """Keys whose acked prefix is shorter than what was produced: key -> (acked, produced)."""
        return {k: (self.acked_upto.get(k, 0), n) for k, n in produced.items() if self.acked_upto.get(k, 0) != n}


def order_violations(seqs: dict[str, list[int]], produced: dict[str, int]) -> list[str]:
    """Per key, each message arrives after its predecessor, and a key only ever goes on with the next
    message or starts again at one already seen (a redelivery after a proxy's death replays from the
    dead owner's committed offset); every produced message arrives, nothing else does."""
    problems = []
    for key, count in produced.items():
        got = seqs.get(key, [])
        highest = previous = -1
        for seq in got:
            if seq > highest + 1 or (seq > previous and seq != previous + 1):
                problems.append(f"{key}: {seq} after {previous} (highest so far {highest}): {got}")
                break
            highest, previous = max(highest, seq), seq
        if set(got) != set(range(count)):
            problems.append(f"{key}: got {sorted(set(got))[:10]}..., produced {count}")
    return problems + [f"{key}: never produced" for key in seqs if key not in produced]


def body(key: str, seq: int) -> str:
    return json.dumps({"k": key, "seq": seq})


def check_and_ack(response: wire.PullResponse, checker: OrderChecker, epoch: int = 0) -> list[wire.ConsumeResult]:
    """Record a pulled batch of :func:`body` messages in ``checker`` as delivered and acked; returns
    the results that ack it (to send with the next pull), none for an empty batch."""
    ok = []
    for message in response.messages:
        event = json.loads(message.value)
        checker.delivered(event["k"], event["seq"], epoch)
        checker.acked(event["k"], event["seq"], epoch)
        ok.append(message.offset)
    return [wire.ConsumeResult(context=response.context, successOffsets=ok, failOffsets=[])] if ok else []


def produce_keyed(
    redis_url: str,
    count: int,
    produced: dict[str, int],
    rng: random.Random,
    *,
    keys: int,
    topic: str = "t",
    key_prefix: str = "key-",
    queues: int | None = None,
    pause_s: float = 0.0,
) -> None:
    """Produce ``count`` messages over ``keys`` random keys, each body carrying its key's next sequence
    number (``produced[key]`` counts them), in batches of 500 with ``pause_s`` between batches.
    ``queues`` creates the topic first; without it the topic must exist (a running proxy makes it)."""
    with Producer(redis_url) as producer:
        if queues is not None:
            producer.ensure_topic(topic, queues)
        for start in range(0, count, 500):
            batch = []
            for _ in range(min(500, count - start)):
                key = f"{key_prefix}{rng.randrange(keys)}"
                seq = produced.get(key, 0)
                produced[key] = seq + 1
                batch.append({"key": key, "value": body(key, seq)})
            producer.send_batch(topic, batch)
            if pause_s:
                time.sleep(pause_s)


# -- several proxies: deliveries tagged with the proxy that served them, and the read audit ----------


@dataclass
class Delivery:
    owner: str
    qid: int
    offset: int
    key: str
    seq: int
    acked: bool
    #: When the client received it (``time.time()``, the clock of the audit's ``t``), if known: a proxy
    #: restarted under the same instance id may read that offset again later, under a newer term.
    t: float | None = None
    #: When :func:`puller` received it (``time.time()``), for :func:`stale_deliveries` (keyword-only:
    #: subclasses add fields after ``t`` and are built positionally).
    received: float = field(default=0.0, kw_only=True)


async def until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``check`` until it holds; an AssertionError naming ``what`` past ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        await asyncio.sleep(0.05)


#: Two proxies of group g on topic t (8 queues) with short leases, for the fault tests (network, clocks).
FAULT_QUEUES = 8
FAULT_LEASES = {"ttl_ms": 2000, "renew_ms": 500, "claim_interval_ms": 200, "handoff_drain_ms": 500}
#: A small read-ahead window: readers often wait for room holding their connection, where a reset hurt.
FAULT_GROUP = {"order_key": "KEY", "timeout_ms": 3000, "max_retry": 50, "retry_intervals_ms": [20, 100],
               "concurrency": 64}


def fault_fleet(tmp_path: Path, redis_url: str) -> ProxyFleet:
    """The fault tests' fleet: :data:`FAULT_LEASES`, and a Redis timeout under their TTL (1.5 s: above
    the longest block, 1 s, plus a margin)."""
    return ProxyFleet(tmp_path, redis_url, {"g": {"t": FAULT_GROUP}}, {"t": {"queues": FAULT_QUEUES}},
                      FAULT_LEASES, redis_client={"timeout_ms": 1500})


class ProxyFleet:
    """Several proxy processes of one group, each in its own folder with its read audit."""

    def __init__(self, tmp_path: Path, redis_url: str, groups: dict[str, Any], topics: dict[str, Any],
                 leases: dict[str, Any], **extra: Any) -> None:
        self.tmp_path, self.redis_url = tmp_path, redis_url
        self.groups, self.topics, self.leases = groups, topics, leases
        #: More of every proxy's config (``redis_client``, say).
        self.extra = extra
        self.proxies: dict[str, ProxyProcess] = {}

    def start(self, name: str, redis_url: str | None = None, wrap: Callable[[list[str]], list[str]] | None = None,
              ) -> ProxyProcess:
        """Start proxy ``name`` (again, in the same folder, when it ran before), on ``redis_url`` (default:
        the fleet's; a relay's, say) with its command rewritten by ``wrap`` (a faketime prefix, say)."""
        folder = self.tmp_path / name
        folder.mkdir(exist_ok=True)
        proxy = ProxyProcess(
            folder, redis_url or self.redis_url, self.groups, self.topics,
            instance_id=name, leases=self.leases, audit_log=str(folder / "reads.jsonl"), shutdown_grace_ms=500,
            **self.extra,
        )
        if wrap is not None:
            proxy.child.wrap(wrap)
        self.proxies[name] = proxy.start()
        return proxy

    def reads(self) -> list[dict[str, Any]]:
        records = []
        for proxy in self.proxies.values():
            path = proxy.config_path.parent / "reads.jsonl"
            if path.exists():
                records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return records


async def puller(owner: str, port: int, log: list[Delivery], stop: asyncio.Event, rng: random.Random, *,
                 fail_rate: float = 0.01, group: str = "g", topic: str = "t") -> None:
    """Pull from one proxy, ack on the next pull (``fail_rate`` fails); reconnect while the proxy is away."""
    pending: list[wire.ConsumeResult] = []
    async with AsyncProxyClient("127.0.0.1", port, timeout_s=5) as client:
        while not stop.is_set():
            try:
                response = await client.pull(wire.PullRequest(
                    groupId=group, topic=topic, maxBatchSize=64, maxLingerTime=200,
                    result=wire.link_results(pending)))
            except ProxyClientError:
                pending.clear()  # those acks are lost with the connection: the messages come again
                await asyncio.sleep(0.2)
                continue
            pending.clear()
            ok, failed = [], []
            for message in response.messages:
                event = json.loads(message.value)
                acked = rng.random() >= fail_rate
                (ok if acked else failed).append(message.offset)
                log.append(Delivery(owner, int(response.context.qid), message.offset, event["k"], event["seq"], acked,
                                    received=time.time()))
            if ok or failed:
                pending.append(wire.ConsumeResult(context=response.context, successOffsets=ok, failOffsets=failed))
        if pending:
            try:
                await client.submit(wire.link_results(pending))
            except ProxyClientError:
                pass


def acked_prefixes(log: list[Delivery]) -> dict[str, int]:
    """Per key, how many of its first messages were acked at least once (seq 0..n-1)."""
    acked: dict[str, int] = {}
    for d in log:
        if d.acked:
            acked[d.key] = max(acked.get(d.key, 0), d.seq + 1)
    return acked


def term_of(reads: dict[tuple[str, int], list[dict[str, Any]]], delivery: Delivery, clock: str = "t",
            slack_s: float = 0.0) -> int:
    """The lease term under which ``delivery``'s owner read that offset: its latest read covering it that
    happened before the client received it (within ``slack_s``: what the audit's ``clock`` may be off
    from this host's), by the audit's ``clock`` (see :func:`check_single_reader`). Without the receive
    time, a delivery of an earlier term would take the term of a later re-read of the same offset by the
    same owner, and a replay that is legal would look out of order. ``reads`` lists each owner's reads in
    ``clock`` order."""
    at = delivery.t if delivery.t is not None else (delivery.received or None)
    term = None
    for record in reads[(delivery.owner, delivery.qid)]:
        if at is not None and record[clock] > at + slack_s:
            break
        if record["first"] <= delivery.offset <= record["last"]:
            term = record["term"]
    assert term is not None, f"{delivery} was delivered without a recorded read"
    return term


def check_single_reader(records: list[dict[str, Any]], clock: str = "t") -> int:
    """One owner per (queue, term), and each term's reads end before the next term's begin, by the
    audit's ``clock``: ``t`` (the host's wall clock, exact while every proxy runs on this host's) or
    ``rt`` (Redis's, as each proxy knows it: for proxies whose clocks were made to disagree)."""
    by_queue: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        by_queue[record["qid"]][record["term"]].append(record)
    moves = 0
    for qid, terms in by_queue.items():
        previous_end = None
        for term in sorted(terms):
            owners = {r["owner"] for r in terms[term]}
            assert len(owners) == 1, f"queue {qid} term {term} was read by {owners}"
            start, end = min(r[clock] for r in terms[term]), max(r[clock] for r in terms[term])
            if previous_end is not None:
                assert start > previous_end, f"queue {qid}: term {term} read before the previous term's last read"
                moves += 1
            previous_end = end
    return moves


def stale_deliveries(records: list[dict[str, Any]], log: list[Delivery], slack_s: float = 0.5,
                     clock: str = "t") -> list[str]:
    """Deliveries a proxy made after another proxy had begun reading the queue under a newer term (by
    more than ``slack_s``, for the reply's way to the client): what a proxy that woke from a pause and
    served what it had read before would do. Each delivery's term is that of its owner's latest read
    covering it before it was received; the deliveries are dated on this host's clock, the reads on the
    audit's ``clock`` (see :func:`check_single_reader`; Redis runs on this host)."""
    reads: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    first_read: dict[int, dict[int, tuple[float, str]]] = defaultdict(dict)  # qid -> term -> (t, owner)
    for record in sorted(records, key=lambda r: r[clock]):
        reads[(record["owner"], record["qid"])].append(record)
        first_read[record["qid"]].setdefault(record["term"], (record[clock], record["owner"]))
    stale = []
    for d in log:
        term = None
        for record in reads[(d.owner, d.qid)]:
            if record[clock] > d.received:
                break
            if record["first"] <= d.offset <= record["last"]:
                term = record["term"]
        if term is None:
            continue
        newer = [t for later, (t, owner) in first_read[d.qid].items() if later > term and owner != d.owner]
        if newer and min(newer) < d.received - slack_s:
            stale.append(f"{d.owner} delivered {d.qid}@{d.offset} (term {term}) {d.received - min(newer):.2f}s "
                         f"after a newer term's first read")
    return stale


def check_order_by_term(records: list[dict[str, Any]], log: list[Delivery], clock: str = "t",
                        slack_s: float = 0.0) -> OrderChecker:
    """Replay ``log`` through an OrderChecker whose epoch for each delivery is the lease term its
    owner read it under (from the read audit ``records``, dated by ``clock``: see :func:`term_of`)."""
    reads: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r[clock]):
        reads[(record["owner"], record["qid"])].append(record)
    checker = OrderChecker()
    for d in log:
        term = term_of(reads, d, clock, slack_s)
        checker.delivered(d.key, d.seq, term)
        if d.acked:
            checker.acked(d.key, d.seq, term)
    return checker


def debian_tool(binary: str, package: str | None = None) -> str:
    """The path of ``binary``; Debian's ``package`` (default: the binary's name) is installed with
    apt-get when it is missing and the suite runs as root, else the test fails saying what to install."""
    import os
    import shutil

    path = shutil.which(binary)
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", package or binary], check=True, env=env, timeout=1200,
                       capture_output=True)
        path = shutil.which(binary)
    if path is None:
        import pytest

        pytest.fail(f"this test needs {binary}: run `apt-get install -y {package or binary}` as root")
    return path
