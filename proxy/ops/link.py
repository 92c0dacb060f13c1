"""The proxy's link to Redis, its clock against Redis's and its supervised tasks, for ``/metrics``.

- ``ddmq_redis_reachable`` (1/0), ``ddmq_redis_failures_total``, ``ddmq_redis_slow_rounds_total`` and
  ``ddmq_redis_round_seconds``: the upkeep's rounds as :class:`~ddmq.proxy.cluster.link_health.LinkHealth`
  sees them (the ``DdmqRedisUnreachable`` and ``DdmqRedisSlow`` alert rules read them);
- ``ddmq_clock_rate`` (this host's seconds per Redis second) and ``ddmq_clock_offset_seconds`` (this
  host's wall clock minus Redis's), ``ddmq_loop_stalls_total`` (pauses of the process that made the
  proxy check its leases before serving): :class:`~ddmq.proxy.cluster.lease_clock.LeaseClock`;
- ``ddmq_task_restarts_total{task}``: tasks restarted after an unexpected error
  (:mod:`~ddmq.proxy.core.supervise`).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ddmq.proxy.cluster.lease_clock import LeaseClock
from ddmq.proxy.cluster.link_health import LinkHealth
from ddmq.proxy.core.supervise import RESTARTS

#: Every kind of supervised task, so each has a series from the start (a counter that appears only
#: once it is 1 cannot be alerted on with ``increase``).
TASKS = ("reader", "upkeep", "committer", "trimmer", "idle-watcher", "key-commands")


class LinkCollector(Collector):
    def __init__(self, health: LinkHealth, clock: LeaseClock) -> None:
        self._health = health
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        health, clock = self._health, self._clock
        yield GaugeMetricFamily("ddmq_redis_reachable", "1 while the proxy's heartbeat rounds reach Redis, 0 "
                                "from the first failed round until one goes through.", value=int(health.reachable))
        yield CounterMetricFamily("ddmq_redis_failures", "Heartbeat rounds that failed or timed out.",
                                  value=health.failures)
        yield CounterMetricFamily("ddmq_redis_slow_rounds", "Heartbeat rounds slower than redis_client.slow_ms.",
                                  value=health.slow_rounds)
        yield GaugeMetricFamily("ddmq_redis_round_seconds", "How long the last heartbeat round that went through "
                                "took.", value=health.last_round_s)
        yield GaugeMetricFamily("ddmq_clock_rate", "This host's clock seconds per second of Redis's clock (1: "
                                "they agree); leases are timed on Redis's.", value=clock.rate)
        offset = clock.offset_s()
        if offset is not None:
            yield GaugeMetricFamily("ddmq_clock_offset_seconds", "This host's wall clock minus Redis's; nothing "
                                    "the proxy compares between hosts uses it.", value=offset)
        yield CounterMetricFamily("ddmq_loop_stalls", "Times the event loop did not run for longer than the stall "
                                  "limit (a paused or overloaded process): leases were checked before serving again.",
                                  value=clock.stalls)
        restarts = CounterMetricFamily("ddmq_task_restarts", "Tasks restarted after an unexpected error, by kind.",
                                       labels=["task"])
        for task in sorted({*TASKS, *RESTARTS}):
            restarts.add_metric([task], RESTARTS[task])
        yield restarts
