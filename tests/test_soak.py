"""The soak of ``bench/soak.py``, small enough for CI: 3,000 messages, each fault once.

Three proxies, three consumer processes, Redis with ``appendfsync always``; a proxy killed with kill
-9 and restarted, a consumer killed with kill -9 while it holds a batch, Redis killed with kill -9
and restarted on its port, a proxy stopped with SIGSTOP past its lease and continued. One run (a
module fixture, ~25 s) and one test per property, so a failure names what broke; the numbers are
printed (``pytest -s``). The full-size run (60,000 messages, two rounds) is the bench's:
``python bench/soak.py``.
"""

from __future__ import annotations

import pytest

from bench.soak import FAULTS, SoakConfig, SoakResult, format_report, run_soak

pytestmark = pytest.mark.timeout(180)  # the first test runs the soak (~25 s on an idle machine)

CONFIG = SoakConfig(messages=3_000, rate=300.0, rounds=1, gap_s=2.0, drain_timeout_s=60.0)


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory) -> SoakResult:
    result = run_soak(CONFIG, tmp_path_factory.mktemp("soak"))
    print(f"\n{format_report(result)}")
    return result


def test_every_message_is_acked_and_committed(soak: SoakResult) -> None:
    figures = soak.figures
    assert figures["produced"] == CONFIG.messages
    assert figures["lost"] == 0, figures["lost_examples"]
    assert figures["never_delivered"] == 0
    assert figures["unexpected"] == 0
    assert figures["drained"]
    assert figures["committed"] == figures["produce_next"]


def test_every_key_stays_in_order(soak: SoakResult) -> None:
    assert soak.figures["deliveries_without_read"] == 0
    assert soak.figures["order_violations"] == 0, soak.figures["order_violation_examples"]


def test_each_fault_struck_mid_stream_and_delivery_resumed(soak: SoakResult) -> None:
    assert [fault["kind"] for fault in soak.faults] == list(FAULTS)
    for fault in soak.faults:
        assert fault["produced_before"] < CONFIG.messages, fault
        assert fault["resumed_ms"] is not None, fault
        if fault["kind"] in ("proxy-kill", "proxy-stop"):
            assert fault["queues"], fault
    held = next(fault for fault in soak.faults if fault["kind"] == "consumer-kill")["held"]
    assert held >= 2  # killed in the middle of a batch, not between two


@pytest.mark.xfail(
    strict=True,
    reason="issue 11 (smaller items): after SIGCONT a fenced proxy still reads its old queues under its "
    "old term a few times before dropping them; it delivers nothing, but the audit shows two readers",
)
def test_a_proxy_continued_after_its_lease_reads_nothing(soak: SoakResult) -> None:
    stop = next(fault for fault in soak.faults if fault["kind"] == "proxy-stop")
    assert stop["stale_reads"] == 0
    assert soak.figures["single_reader"] == "ok"
