"""The client's compact writer writes integer lists in one go: the bytes must stay thriftpy2's."""

from __future__ import annotations

import random
from typing import Any

import pytest
from thriftpy2.protocol.compact import TCompactProtocol
from thriftpy2.protocol.exc import TProtocolException
from thriftpy2.thrift import TPayload
from thriftpy2.transport import TMemoryBuffer

from ddmq.client import wire
from ddmq.client.wire import AckResult, ConsumeResult, ConsumerService, Context, PullRequest, TMessageType


def _thriftpy2_frame(name: str, seqid: int, body: TPayload) -> bytes:
    buffer: Any = TMemoryBuffer()
    protocol: Any = TCompactProtocol(buffer)
    protocol.write_message_begin(name, TMessageType.CALL, seqid)
    body.write(protocol)
    payload: bytes = buffer.getvalue()
    return len(payload).to_bytes(4, "big") + payload


def _offsets(rng: random.Random) -> list[int]:
    size = rng.choice([0, 1, 14, 15, 64, 300])
    pick = [0, 1, -1, 63, 64, 127, 128, 16_383, 16_384, (1 << 63) - 1, -(1 << 63)]
    return [rng.choice([rng.choice(pick), rng.getrandbits(rng.randint(1, 62))]) for _ in range(size)]


@pytest.mark.parametrize("seed", range(30))
def test_requests_with_offset_lists_match_thriftpy2(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [
        ConsumeResult(
            context=Context(groupId="g", topic="t", qid=str(qid)),
            successOffsets=_offsets(rng),
            failOffsets=rng.choice([None, [], _offsets(rng)]),
        )
        for qid in range(rng.randint(0, 4))
    ]
    request = PullRequest(groupId="g", topic="t", maxBatchSize=64, maxLingerTime=-5, result=wire.link_results(nodes))
    body = ConsumerService.pull_args(request=request)
    assert wire.encode("pull", TMessageType.CALL, seed, body) == _thriftpy2_frame("pull", seed, body)


def test_out_of_range_elements_raise_as_thriftpy2_does() -> None:
    body = ConsumerService.submit_args(result=ConsumeResult(successOffsets=[1, 1 << 63]))
    with pytest.raises(TProtocolException):
        wire.encode("submit", TMessageType.CALL, 1, body)


def test_nested_maps_are_left_to_thriftpy2() -> None:
    body = ConsumerService.ack_args(
        result=AckResult(consumerId="c", groupId="g", cluster="x", offsets={"t": {"0": 5, "1": 1 << 40}})
    )
    assert wire.encode("ack", TMessageType.CALL, 3, body) == _thriftpy2_frame("ack", 3, body)
