"""The client-side loads, each run in the client process (:mod:`tests.harness.clientproc`).

Proxy side: :class:`~ddmq.client.thrift_client.AsyncProxyClient` connections pulling with DDMQ's
protocol; the acks of a batch ride on the same connection's next pull (a final ``submit`` when it
stops). Baseline side: redis-py asyncio connections (hiredis parser) doing what a hand-written
Redis Streams consumer does. Both sides run the same number of connections in the same process, and
do the same per-message work, so the ratio compares the paths and not the clients.

Every load returns a plain dict; times are ``time.perf_counter`` spans measured here, CPU is this
process's ``time.process_time`` over the timed part.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.dataset import TOPIC
from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol.redis.connection import AsyncRedis, async_redis
from ddmq.protocol.wire import ConsumeResult, ConsumeStatsRequest, Context, PullRequest, PullResponse, link_results
from tests.harness.clientproc import Ready

__all__ = [
    "KeyedWork",
    "LatencyPair",
    "ProxyDrain",
    "RawDrain",
    "SlowDrain",
    "drain_proxy",
    "drain_raw",
    "keyed_work",
    "latency_pair",
    "sleep_floor",
    "slow_drain",
]

_HOST = "127.0.0.1"
_CALL_TIMEOUT_S = 30.0


# -- shared pieces --------------------------------------------------------------------------------


async def _connected(port: int, count: int) -> list[AsyncProxyClient]:
    clients = [AsyncProxyClient(_HOST, port, timeout_s=_CALL_TIMEOUT_S) for _ in range(count)]
    await asyncio.gather(*(client.connect() for client in clients))
    return clients


async def _close_all(clients: Iterable[AsyncProxyClient]) -> None:
    await asyncio.gather(*(client.close() for client in clients), return_exceptions=True)


async def _finish(tasks: Iterable[asyncio.Task[Any]], grace_s: float) -> None:
    """Let tasks end by themselves for ``grace_s`` (a parked pull returns at its linger), then cancel."""
    pending = [task for task in tasks if not task.done()]
    if pending:
        _, late = await asyncio.wait(pending, timeout=grace_s)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    for task in tasks:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            raise error


async def _wait_for(done: asyncio.Event, tasks: list[asyncio.Task[Any]], timeout_s: float, what: str) -> None:
    """Wait for ``done``; a task that fails first, or the timeout, raises. Tasks may end early."""
    waiter = asyncio.create_task(done.wait())
    pending: set[asyncio.Task[Any]] = {waiter, *tasks}
    deadline = time.monotonic() + timeout_s
    try:
        while not done.is_set():
            remaining = deadline - time.monotonic()
            finished, pending = (
                await asyncio.wait(pending, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
                if remaining > 0 else (set(), pending)
            )
            if not finished:
                raise TimeoutError(f"{what}: not done within {timeout_s:.0f}s")
            for task in finished:
                error = None if task is waiter else task.exception()
                if error is not None:
                    raise error
    finally:
        waiter.cancel()


async def _wait_committed(client: AsyncProxyClient, group: str, timeout_s: float = 60.0) -> float:
    """Poll ``getConsumeStats`` until the group's consume offsets reach the produce offsets."""
    deadline = time.perf_counter() + timeout_s
    while True:
        rows = await client.get_consume_stats(ConsumeStatsRequest(group=group, topic=TOPIC))
        if rows and rows[0].consumeOffsets == rows[0].produceOffsets:
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError(f"group {group}: offsets not committed within {timeout_s:.0f}s: {rows}")
        await asyncio.sleep(0.005)


def _result(group: str, response: PullResponse, offsets: list[int]) -> ConsumeResult:
    context = response.context
    assert context is not None
    return ConsumeResult(
        context=Context(groupId=group, topic=context.topic, qid=context.qid), successOffsets=offsets, failOffsets=[]
    )


class _Drain:
    """What the pullers of one load have seen, and when they have seen enough."""

    def __init__(self, group: str, expected: int, poison_key: str | None = None) -> None:
        self.group = group
        self.expected = expected
        self.poison_key = poison_key
        self.seen: set[tuple[str, int]] = set()
        self.deliveries = 0
        self.poison_deliveries = 0
        self.replies_with_messages = 0
        self.done = asyncio.Event()
        self.done_at = 0.0

    def take(self, response: PullResponse) -> ConsumeResult | None:
        """Count a response; return the acks to report (messages of the poison key are never acked)."""
        messages = response.messages
        if not messages:
            return None
        self.replies_with_messages += 1
        qid = response.context.qid if response.context is not None else ""
        acks = []
        for message in messages:
            if self.poison_key is not None and message.key == self.poison_key:
                self.poison_deliveries += 1
                continue
            acks.append(message.offset or 0)
            self.seen.add((qid or "", message.offset or 0))
        self.deliveries += len(acks)
        if len(self.seen) >= self.expected and not self.done.is_set():
            self.done_at = time.perf_counter()
            self.done.set()
        return _result(self.group, response, acks) if acks else None

    def counts(self) -> dict[str, int]:
        return {
            "unique": len(self.seen),
            "duplicates": self.deliveries - len(self.seen),
            "poison_deliveries": self.poison_deliveries,
            "replies_with_messages": self.replies_with_messages,
        }


async def _pull_loop(
    client: AsyncProxyClient,
    drain: _Drain,
    *,
    batch: int,
    linger_ms: int,
    pause_s: float = 0.0,
    stop: Callable[[], bool] = lambda: False,
    max_per_key: int | None = None,
    request_ids: bool = False,
) -> None:
    """Pull, count, pull again carrying the acks; a final ``submit`` for what is still held. With
    ``max_per_key`` the pulls ask for ordered runs (every message is acked, so every run whole); with
    ``request_ids`` each pull names a fresh request id, as the project's SDK does (retriable pulls)."""
    pending: ConsumeResult | None = None
    while not drain.done.is_set() and not stop():
        request = PullRequest(
            groupId=drain.group, topic=TOPIC, maxBatchSize=batch, maxLingerTime=linger_ms, result=pending,
            maxPerKey=max_per_key, requestId=uuid.uuid4().hex if request_ids else None,
        )
        pending = drain.take(await client.pull(request))
        if pause_s:
            await asyncio.sleep(pause_s)
    if pending is not None:
        await client.submit(pending)


# -- P1, P2: drain a backlog -----------------------------------------------------------------------


@dataclass(frozen=True)
class RawDrain:
    """Baseline: one connection per stream, ``XACK`` of the last batch pipelined with the next
    ``XREADGROUP COUNT batch``, until the stream is empty; once per consumer group in ``groups``
    (each new, so each drain reads everything), one after the other on the same connections."""

    redis_url: str
    groups: tuple[str, ...]
    streams: tuple[str, ...]
    batch: int = 64
    timeout_s: float = 600.0


async def drain_raw(spec: RawDrain, ready: Ready) -> dict[str, Any]:
    clients = [async_redis(spec.redis_url) for _ in spec.streams]
    pairs = list(zip(clients, spec.streams, strict=True))
    runs = []
    try:
        for group in spec.groups:
            for client, stream in pairs:
                await client.xgroup_create(stream, group, id="0")
        ready()
        for group in spec.groups:
            cpu, start = time.process_time(), time.perf_counter()
            async with asyncio.timeout(spec.timeout_s):
                counts = await asyncio.gather(*(
                    _raw_consumer(client, stream, group, spec.batch) for client, stream in pairs
                ))
            elapsed = time.perf_counter() - start
            runs.append({"messages": sum(counts), "elapsed_s": elapsed, "client_cpu_s": time.process_time() - cpu})
        return {"runs": runs}
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


async def _raw_consumer(client: AsyncRedis, stream: str, group: str, batch: int) -> int:
    consumed = 0
    ids: list[bytes] = []
    while True:
        pipe = client.pipeline(transaction=False)
        if ids:
            pipe.xack(stream, group, *ids)
        pipe.xreadgroup(group, "c", {stream: ">"}, count=batch)
        reply = (await pipe.execute())[-1]
        if not reply:
            return consumed  # the acks of the last batch went out with this empty read
        entries = reply[0][1]
        ids = [entry_id for entry_id, _ in entries]
        consumed += len(entries)


@dataclass(frozen=True)
class ProxyDrain:
    """Proxy: ``connections`` pullers (batch ``batch``, acks on the next pull) until ``expected``
    distinct messages arrived; then, with ``wait_commit``, until the commit point reaches the end."""

    port: int
    group: str
    expected: int
    connections: int = 8
    batch: int = 64
    linger_ms: int = 200
    poison_key: str | None = None
    wait_commit: bool = True
    timeout_s: float = 600.0
    max_per_key: int | None = None
    request_ids: bool = False


async def drain_proxy(spec: ProxyDrain, ready: Ready) -> dict[str, Any]:
    clients = await _connected(spec.port, spec.connections + 1)
    stats_client, pullers = clients[0], clients[1:]
    drain = _Drain(spec.group, spec.expected, spec.poison_key)
    tasks: list[asyncio.Task[None]] = []
    try:
        ready()
        cpu, start = time.process_time(), time.perf_counter()
        tasks = [
            asyncio.create_task(
                _pull_loop(client, drain, batch=spec.batch, linger_ms=spec.linger_ms, max_per_key=spec.max_per_key,
                           request_ids=spec.request_ids)
            )
            for client in pullers
        ]
        await _wait_for(drain.done, tasks, spec.timeout_s, f"draining {spec.group}")
        committed_at = await _wait_committed(stats_client, spec.group) if spec.wait_commit else None
        cpu = time.process_time() - cpu
        await _finish(tasks, spec.linger_ms / 1000 + 2)
    finally:
        for task in tasks:
            task.cancel()
        await _close_all(clients)
    return {
        "delivered_s": drain.done_at - start,
        "committed_s": None if committed_at is None else committed_at - start,
        "client_cpu_s": cpu,
        **drain.counts(),
    }


# -- P3: key-parallel work -------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyedWork:
    """``connections`` pullers, each holding at most ``window`` messages: ``connections x window``
    in flight. A puller pulls as many as it has free slots once at least ``refill_at`` are free and its
    previous pull has returned (one pull at a time per connection). A message's work is
    ``asyncio.sleep(w ms)`` (``w`` from its body); each message is acked the moment its work ends, on a
    dedicated connection, coalesced while a submit is under way."""

    port: int
    group: str
    expected: int
    connections: int = 10
    window: int = 10
    refill_at: int = 1
    linger_ms: int = 1000
    timeout_s: float = 600.0
    #: Wait for the group's offsets to be committed (a stand-in server keeps none).
    wait_commit: bool = True


@dataclass
class _WorkState:
    group: str
    expected: int
    acks: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    ack_ready: asyncio.Event = field(default_factory=asyncio.Event)
    acked: set[tuple[str, int]] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    done_at: float = 0.0
    in_flight: int = 0
    max_in_flight: int = 0
    slept_s: float = 0.0
    submits: int = 0
    pulls: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class _Window:
    """Free slots of one puller."""

    def __init__(self, size: int, refill_at: int) -> None:
        self.free = size
        self.refill_at = min(max(1, refill_at), size)
        self._room = asyncio.Event()

    async def wait(self) -> int:
        """Wait until at least ``refill_at`` slots are free; returns how many are."""
        while self.free < self.refill_at:
            self._room.clear()
            await self._room.wait()
        return self.free

    def release(self) -> None:
        self.free += 1
        self._room.set()


async def keyed_work(spec: KeyedWork, ready: Ready) -> dict[str, Any]:
    clients = await _connected(spec.port, spec.connections + 2)
    stats_client, acker, pullers = clients[0], clients[1], clients[2:]
    state = _WorkState(spec.group, spec.expected)
    tasks: list[asyncio.Task[None]] = []
    try:
        ready()
        cpu, start = time.process_time(), time.perf_counter()
        tasks = [asyncio.create_task(_ack_sender(acker, state))]
        tasks += [asyncio.create_task(_work_puller(client, spec, state)) for client in pullers]
        await _wait_for(state.done, tasks, spec.timeout_s, "keyed work")
        committed_at = await _wait_committed(stats_client, spec.group) if spec.wait_commit else state.done_at
        cpu = time.process_time() - cpu
    finally:
        for task in [*tasks, *state.tasks]:
            task.cancel()
        await asyncio.gather(*tasks, *state.tasks, return_exceptions=True)
        await _close_all(clients)
    return {
        "wall_s": state.done_at - start,
        "committed_s": committed_at - start,
        "slept_s": state.slept_s,
        "max_in_flight": state.max_in_flight,
        "submits": state.submits,
        "pulls": state.pulls,
        "acked": len(state.acked),
        "client_cpu_s": cpu,
    }


async def _work_puller(client: AsyncProxyClient, spec: KeyedWork, state: _WorkState) -> None:
    window = _Window(spec.window, spec.refill_at)
    while not state.done.is_set():
        free = await window.wait()
        response = await client.pull(
            PullRequest(groupId=spec.group, topic=TOPIC, maxBatchSize=free, maxLingerTime=spec.linger_ms)
        )
        state.pulls += 1
        if not response.messages:
            continue
        assert response.context is not None
        queue = (response.context.topic or "", response.context.qid or "")
        window.free -= len(response.messages)
        state.in_flight += len(response.messages)
        state.max_in_flight = max(state.max_in_flight, state.in_flight)
        for message in response.messages:
            task = asyncio.create_task(_work(queue, message.offset or 0, message.value or b"{}", window, state))
            state.tasks.add(task)
            task.add_done_callback(state.tasks.discard)


async def _work(queue: tuple[str, str], offset: int, value: bytes, window: _Window, state: _WorkState) -> None:
    work_s = json.loads(value)["w"] / 1000
    began = time.perf_counter()
    await asyncio.sleep(work_s)
    state.slept_s += time.perf_counter() - began
    state.in_flight -= 1
    state.acks.setdefault(queue, []).append(offset)
    state.ack_ready.set()
    window.release()


async def _ack_sender(client: AsyncProxyClient, state: _WorkState) -> None:
    while True:
        await state.ack_ready.wait()
        state.ack_ready.clear()
        acks, state.acks = state.acks, {}
        results = [
            ConsumeResult(context=Context(groupId=state.group, topic=topic, qid=qid), successOffsets=offsets)
            for (topic, qid), offsets in acks.items()
        ]
        await client.submit(link_results(results))
        state.submits += 1
        for (_, qid), offsets in acks.items():
            state.acked.update((qid, offset) for offset in offsets)
        if len(state.acked) >= state.expected:
            state.done_at = time.perf_counter()
            state.done.set()
            return


async def sleep_floor(work_ms: list[float], ready: Ready) -> dict[str, Any]:
    """The same work with no proxy at all: 100 slots fed from memory, so the wall time over the ideal
    is what asyncio's timers alone cost (``epoll`` waits whole milliseconds, so short sleeps overshoot)."""
    ready()
    slots = asyncio.Semaphore(100)
    slept = 0.0

    async def one(work_s: float) -> None:
        nonlocal slept
        began = time.perf_counter()
        await asyncio.sleep(work_s)
        slept += time.perf_counter() - began
        slots.release()

    tasks = []
    start = time.perf_counter()
    for work in work_ms:
        await slots.acquire()
        tasks.append(asyncio.create_task(one(work / 1000)))
    await asyncio.gather(*tasks)
    return {"wall_s": time.perf_counter() - start, "slept_s": slept}


# -- P4: latency, proxy and XREAD BLOCK side by side ----------------------------------------------


@dataclass(frozen=True)
class LatencyPair:
    """Long-polling proxy pullers and raw ``XREAD BLOCK`` readers (one per stream) on the same
    streams at the same time; both take ``time.time() - body.ts`` when a message arrives. Messages
    with ``n < warmup`` are not counted. ``sides`` runs only some of them (``("proxy",)`` or
    ``("raw",)``): one process per side, so neither side's messages wait for the other's to be handled."""

    port: int
    group: str
    redis_url: str
    streams: tuple[str, ...]
    expected: int
    warmup: int
    connections: int = 8
    batch: int = 64
    linger_ms: int = 1000
    block_ms: int = 1000
    timeout_s: float = 120.0
    sides: tuple[str, ...] = ("proxy", "raw")


async def latency_pair(spec: LatencyPair, ready: Ready) -> dict[str, Any]:
    clients = await _connected(spec.port, spec.connections) if "proxy" in spec.sides else []
    streams = spec.streams if "raw" in spec.sides else ()
    readers = [async_redis(spec.redis_url) for _ in streams]
    await asyncio.gather(*(reader.ping() for reader in readers))
    proxy_ms: dict[int, float] = {}
    raw_ms: dict[int, float] = {}
    proxy_done, raw_done = asyncio.Event(), asyncio.Event()
    if "proxy" not in spec.sides:
        proxy_done.set()
    if "raw" not in spec.sides:
        raw_done.set()
    tasks: list[asyncio.Task[None]] = []
    try:
        ready()
        cpu = time.process_time()
        tasks = [asyncio.create_task(_latency_puller(c, spec, proxy_ms, proxy_done)) for c in clients]
        tasks += [
            asyncio.create_task(_latency_reader(r, stream, spec, raw_ms, raw_done))
            for r, stream in zip(readers, streams, strict=True)
        ]
        both = asyncio.Event()

        async def watch() -> None:
            await proxy_done.wait()
            await raw_done.wait()
            both.set()

        watcher = asyncio.create_task(watch())
        try:
            await _wait_for(both, tasks, spec.timeout_s, "latency")
        finally:
            watcher.cancel()
        cpu = time.process_time() - cpu
        await _finish(tasks, max(spec.linger_ms, spec.block_ms) / 1000 + 2)
    finally:
        for task in tasks:
            task.cancel()
        await _close_all(clients)
        await asyncio.gather(*(reader.aclose() for reader in readers), return_exceptions=True)
    return {
        "proxy": _percentiles([v for n, v in proxy_ms.items() if n >= spec.warmup]),
        "raw": _percentiles([v for n, v in raw_ms.items() if n >= spec.warmup]),
        "client_cpu_s": cpu,
    }


def _note_arrival(value: bytes, now: float, into: dict[int, float]) -> None:
    event = json.loads(value)
    into.setdefault(event["n"], (now - event["ts"]) * 1000)


async def _latency_puller(
    client: AsyncProxyClient, spec: LatencyPair, into: dict[int, float], done: asyncio.Event
) -> None:
    pending: ConsumeResult | None = None
    while not done.is_set():
        request = PullRequest(
            groupId=spec.group, topic=TOPIC, maxBatchSize=spec.batch, maxLingerTime=spec.linger_ms, result=pending
        )
        response = await client.pull(request)
        now = time.time()
        pending = None
        if response.messages:
            for message in response.messages:
                _note_arrival(message.value or b"{}", now, into)
            pending = _result(spec.group, response, [m.offset or 0 for m in response.messages])
        if len(into) >= spec.expected:
            done.set()
    if pending is not None:
        await client.submit(pending)


async def _latency_reader(
    client: AsyncRedis, stream: str, spec: LatencyPair, into: dict[int, float], done: asyncio.Event
) -> None:
    last: bytes | str = "0-0"
    while not done.is_set():
        reply = await client.xread({stream: last}, count=spec.batch, block=spec.block_ms)
        now = time.time()
        if not reply:
            continue
        entries = reply[0][1]
        for _, fields in entries:
            _note_arrival(fields[b"v"], now, into)
        last = entries[-1][0]
        if len(into) >= spec.expected:
            done.set()


def _percentiles(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

    return {"count": len(ordered), "p50_ms": at(0.50), "p90_ms": at(0.90), "p99_ms": at(0.99), "max_ms": at(1.0)}


# -- P5: a backlog drained slowly, then fast ------------------------------------------------------


@dataclass(frozen=True)
class SlowDrain:
    """One puller taking ``slow_batch`` messages every ``slow_pause_s`` for ``slow_s``, then
    ``connections`` pullers at full speed for at most ``fast_s`` (or until ``expected``)."""

    port: int
    group: str
    expected: int
    slow_s: float
    fast_s: float
    slow_batch: int = 16
    slow_pause_s: float = 0.1
    connections: int = 8
    batch: int = 64
    linger_ms: int = 200


async def slow_drain(spec: SlowDrain, ready: Ready) -> dict[str, Any]:
    clients = await _connected(spec.port, spec.connections)
    drain = _Drain(spec.group, spec.expected)
    phases: dict[str, Any] = {}
    try:
        ready()
        for name, duration, pullers, batch, pause in (
            ("slow", spec.slow_s, clients[:1], spec.slow_batch, spec.slow_pause_s),
            ("fast", spec.fast_s, clients, spec.batch, 0.0),
        ):
            before, began = len(drain.seen), time.time()
            stop = _deadline(duration)
            await _run_all(
                _pull_loop(client, drain, batch=batch, linger_ms=spec.linger_ms, pause_s=pause, stop=stop)
                for client in pullers
            )
            phases[name] = {"began": began, "ended": time.time(), "messages": len(drain.seen) - before}
    finally:
        await _close_all(clients)
    return {"phases": phases, **drain.counts()}


def _deadline(seconds: float) -> Callable[[], bool]:
    end = time.monotonic() + seconds
    return lambda: time.monotonic() >= end


async def _run_all(coroutines: Iterable[Coroutine[Any, Any, None]]) -> None:
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()

