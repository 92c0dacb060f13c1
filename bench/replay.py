"""Stand-in pull servers for the clients' floors: what the Thrift clients alone can take.

They speak the proxy's wire protocol on a real socket, in their own process, with no Redis, no buffer
and no offsets, and encode replies with the proxy's own reply encoder.

- :func:`serve_pull_replies` (P1): each ``pull`` is answered at once with the next ``batch`` messages
  of the next queue (round-robin, like the proxy); acks are decoded and dropped; ``submit`` answers
  true. Once every message went out, pulls get an empty reply after their linger time. The client load
  that drains it is P1's, unchanged, so the rate it reaches is the most P1's clients could ever do on
  this machine, whatever the proxy did.
- :func:`serve_ordered_work` (P3): P3's backlog, keys, work and all, held in memory in order; a pull
  gets at once up to ``maxBatchSize`` of the keys' heads, one queue per reply as from the proxy, or
  waits for one; an ack makes the key's next message its head. Per-key order with no read-ahead limit
  and nothing between an ack and the next pull but the sockets: the wall time P3's client load reaches
  against it is the most P3 could show with that client, that data and per-key order on this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.dataset import body, draw
from ddmq.protocol import wire
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.wire import ConsumeResult, ConsumerService, TMessageType
from ddmq.proxy.core.pull_codec import encode_pull_reply
from ddmq.proxy.core.types import StoredMessage
from tests.harness.clientproc import Ready


@dataclass(frozen=True)
class ReplaySpec:
    port: int
    topic: str
    queues: int
    messages: int
    keys: int
    batch: int = 64


def _queues(spec: ReplaySpec) -> list[list[StoredMessage]]:
    """The messages of each queue: P1's body shape, keys and produce time; offsets from 1 per queue."""
    queues: list[list[StoredMessage]] = [[] for _ in range(spec.queues)]
    for seq in range(spec.messages):
        key = f"k{(seq * 7919) % spec.keys:04d}"
        value = f'{{"k":"{key}","seq":{seq},"ts":1763776220.12}}'.encode()
        queue = queues[seq % spec.queues]
        queue.append(StoredMessage(len(queue) + 1, value, key, "", {}, 1_763_776_220_123))
    return queues


async def serve_pull_replies(spec: ReplaySpec, ready: Ready) -> dict[str, Any]:
    queues = _queues(spec)
    positions = [0] * spec.queues
    turn = 0

    def next_batch() -> tuple[int, list[StoredMessage]]:
        nonlocal turn
        for _ in range(spec.queues):
            qid = turn
            turn = (turn + 1) % spec.queues
            start = positions[qid]
            if start < len(queues[qid]):
                positions[qid] = start + spec.batch
                return qid, queues[qid][start : start + spec.batch]
        return -1, []

    async def pull(seqid: int, request: Any) -> bytes:
        qid, batch = next_batch()
        if not batch:
            await asyncio.sleep((request.maxLingerTime or 0) / 1000)
        return encode_pull_reply(seqid, request.groupId, spec.topic, str(qid) if batch else "", batch)

    await _serve(spec.port, ready, lambda results: None, pull)
    return {}


def _body_for(name: str, mtype: int) -> Any:
    return ConsumerService.submit_args() if name == "submit" else ConsumerService.pull_args()


async def _serve(
    port: int,
    ready: Ready,
    on_submit: Callable[[ConsumeResult | None], None],
    on_pull: Callable[[int, Any], Awaitable[bytes]],
) -> None:
    """Serve ``port`` until the harness terminates this process: each ``submit`` goes to ``on_submit``
    and is answered true, each ``pull`` is answered with ``on_pull(seqid, request)``; one call at a
    time per connection, as the proxy answers."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                header = await reader.readexactly(wire.FRAME_HEADER_BYTES)
                envelope = wire.decode(await reader.readexactly(wire.frame_length(header)), _body_for)
                if envelope.name == "submit":
                    on_submit(envelope.body.result)
                    result = ConsumerService.submit_result(success=True)
                    writer.write(wire.encode("submit", TMessageType.REPLY, envelope.seqid, result))
                    continue
                writer.write(await on_pull(envelope.seqid, envelope.body.request))
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        ready()
        await server.serve_forever()


@dataclass(frozen=True)
class OrderedWorkSpec:
    """P3's backlog as :func:`bench.dataset.draw` makes it (same count, keys, work and seed)."""

    port: int
    topic: str
    queues: int
    messages: int
    keys: int
    work_ms: tuple[float, float]


class _KeyGate:
    """The keys' chains in produce order; per queue, the heads ready to go, oldest first."""

    def __init__(self, spec: OrderedWorkSpec) -> None:
        self.chains: dict[str, deque[StoredMessage]] = {}
        #: Per queue, a heap of (offset, message): the oldest ready head goes first, as from the proxy.
        self.ready: list[list[tuple[int, StoredMessage]]] = [[] for _ in range(spec.queues)]
        self.out: dict[tuple[int, int], str] = {}  # (qid, offset) handed out -> key
        self.turn = 0
        self.changed = asyncio.Event()
        sizes = [0] * spec.queues
        qids: dict[str, int] = {}
        for key, seq, work in draw(spec.messages, keys=spec.keys, work_ms=spec.work_ms):
            qid = qids.setdefault(key, queue_for_key(key, spec.queues))
            sizes[qid] += 1
            message = StoredMessage(sizes[qid], body(key, seq, w=work or 0.0).encode(), key, "", {}, 0)
            chain = self.chains.setdefault(key, deque())
            if not chain:
                self.ready[qid].append((message.offset, message))
            chain.append(message)

    def take(self, wanted: int) -> tuple[int, list[StoredMessage]]:
        """Up to ``wanted`` heads of the next queue that has some (round-robin); (-1, []) if none has."""
        for _ in range(len(self.ready)):
            qid = self.turn
            self.turn = (self.turn + 1) % len(self.ready)
            ready = self.ready[qid]
            if ready:
                batch = [heapq.heappop(ready)[1] for _ in range(min(wanted, len(ready)))]
                for message in batch:
                    self.out[(qid, message.offset)] = message.key
                return qid, batch
        return -1, []

    def ack(self, results: ConsumeResult | None) -> None:
        """Each acked head leaves its chain; the key's next message becomes ready."""
        while results is not None:
            qid = int(results.context.qid) if results.context and results.context.qid else -1
            for offset in results.successOffsets or ():
                key = self.out.pop((qid, offset), None)
                if key is None:
                    continue  # not handed out (a repeated ack): nothing to release
                chain = self.chains[key]
                chain.popleft()
                if chain:
                    heapq.heappush(self.ready[qid], (chain[0].offset, chain[0]))
            results = results.nextResult
        self.changed.set()


async def serve_ordered_work(spec: OrderedWorkSpec, ready: Ready) -> dict[str, Any]:
    gate = _KeyGate(spec)

    async def pull(seqid: int, request: Any) -> bytes:
        gate.ack(request.result)
        deadline = asyncio.get_running_loop().time() + (request.maxLingerTime or 0) / 1000
        while True:
            qid, batch = gate.take(request.maxBatchSize or 1)
            if batch:
                return encode_pull_reply(seqid, request.groupId, spec.topic, str(qid), batch)
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return encode_pull_reply(seqid, request.groupId, spec.topic, "", [])
            gate.changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await gate.changed.wait()

    await _serve(spec.port, ready, gate.ack, pull)
    return {}
