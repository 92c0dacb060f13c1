"""The order checker the system tests judge the proxy by: it must pass a legal replay after a lease
moved away and back, and catch a key delivered past its unacked head, whichever term it happens in."""

from __future__ import annotations

from typing import Any

from tests.support import Delivery, check_order_by_term


def _read(t: float, owner: str, term: int, first: int, last: int) -> dict[str, Any]:
    return {"t": t, "rt": t, "owner": owner, "qid": 3, "term": term, "first": first, "last": last}


#: Queue 3 read by near (term 1), then far (term 3) while near was cut off, then near again (term 4)
#: from the committed offset 45, so near reads offset 62 under two terms.
READS = [_read(10.0, "near", 1, 1, 64), _read(11.0, "far", 3, 25, 150), _read(13.0, "near", 4, 45, 200)]


def _delivery(owner: str, offset: int, seq: int, received: float, acked: bool = True) -> Delivery:
    return Delivery(owner, 3, offset, "rider-98", seq, acked, received=received)


def test_a_replay_after_the_lease_came_back_is_in_order() -> None:
    log = [
        _delivery("near", 8, 0, 10.1), _delivery("near", 62, 1, 10.2),  # term 1
        _delivery("far", 87, 2, 11.1), _delivery("far", 97, 3, 11.2),  # term 3; far's ack of 97 is lost
        _delivery("near", 97, 3, 13.1), _delivery("near", 99, 4, 13.2),  # term 4 replays from 97
    ]
    checker = check_order_by_term(READS, log)
    assert checker.violations == []
    assert checker.duplicates == 1
    assert checker.missing({"rider-98": 5}) == {}


def test_a_key_delivered_past_its_unacked_head_is_caught_in_any_term() -> None:
    log = [
        _delivery("near", 8, 0, 10.1), _delivery("near", 62, 1, 10.2, acked=False),
        _delivery("near", 63, 2, 10.3),  # term 1: seq 2 while seq 1 is not acked
    ]
    assert check_order_by_term(READS, log).violations == [
        "rider-98: seq 2 delivered before seq 1 was acked (epoch 1)",
        "rider-98: seq 2 delivered while the head is 1 (epoch 1)"]
    replayed = [
        _delivery("near", 8, 0, 10.1), _delivery("near", 62, 1, 10.2),
        _delivery("near", 62, 1, 13.1, acked=False), _delivery("near", 87, 2, 13.2),  # term 4: past its head
    ]
    assert check_order_by_term(READS, replayed).violations == [
        "rider-98: seq 2 delivered while the head is 1 (epoch 4)"]


def test_the_receive_time_picks_the_term_on_the_audits_clock() -> None:
    # Offset 62 is read by near under term 1 and again under term 4: each delivery of it belongs to the
    # term of the read before it, or its legal replay in term 4 looks like a step back.
    log = [Delivery("near", 3, 62, "k", 0, True, received=10.2), Delivery("near", 3, 62, "k", 0, True, received=13.1),
           Delivery("near", 3, 87, "k", 1, True, received=13.2)]
    assert check_order_by_term(READS, log).violations == []
    skewed = [dict(record, t=record["t"] + 100.0) for record in READS]  # near's wall clock runs ahead
    assert check_order_by_term(skewed, log, clock="rt").violations == []
    undated = [Delivery(d.owner, d.qid, d.offset, d.key, d.seq, d.acked) for d in log]
    assert check_order_by_term(READS, undated).violations == ["k: seq 0 delivered while the head is 1 (epoch 4)"]
