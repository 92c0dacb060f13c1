"""P1r: what request ids cost. P1's backlog (order key KEY) and clients, drained by proxies whose
pulls name no request id (as P1's) and by proxies whose every pull names a fresh one (as the project's
SDK sends, so a pull whose reply is lost can be retried: ``proxy/api/pull_retries.py``).

The two drains alternate, :data:`PAIRS` of each, each with a fresh proxy and group, between baseline
XREADGROUP+XACK drains; the figure is the median P1r rate over the median P1 rate of the same run
(target :data:`SHARE`). Each drain of a run is a little slower than the one before it (about 8 % a
drain on this host, whichever kind it is), so the pairs take turns going first (ABBA): with a fixed
order the drains with ids, always second, lost that drift to the others and looked 7-17 % slower. The
ratio to raw Redis is in the row's data too.
"""

from __future__ import annotations

import statistics

from bench.dataset import QUEUES, produce_backlog
from bench.report import Row, Target
from bench.scenarios.base import ORDER_KEYS, Settings, log
from bench.scenarios.throughput import BASELINE_RUNS, KEYS, Drained, drain_baseline, drain_via_proxy
from tests.harness.stack import RedisServer

__all__ = ["PAIRS", "SHARE", "retriable"]

#: Drains of each kind (without and with request ids), in pairs that take turns going first: even.
PAIRS = 4
#: P1r's rate is to reach this share of P1's in the same run.
SHARE = 0.97


def _committed_rate(messages: int, drained: Drained) -> float:
    return messages / drained.result["committed_s"]


def retriable(settings: Settings) -> list[Row]:
    messages = settings.size(30_000, 200_000)
    order_key, actions = ORDER_KEYS["KEY"]
    config = {"actions": actions, "order_key": order_key}
    plain: list[Drained] = []
    with_ids: list[Drained] = []
    with RedisServer() as redis_server:
        log(f"P1r: producing {messages:,} messages over {KEYS} keys, {QUEUES} queues")
        produce_backlog(redis_server.url, messages, keys=KEYS)
        baselines = drain_baseline(redis_server, [f"raw-P1r-a{i}" for i in range(BASELINE_RUNS)], messages)
        for i in range(PAIRS):
            kinds = (False, True) if i % 2 == 0 else (True, False)
            log(f"P1r: pair {i + 1}/{PAIRS}: a drain {'with' if kinds[0] else 'without'} request ids, then "
                f"one {'with' if kinds[1] else 'without'}")
            for ids in kinds:
                drained = drain_via_proxy(redis_server, f"cg-P1r-{'ids' if ids else 'plain'}-{i}", messages, config,
                                          request_ids=ids)
                (with_ids if ids else plain).append(drained)
        baselines += drain_baseline(redis_server, [f"raw-P1r-b{i}" for i in range(BASELINE_RUNS)], messages)
    baseline = statistics.median(messages / b.result["elapsed_s"] for b in baselines)
    plain_rates = [_committed_rate(messages, d) for d in plain]
    id_rates = [_committed_rate(messages, d) for d in with_ids]
    plain_rate, id_rate = statistics.median(plain_rates), statistics.median(id_rates)
    cpu = {
        "without_ids": round(statistics.median(d.proxy_cpu_s for d in plain) / messages * 1e6, 2),
        "with_ids": round(statistics.median(d.proxy_cpu_s for d in with_ids) / messages * 1e6, 2),
    }
    return [
        Row(
            "P1r", "throughput, order key KEY, every pull with a request id, vs the same without",
            f"{id_rate:,.0f}/s", f"{plain_rate:,.0f}/s without ids", id_rate / plain_rate, Target(">=", SHARE),
            {"messages": messages, "keys": KEYS, "queues": QUEUES, "pairs": PAIRS, "order_key": order_key},
            {
                "with_ids_msgs_per_s": [round(r) for r in id_rates],
                "without_ids_msgs_per_s": [round(r) for r in plain_rates],
                "baseline_msgs_per_s": round(baseline),
                "ratio_with_ids": round(id_rate / baseline, 3),
                "ratio_without_ids": round(plain_rate / baseline, 3),
                "proxy_cpu_us_per_msg": cpu,
                "duplicates": [d.result["duplicates"] for d in with_ids],
            },
        )
    ]
