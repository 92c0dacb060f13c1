"""The soak of ``tests/soak.py`` (``python bench/soak.py``), small enough for CI: 3,000 messages, each fault once.

Three proxies, three consumer processes, Redis with ``appendfsync always``; a proxy killed with kill
-9 and restarted, a consumer killed with kill -9 while it holds a batch, Redis killed with kill -9
and restarted on its port, a proxy stopped with SIGSTOP past its lease and continued. One run (a
module fixture, ~25 s) and one test per property, so a failure names what broke; the numbers are
printed (``pytest -s``). The full-size run (60,000 messages, two rounds) is the bench's:
``python bench/soak.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.soak import FAULTS, SoakConfig, SoakResult, check, format_report, run_soak

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


def test_one_reader_per_queue_and_term_besides_a_continued_proxys_reads(soak: SoakResult) -> None:
    """Every second reader the audit shows is one of a continued proxy's reads, which the audit records
    apart and the next test holds to nothing read."""
    assert soak.figures["single_reader_besides_stale_reads"] == "ok"


def test_a_proxy_continued_after_its_lease_reads_nothing(soak: SoakResult) -> None:
    stop = next(fault for fault in soak.faults if fault["kind"] == "proxy-stop")
    assert stop["stale_reads"] == 0
    assert soak.figures["single_reader"] == "ok"


def _write_run(folder: Path, reads: list[dict[str, Any]], deliveries: list[list[Any]]) -> None:
    (folder / "proxy-1.reads.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reads))
    (folder / "c1.0.jsonl").write_text("".join(json.dumps(d) + "\n" for d in deliveries))


def _read(t: float, term: int, first: int, last: int) -> dict[str, Any]:
    return {"t": t, "owner": "proxy-1", "group": "g", "topic": "t", "qid": 0, "term": term, "first": first,
            "last": last}


def _delivery(t: float, offset: int, seq: int, acked: bool = True) -> list[Any]:
    return [t, t + 0.1, "proxy-1", 0, offset, "a", seq, acked, 0, "c1.0"]


def test_the_checker_accepts_a_replay_after_a_restart_and_catches_reordering_and_loss(tmp_path: Path) -> None:
    """The checks the soak relies on, on records written by hand. A proxy restarted under its instance
    id reads offsets 2-3 again under term 2; the redelivery of seq 1 (its ack was lost with the old
    incarnation) is legal, because the first delivery of seq 1 is placed in term 1 by its time."""
    reads = [_read(1.0, 1, 1, 3), _read(10.0, 2, 2, 3)]
    clean = tmp_path / "clean"
    clean.mkdir()
    _write_run(clean, reads, [_delivery(2.0, 1, 0), _delivery(3.0, 2, 1), _delivery(11.0, 2, 1), _delivery(12.0, 3, 2)])
    result = check(SoakConfig(messages=3), clean, {"a": 3}, [])
    assert result.problems == []
    assert result.figures["redelivered"] == 1

    reordered = tmp_path / "reordered"
    reordered.mkdir()
    _write_run(reordered, reads, [_delivery(2.0, 1, 0), _delivery(3.0, 2, 1, acked=False), _delivery(4.0, 3, 2),
                                  _delivery(5.0, 2, 1)])
    result = check(SoakConfig(messages=3), reordered, {"a": 3}, [])
    assert result.figures["order_violations"] >= 1
    assert "a: seq 2 delivered before seq 1 was acked" in result.figures["order_violation_examples"][0]
    assert result.figures["lost"] == 0

    lossy = tmp_path / "lossy"
    lossy.mkdir()
    _write_run(lossy, reads, [_delivery(2.0, 1, 0), _delivery(3.0, 2, 1, acked=False)])
    result = check(SoakConfig(messages=3), lossy, {"a": 3}, [])
    assert (result.figures["lost"], result.figures["never_delivered"]) == (2, 1)
    assert not result.ok
