"""Pause records in a real Redis: durations, a pause that ends by Redis's clock, resume of one topic or all."""

from __future__ import annotations

import time

import pytest
import redis

from ddmq.protocol.redis.pauses import parse_duration, pause, pauses, resume


def test_durations_and_bad_ones() -> None:
    assert [parse_duration(t) for t in ("500ms", "30s", "10m", "2h", "1d")] == [500, 30_000, 600_000, 7_200_000,
                                                                                86_400_000]
    for bad in ("10", "5x", "-1s", "0s", "31d", ""):
        with pytest.raises(ValueError, match=r"e\.g\. 30s|at most 30d"):
            parse_duration(bad)


def test_pause_ends_by_itself_and_resume_lifts_one_topic_or_all(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        written = pause(client, "pg", None, "alice", 300)
        assert written.topic is None and written.by == "alice" and written.until_ms == written.at_ms + 300
        pause(client, "pg", "t1", "bob")
        now, found = pauses(client, "pg")
        assert now >= written.at_ms and {p.topic for p in found} == {None, "t1"}
        deadline = time.monotonic() + 5
        while len(pauses(client, "pg")[1]) != 1:  # the group-wide pause ran out; t1's has no end
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert resume(client, "pg", "t2") == 0 and resume(client, "pg", "t1") == 1
        pause(client, "pg", "t1", "bob")
        pause(client, "pg", "t2", "bob")
        assert resume(client, "pg", None) == 2 and pauses(client, "pg")[1] == []
        with pytest.raises(ValueError, match="not a topic"):
            pause(client, "pg", "*", "bob")
