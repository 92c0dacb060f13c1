"""The default mode's labels (rollup.default_labels) and TopicRows, which writes (group, topic)
figures at them: per (group, topic) as given, per group and per proxy added up (the max for an age or
a longest chain). The end-to-end check against a real proxy is in test_metrics.py."""

from __future__ import annotations

import pytest

from ddmq.proxy.ops.exposition import COUNTER, GAUGE, HISTOGRAM, Family
from ddmq.proxy.ops.rollup import TopicRows, default_labels, retarget

TOPIC = ("group", "topic")


def test_only_the_families_followed_per_topic_keep_the_topic_by_default() -> None:
    assert default_labels("ddmq_lag_messages", ("group", "topic", "qid")) == TOPIC
    assert default_labels("ddmq_messages_acked", ("group", "topic", "qid")) == TOPIC
    assert default_labels("ddmq_messages_ready", ("group", "topic", "qid")) == ("group",)
    assert default_labels("ddmq_keys", ("group", "topic", "state")) == ("group", "state")
    assert default_labels("ddmq_acks_late", ("group", "topic", "qid")) == ()
    assert default_labels("ddmq_order_chain_length", TOPIC) == ()
    # Without a topic label, a family keeps what it has.
    assert default_labels("ddmq_parked_pulls", ("group",)) == ("group",)
    assert default_labels("ddmq_proxy_events", ("event",)) == ("event",)


def test_topic_rows_add_up_per_group_and_per_proxy_and_keep_the_max_where_a_sum_means_nothing() -> None:
    finest = [Family("ddmq_messages_acked", COUNTER, "Acked.", TOPIC),
              Family("ddmq_messages_ready", GAUGE, "Ready.", TOPIC),
              Family("ddmq_order_chain_length_max", GAUGE, "Longest.", TOPIC),
              Family("ddmq_acks_late", COUNTER, "Late.", TOPIC)]
    rows = TopicRows([retarget(family) for family in finest])
    rows.add("g1", "a", (1, 10, 3, 1))
    rows.add("g1", "b", (2, 20, 7, 0))
    rows.add("g2", "a", (4, 40, 5, 2))
    acked, ready, longest, late = rows.done()
    assert acked.labels == TOPIC and acked.rows == [(("g1", "a"), 1), (("g1", "b"), 2), (("g2", "a"), 4)]
    assert ready.labels == ("group",) and ready.rows == [(("g1",), 30), (("g2",), 40)]
    assert longest.rows == [(("g1",), 7), (("g2",), 5)]
    assert late.labels == () and late.rows == [((), 3)]


def test_no_rows_no_series_and_only_plain_families() -> None:
    (late,) = TopicRows([Family("ddmq_acks_late", COUNTER, "Late.", ())]).done()
    assert late.rows == []
    with pytest.raises(ValueError, match="ddmq_action_duration_seconds"):
        TopicRows([Family("ddmq_action_duration_seconds", HISTOGRAM, "Durations.", ("action",))])
    with pytest.raises(ValueError, match="ddmq_keys"):
        TopicRows([Family("ddmq_keys", GAUGE, "Keys.", ("group", "state"))])
