"""PendingResults' verbs: sent only when used, so a client that never uses them sends today's bytes."""

from __future__ import annotations

from thriftpy2.thrift import TMessageType

from ddmq.client.pull_parts import ConsumedMessage, PendingResults
from ddmq.protocol import wire
from ddmq.protocol.wire.writer import encode


def _message(offset: int, qid: str = "0") -> ConsumedMessage:
    return ConsumedMessage(topic="t", qid=qid, offset=offset, key="k", value=b"v", tag="", properties={})


def _bytes(result: wire.ConsumeResult | None) -> bytes:
    return encode("submit", TMessageType.CALL, 1, wire.ConsumerService.submit_args(result=result))


def test_acks_and_fails_alone_encode_as_before() -> None:
    pending = PendingResults("g")
    pending.record(_message(1), True)
    pending.record(_message(2), False)
    pending.record(_message(3, qid="1"), True)
    before = wire.link_results([
        wire.ConsumeResult(wire.Context("g", "t", "0"), [1], [2]),
        wire.ConsumeResult(wire.Context("g", "t", "1"), [3], []),
    ])
    assert _bytes(pending.to_wire()) == _bytes(before)
    assert pending.to_json() == [
        {"group": "g", "topic": "t", "qid": "0", "success": [1], "fail": [2]},
        {"group": "g", "topic": "t", "qid": "1", "success": [3], "fail": []},
    ]


def test_verbs_go_in_fields_80_to_82() -> None:
    pending = PendingResults("g")
    pending.record(_message(1), False, reason="boom", retry_after_ms=250)
    pending.record(_message(2), False, reason="x")
    pending.release(_message(3))
    pending.extend(_message(4))
    assert len(pending) == 4
    node = pending.to_wire()
    assert node is not None
    assert node.failOffsets == [] and node.releaseOffsets == [3] and node.extendOffsets == [4]
    assert [(d.offset, d.retryAfterMs, d.reason) for d in node.failDetails or []] == [(1, 250, "boom"), (2, None, "x")]
    decoded = wire.decode(_bytes(node)[4:], lambda name, mtype: wire.ConsumerService.submit_args())
    assert decoded.body.result == node
    assert pending.to_json() == [{
        "group": "g", "topic": "t", "qid": "0", "success": [], "fail": [], "release": [3], "extend": [4],
        "fail_details": [{"offset": 1, "retry_after_ms": 250, "reason": "boom"},
                         {"offset": 2, "retry_after_ms": None, "reason": "x"}],
    }]
    pending.clear()
    assert len(pending) == 0 and pending.to_wire() is None
