"""Options of format("ddmq"): case-insensitive names, defaults, and clear errors for bad values."""

from __future__ import annotations

import pytest

from ddmq.client.spark.options import DEFAULT_LEASE_TIMEOUT_MS, parse_options


def test_names_are_case_insensitive_and_defaults_apply() -> None:
    options = parse_options({"SERVERS": "h1:1,h2", "Group": "g", "maxmessagespertrigger": "10", "NUMPARTITIONS": "3"})
    assert options.servers == (("h1", 1), ("h2", 9713))
    assert options.group == "g" and options.mode == "pull" and options.topic is None
    assert options.max_messages_per_trigger == 10 and options.num_partitions == 3
    assert options.lease_timeout_ms == DEFAULT_LEASE_TIMEOUT_MS
    assert options.consumer_id == "spark-g-all"
    assert [options.server(i) for i in range(3)] == [("h1", 1), ("h2", 9713), ("h1", 1)]


def test_rows_per_partition_splits_the_read_limit() -> None:
    options = parse_options({"servers": "h", "group": "g", "maxBatchSize": "100", "pullsPerPartition": "4"})
    assert options.rows_per_partition(None, 2) == 400
    assert options.rows_per_partition(150, 2) == 75
    assert options.rows_per_partition(1, 4) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"group": "g"}, "servers"),
        ({"servers": "h"}, "group"),
        ({"servers": "h", "group": "g", "mode": "push"}, "mode"),
        ({"servers": "h", "group": "g", "numPartitions": "0"}, "numPartitions"),
        ({"servers": "h", "group": "g", "leaseTimeoutMs": "ten"}, "leaseTimeoutMs"),
        ({"servers": "h:99999", "group": "g"}, "port"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_options(options)
