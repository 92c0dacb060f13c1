"""The scenarios P1-P6 and R1 (and P1r, request ids; P1c, P1 on a Redis Cluster; P1h, a few hot keys; P6d,
a rolling restart), by id, in the order they run.

A scenario is a function ``(Settings) -> list[Row]`` that starts its own Redis and proxy, runs its
loads, stops both and returns its rows (P1 returns three: KEY, JSONPath and QID order keys).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.report import Row
from bench.scenarios.base import Settings
from bench.scenarios.deploy import rolling_restart
from bench.scenarios.failover import failover
from bench.scenarios.latency import latency
from bench.scenarios.memory import memory
from bench.scenarios.retention import retention_memory
from bench.scenarios.retriable import retriable
from bench.scenarios.spark import spark
from bench.scenarios.throughput import cluster_throughput, hot_keys, isolation, isolation_parked, throughput
from bench.scenarios.work import key_parallel_work

__all__ = ["SCENARIOS", "Scenario", "Settings"]


@dataclass(frozen=True)
class Scenario:
    id: str
    what: str
    run: Callable[[Settings], list[Row]]


SCENARIOS: dict[str, Scenario] = {
    s.id: s
    for s in (
        Scenario("P1", "throughput, ordered by KEY / $.k / QID (KEY, QID also with ordered runs), vs XREADGROUP+XACK",
                 throughput),
        Scenario("P1r", "throughput ordered by KEY, every pull with a request id, vs the same without", retriable),
        Scenario("P1h", "throughput with 16 hot keys, without and with ordered runs, vs XREADGROUP+XACK", hot_keys),
        Scenario("P1c", "throughput ordered by KEY on a 3-master Redis Cluster, vs XREADGROUP+XACK on it",
                 cluster_throughput),
        Scenario("P2", "head-of-line isolation: one key never acked", isolation),
        Scenario("P2p", "head-of-line isolation: one key parked (on_exhausted: park)", isolation_parked),
        Scenario("P3", "key-parallel work, 100 in flight", key_parallel_work),
        Scenario("P4", "latency produce -> client, vs XREAD BLOCK", latency),
        Scenario("P5", "proxy RSS under a large backlog", memory),
        Scenario("R1", "Redis memory and proxy RSS under a sustained produce + consume, default retention",
                 retention_memory),
        Scenario("P6", "failover: kill -9 and graceful moves, redelivery with/without persisted completions",
                 failover),
        Scenario("P6d", "rolling restart with the default leases: the longest a queue goes without a delivery",
                 rolling_restart),
        Scenario("S1", "Spark availableNow -> parquet via format(\"ddmq\") pull/queue, vs an in-memory source", spark),
    )
}
