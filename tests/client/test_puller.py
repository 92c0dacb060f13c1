"""The puller logic both consumers drive (:mod:`ddmq.client.puller`), step by step: what a failed pull,
an answer and each processed message of a run mean. The consumers over a real proxy are tested in
test_consumer_runs.py, test_handling.py and test_consume_cli.py."""

from __future__ import annotations

import time

from ddmq.client.handling import ACK, FAIL, RELEASE
from ddmq.client.pull_parts import ConsumedMessage, Counters, FatalError, PullerSettings
from ddmq.client.puller import Puller
from ddmq.client.thrift_client import ProxyConnectionError, PullError
from ddmq.protocol.wire import Context, Message, PullResponse


def _puller(linger_ms: int = 1000, errors: list[Exception] | None = None) -> tuple[Puller, Counters, FatalError]:
    settings = PullerSettings("127.0.0.1:9713", "g", None, 1, 32, linger_ms, 100, 5000, 10.0, max_per_key=4)
    counters = Counters()
    fatal = FatalError(errors.append if errors is not None else None)
    return Puller(settings, counters, fatal, "127.0.0.1", 9713), counters, fatal


def _run(offsets: list[int]) -> list[ConsumedMessage]:
    return [ConsumedMessage("t", "0", offset, "k", b"v", "", {}) for offset in offsets]


def test_a_retriable_error_backs_off_and_a_fatal_one_stops_the_consumer() -> None:
    errors: list[Exception] = []
    puller, counters, fatal = _puller(errors=errors)
    delays = [puller.failed(ProxyConnectionError("refused")) for _ in range(4)]
    assert all(delay is not None and delay > 0 for delay in delays)
    assert fatal.error is None
    unknown_group = PullError(1001, "unknown group g")
    assert puller.failed(unknown_group) is None
    assert fatal.error is unknown_group and errors == [unknown_group]
    assert counters.snapshot().errors == 5


def test_an_answer_clears_what_it_carried_and_counts_its_messages() -> None:
    puller, counters, _ = _puller()
    puller.settle(_run([5]), 0, ACK)
    assert puller.request().result is not None  # the ack rides on the next pull
    response = PullResponse(context=Context("g", "t", "0"), messages=[Message(key="k", value=b"v", offset=6)])
    messages, pause_s = puller.answered(response, time.monotonic())
    assert [m.offset for m in messages] == [6] and pause_s == 0.0
    assert puller.request().result is None  # answered: the ack reached the proxy
    assert counters.snapshot().pulled == 1 and counters.answered == 1


def test_an_early_empty_answer_pauses_and_a_long_poll_does_not() -> None:
    puller, _, _ = _puller(linger_ms=1000)
    empty = PullResponse(context=Context("g", "t", "0"), messages=[])
    assert puller.answered(empty, time.monotonic()) == ([], 0.1)
    assert puller.answered(empty, time.monotonic() - 1.0) == ([], 0.0)


def test_a_run_stops_at_its_first_message_not_acked_and_the_rest_goes_unreported() -> None:
    puller, counters, _ = _puller()
    run = _run([1, 2, 3, 4])
    assert puller.settle(run, 0, ACK)
    assert not puller.settle(run, 1, FAIL)
    stats = counters.snapshot()
    assert (stats.acked, stats.failed, stats.unreported) == (1, 1, 2)
    result = puller.request().result
    assert result is not None and result.successOffsets == [1] and result.failOffsets == [2]


def test_released_messages_and_the_final_submit() -> None:
    puller, counters, _ = _puller()
    assert puller.final() is None  # nothing to report: no final submit
    puller.settle(_run([7]), 0, RELEASE)
    puller.release(_run([8, 9]))
    puller.held.hold(_run([10]), time.monotonic())
    final = puller.final()
    assert final is not None and final.releaseOffsets == [7, 8, 9]
    assert len(puller.held) == 0  # what the final submit reports is no longer extended
    assert counters.snapshot().released == 3


def test_held_messages_are_extended_once_held_long_enough() -> None:
    puller, counters, _ = _puller()
    puller.held.hold(_run([1, 2]), time.monotonic() - 10)
    extension = puller.extension(every_s=5)
    assert extension is not None and extension.extendOffsets == [1, 2]
    puller.extended(None)
    assert counters.snapshot().extended == 2
    puller.extended(ProxyConnectionError("gone"))  # logged, not counted: the next round tries again
    assert counters.snapshot().extended == 2
