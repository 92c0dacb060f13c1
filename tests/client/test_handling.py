"""What a processor's answer becomes on the wire: reasons cut to 1 KiB on a character boundary, Retry's
delay, NotProcessed as a release, and the keeper's extensions of a held batch (the encoding itself is
pinned by the protocol tests; here, which offsets and fields a consumer puts into it)."""

from __future__ import annotations

import pytest

from ddmq.client import Retry
from ddmq.client.handling import MAX_REASON_BYTES, Verdict, outcome_of, reason_text, report
from ddmq.client.keepalive import DEFAULT_GROUP_TIMEOUT_MS, Held, extend_every_s
from ddmq.client.pull_parts import ConsumedMessage, NotProcessed, PendingResults
from ddmq.config.schema import TopicGroupConfig


def message(offset: int, qid: str = "0") -> ConsumedMessage:
    return ConsumedMessage("t", qid, offset, f"k{offset}", b"v", "", {})


def test_reasons_are_cut_to_one_kib_of_utf8_on_a_character_boundary() -> None:
    assert reason_text("short") == "short"
    cut = reason_text("é" * 2000)  # two bytes each
    assert len(cut.encode()) <= MAX_REASON_BYTES and cut.endswith("…")
    assert cut.encode().decode() == cut  # still valid UTF-8
    assert reason_text("x" * MAX_REASON_BYTES) == "x" * MAX_REASON_BYTES


def test_answers_of_a_processor() -> None:
    m = message(7)

    def boom() -> bool:
        raise ValueError("bad amount -3")

    def retry() -> bool:
        raise Retry(1500, "downstream busy")

    def give_back() -> bool:
        raise NotProcessed

    assert outcome_of(lambda: True, m).verdict is Verdict.ACK
    assert outcome_of(lambda: False, m).verdict is Verdict.FAIL
    failed = outcome_of(boom, m)
    assert (failed.verdict, failed.reason, failed.retry_after_ms) == (Verdict.FAIL, "ValueError: bad amount -3", None)
    retried = outcome_of(retry, m)
    assert (retried.verdict, retried.reason, retried.retry_after_ms) == (Verdict.FAIL, "downstream busy", 1500)
    assert outcome_of(give_back, m).verdict is Verdict.RELEASE
    assert Retry().after_ms is None and Retry().reason == "retry requested"
    with pytest.raises(ValueError):
        Retry(-1)

    def interrupted() -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):  # not the message's fault: it stops the consumer instead
        outcome_of(interrupted, m)


def test_answers_reach_the_wire_result() -> None:
    pending = PendingResults("g")
    report(pending, message(1), outcome_of(lambda: True, message(1)))
    report(pending, message(2), outcome_of(_raises(Retry(900, "later")), message(2)))
    report(pending, message(3), outcome_of(_raises(NotProcessed()), message(3)))
    result = pending.to_wire()
    assert result is not None and result.nextResult is None
    assert result.successOffsets == [1]
    assert result.releaseOffsets == [3]
    assert [(d.offset, d.retryAfterMs, d.reason) for d in result.failDetails] == [(2, 900, "later")]


def _raises(exc: BaseException) -> object:
    def call() -> bool:
        raise exc

    return call


def test_a_held_batch_is_extended_every_half_timeout() -> None:
    assert DEFAULT_GROUP_TIMEOUT_MS == TopicGroupConfig.model_fields["timeout_ms"].default  # the proxy's default
    every_s = extend_every_s(1000)
    assert every_s == 0.5 and extend_every_s(None) is None
    with pytest.raises(ValueError):
        extend_every_s(0)
    held = Held("g")
    assert held.extension(100.0, every_s) is None  # nothing held
    held.hold([message(4), message(5), message(9, qid="1")], now=100.0)
    assert held.extension(100.4, every_s) is None  # not yet
    result = held.extension(100.5, every_s)
    assert result is not None
    extended = {(r.context.qid, tuple(r.extendOffsets)) for r in _nodes(result)}
    assert extended == {("0", (4, 5)), ("1", (9,))}
    assert held.extension(100.9, every_s) is None  # the clock restarts at each extension
    assert held.extension(101.0, every_s) is not None
    held.let_go()
    assert held.extension(200.0, every_s) is None


def _nodes(result: object) -> list[object]:
    nodes = []
    while result is not None:
        nodes.append(result)
        result = result.nextResult  # type: ignore[attr-defined]
    return nodes


@pytest.mark.parametrize("args", [
    ["--retry-after-ms", "500"],  # without --fail-reason
    ["--fail-reason", "x", "--retry-after-ms", "-1"],
    ["--group-timeout-ms", "0"],
])
def test_consume_refuses_bad_failure_options(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from ddmq.client.cli.main import main

    assert main(["consume", "--servers", "127.0.0.1:1", "--group", "g", *args]) == 2
    assert capsys.readouterr().err.startswith("ddmq consume: --")
