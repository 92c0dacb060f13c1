"""Micro-benchmarks of the proxy's hot path, in CPU time (steadier than wall time on a shared box).

``python bench/micro.py [--messages N]`` prints, per message:

- ``codec``: encoding a 64-message pull reply with thriftpy2's own writer (the baseline: what a plain
  thriftpy2 server spends), with ``wire.encode`` from thriftpy2 structs, and with
  :mod:`ddmq.proxy.core.pull_codec`; the client's decoding of that reply; a pull request carrying 64 acks,
  encoded and decoded; one carrying a single ack, decoded (QID ordering's request: its whole cost
  falls on one message); a stream entry as XREAD returns it, decoded into the engine's message, without
  properties and with a ``traceparent`` (``stream_entry_traced_decode_us``);
- ``engine``: a real :class:`~ddmq.proxy.service.ProxyService` on an embedded Redis, chain
  ``Order, PullServer`` by KEY, drained through ``ProxyService.api.pull`` by 8 pullers acking on their next
  pull (no Thrift, no sockets to clients): reading, the chain, the key gate, the buffer and acks;
  ``engine_runs``: the same with the pulls asking for ordered runs (``max_per_key`` 64);
  ``engine_request_ids``: the same with a fresh request id on every pull, as the project's SDK sends;
  ``engine_traced``: the same backlog with a ``traceparent`` in every message's properties, as a
  traced producer sends it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))

from thriftpy2.protocol.compact import TCompactProtocol
from thriftpy2.transport import TMemoryBuffer

from bench.instructions import drain_engine, engine_config, produce_engine_backlog, reply_messages
from ddmq.protocol.wire import ConsumeResult, ConsumerService, Context, PullRequest, TMessageType, decode, encode
from ddmq.proxy.core.pull_codec import encode_pull_reply
from ddmq.proxy.core.types import PullBatch, QueueId
from ddmq.proxy.servers.thrift.handler import pull_response
from ddmq.proxy.service import ProxyService
from ddmq.proxy.store.broker import decode_fields
from ddmq.proxy.store.embedded import EmbeddedRedis

BATCH = 64


def _cpu_us(call: Callable[[], Any], repeat: int, per: int) -> float:
    began = time.process_time()
    for _ in range(repeat):
        call()
    return (time.process_time() - began) / repeat / per * 1e6


def codec(repeat: int = 300) -> dict[str, float]:
    messages = reply_messages()
    batch = PullBatch(QueueId("t", 3), messages)
    reply = encode_pull_reply(7, "g", "t", "3", messages)
    result = ConsumeResult(
        context=Context(groupId="g", topic="t", qid="3"),
        successOffsets=[m.offset for m in messages],
        failOffsets=[],
    )
    request = ConsumerService.pull_args(
        request=PullRequest(groupId="g", topic="t", maxBatchSize=BATCH, maxLingerTime=200, result=result)
    )
    request_frame = encode("pull", TMessageType.CALL, 7, request)
    # QID ordering's pull: one ack per request, so the request's fixed cost is all there is per message.
    one_ack = ConsumerService.pull_args(
        request=PullRequest(
            groupId="g",
            topic="t",
            maxBatchSize=BATCH,
            maxLingerTime=200,
            result=ConsumeResult(
                context=Context(groupId="g", topic="t", qid="3"), successOffsets=[100_000], failOffsets=[]
            ),
        )
    )
    one_ack_frame = encode("pull", TMessageType.CALL, 7, one_ack)
    # what XREAD hands the reader: entry id and the producer's flat field list (no properties)
    entries = [
        (f"0-{m.offset}".encode(), [b"v", m.value, b"k", m.key.encode(), b"t", b"", b"ts", b"1763776220123"])
        for m in messages
    ]
    # the same with a trace context, as every message of a traced producer carries one
    traced = [
        (entry_id, [*fields[:6], b"p", b'{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}',
                    *fields[6:]])
        for entry_id, fields in entries
    ]

    def structs_reply() -> bytes:
        frame: bytes = encode(
            "pull", TMessageType.REPLY, 7, ConsumerService.pull_result(success=pull_response("g", "t", batch))
        )
        return frame

    def thriftpy2_reply() -> bytes:
        buffer: Any = TMemoryBuffer()  # type: ignore[no-untyped-call]
        protocol: Any = TCompactProtocol(buffer)  # type: ignore[no-untyped-call]
        protocol.write_message_begin("pull", TMessageType.REPLY, 7)
        protocol.write_struct(ConsumerService.pull_result(success=pull_response("g", "t", batch)))
        payload: bytes = buffer.getvalue()
        return len(payload).to_bytes(4, "big") + payload

    return {
        "reply_encode_thriftpy2_us": _cpu_us(thriftpy2_reply, repeat, BATCH),
        "reply_encode_structs_wire_encode_us": _cpu_us(structs_reply, repeat, BATCH),
        "reply_encode_pull_codec_us": _cpu_us(lambda: encode_pull_reply(7, "g", "t", "3", messages), repeat, BATCH),
        "reply_decode_client_us": _cpu_us(
            lambda: decode(reply[4:], lambda name, mtype: ConsumerService.pull_result()), repeat, BATCH
        ),
        "request_with_acks_encode_us": _cpu_us(lambda: encode("pull", TMessageType.CALL, 7, request), repeat, BATCH),
        "request_with_acks_decode_us": _cpu_us(
            lambda: decode(request_frame[4:], lambda name, mtype: ConsumerService.pull_args()), repeat, BATCH
        ),
        "request_with_1_ack_decode_us": _cpu_us(
            lambda: decode(one_ack_frame[4:], lambda name, mtype: ConsumerService.pull_args()), repeat * 20, 1
        ),
        "stream_entry_decode_us": _cpu_us(lambda: [decode_fields(i, f) for i, f in entries], repeat, BATCH),
        "stream_entry_traced_decode_us": _cpu_us(lambda: [decode_fields(i, f) for i, f in traced], repeat, BATCH),
    }


async def _engine(
    url: str, messages: int, max_per_key: int | None = None, request_ids: bool = False, traced: bool = False
) -> float:
    await produce_engine_backlog(url, messages, traced=traced)
    async with ProxyService(engine_config(url)) as service:
        began = time.process_time()
        await drain_engine(service.api, messages, max_per_key, request_ids=request_ids)
        return (time.process_time() - began) / messages * 1e6


def engine(messages: int) -> dict[str, float]:
    figures = {}
    runs = (
        ("engine_cpu_us", None, False, False), ("engine_runs_cpu_us", 64, False, False),
        ("engine_request_ids_cpu_us", None, True, False), ("engine_traced_cpu_us", None, False, True),
    )
    for name, max_per_key, request_ids, traced in runs:
        with tempfile.TemporaryDirectory() as data_dir:
            redis_server = EmbeddedRedis(data_dir).start()
            try:
                figures[name] = asyncio.run(_engine(redis_server.url, messages, max_per_key, request_ids, traced))
            finally:
                redis_server.stop()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(prog="python bench/micro.py", description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000, help="messages for the engine run")
    parser.add_argument("--codec-only", action="store_true", help="only the codec figures (no Redis, seconds)")
    args = parser.parse_args()
    for name, value in {**codec(), **({} if args.codec_only else engine(args.messages))}.items():
        print(f"{name:38s} {value:7.2f} us per message")
    return 0


if __name__ == "__main__":
    sys.exit(main())
