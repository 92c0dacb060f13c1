"""A stand-in pull server for P1's client floor: what the Thrift clients alone can take.

It speaks the proxy's wire protocol on a real socket, in its own process, but has no Redis, no key
gate, no buffer and no offsets: each ``pull`` is answered at once with the next ``batch`` messages of
the next queue (round-robin, like the proxy), encoded by the proxy's own reply encoder; acks are
decoded and dropped; ``submit`` answers true. Once every message went out, pulls get an empty reply
after their linger time. The client load that drains it is P1's, unchanged, so the rate it reaches
is the most P1's clients could ever do on this machine, whatever the proxy did.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from ddmq.protocol import wire
from ddmq.protocol.pull_codec import encode_pull_reply
from ddmq.protocol.wire import ConsumerService, TMessageType
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
        body = f'{{"k":"{key}","seq":{seq},"ts":1763776220.12}}'.encode()
        queue = queues[seq % spec.queues]
        queue.append(StoredMessage(len(queue) + 1, body, key, "", {}, 1_763_776_220_123))
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

    def body_for(name: str, mtype: int) -> Any:
        return ConsumerService.submit_args() if name == "submit" else ConsumerService.pull_args()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                header = await reader.readexactly(wire.FRAME_HEADER_BYTES)
                envelope = wire.decode(await reader.readexactly(wire.frame_length(header)), body_for)
                if envelope.name == "submit":
                    result = ConsumerService.submit_result(success=True)
                    writer.write(wire.encode("submit", TMessageType.REPLY, envelope.seqid, result))
                    continue
                request = envelope.body.request
                qid, batch = next_batch()
                if not batch:
                    await asyncio.sleep((request.maxLingerTime or 0) / 1000)
                reply = encode_pull_reply(
                    envelope.seqid, request.groupId, spec.topic, str(qid) if batch else "", batch
                )
                writer.write(reply)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", spec.port)
    async with server:
        ready()
        await server.serve_forever()  # the harness terminates this process
    return {}
