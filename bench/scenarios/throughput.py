"""P1 throughput and P2 head-of-line isolation: draining a pre-produced backlog.

P1, for each order key (KEY, ``$.k``, QID): the baseline drains the backlog with XREADGROUP + XACK
(batch 64, its own consumer group), then a fresh proxy drains the same streams for its own group
through Thrift pull clients (batch 64, acks on the next pull). The proxy's clock stops when
``getConsumeStats`` shows its consume offsets at the produce offsets (everything acked and
committable); the time until the last message reached a client is recorded too. Each baseline runs
right before its proxy run, so each ratio pairs two measurements taken seconds apart.

P1 also measures the clients' own floor: the same client load draining a stand-in server
(:mod:`bench.replay`) that answers every pull at once with ready-made messages and keeps no state.
Its rate divided by the baseline (``client_floor_ratio``) is the most P1 could show with these clients
on this machine, whatever the proxy did.

P1q-runs and P1-runs: P1q's and P1's data and clients, the pulls asking for ordered runs
(``maxPerKey`` :data:`RUNS_PER_KEY`), each divided by its row's baselines. P1h / P1h-runs: a backlog
over :data:`HOT_KEYS` keys only (a few hot keys on 8 queues), drained without and with runs, divided
by raw drains of that backlog. (P1r, P1 with a request id on every pull: :mod:`bench.scenarios.retriable`.)

P2: the same backlog plus one key, ``poison``, as frequent as any other, whose messages the client
never acks (its head times out after ``timeout_ms`` and is redelivered, ``max_retry`` is high). The
figure is the other keys' msg/s with the poison key stuck divided by the msg/s of control runs on
the same data with the same config in which every key is acked (P1's setup): runs alternate control,
stuck, control, stuck, control, stuck, control, each with a fresh proxy and group, and the medians
are compared.
Both clocks stop when the last awaited message reaches a client.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from bench.clients import ProxyDrain, RawDrain, drain_proxy, drain_raw
from bench.dataset import QUEUES, TOPIC, produce_backlog, streams
from bench.profiler import Profiler, ProfileReport
from bench.replay import ReplaySpec, serve_pull_replies
from bench.report import Row, Target
from bench.scenarios.base import ORDER_KEYS, Settings, log, proxy_sections, run_load
from ddmq.protocol.redis.hashing import queue_for_key
from tests.harness.clientproc import ClientProcess
from tests.harness.stack import ClusterServer, ProxyRun, RedisServer, cpu_seconds, free_port

__all__ = [
    "BASELINE_RUNS", "KEYS", "Drained", "cluster_throughput", "drain_baseline", "drain_via_proxy", "hot_keys",
    "isolation", "isolation_parked", "throughput",
]

BATCH = 64
#: Baseline drains before and after each proxy run; the figure is the median of all of them.
BASELINE_RUNS = 3
CONNECTIONS = 8
KEYS = 1000
ROW_IDS = {"KEY": "P1", "JSONPath": "P1j", "QID": "P1q"}
#: ``maxPerKey`` of the runs rows, and the rows of P1 that get a twin with runs (and its target).
RUNS_PER_KEY = 64
#: The targets: P1 0.5 of raw Redis, P1j 0.45 (it parses every body), ordered runs with QID or
#: hot keys 0.45; P1-runs at least what P1 reached in the same run.
TARGETS: dict[str, float] = {"P1": 0.5, "P1j": 0.45, "P1q": 0.5}
RUNS_TARGETS: dict[str, float | None] = {"P1": None, "P1q": 0.45}  # None: at least the row without runs
HOT_KEYS = 16


@dataclass
class Drained:
    """One drain: the client load's result and the CPU the proxy and Redis spent meanwhile."""

    result: dict[str, Any]
    proxy_cpu_s: float
    redis_cpu_s: float
    profile: ProfileReport | None = None


def _load_timeout_s(messages: int) -> float:
    return 120 + messages / 200


def _redis_cpu_s(redis_server: RedisServer | ClusterServer) -> float:
    """CPU seconds of every redis-server process under test so far."""
    return sum(cpu_seconds(pid) for pid in redis_server.pids)


def drain_baseline(redis_server: RedisServer | ClusterServer, groups: list[str], messages: int) -> list[Drained]:
    """One raw drain per group (a fresh consumer group each), in one client process."""
    before = _redis_cpu_s(redis_server)
    spec = RawDrain(redis_server.url, tuple(groups), tuple(streams()), BATCH)
    result = run_load(drain_raw, spec, _load_timeout_s(messages) * len(groups))
    redis_cpu = (_redis_cpu_s(redis_server) - before) / len(groups)
    drains = []
    for run in result["runs"]:
        if run["messages"] != messages:
            log(f"warning: the baseline consumed {run['messages']} of {messages} messages")
        drains.append(Drained(run, 0.0, redis_cpu))
    return drains


def drain_via_proxy(
    redis_server: RedisServer | ClusterServer,
    group: str,
    expected: int,
    topic_config: dict[str, Any],
    *,
    poison_key: str | None = None,
    wait_commit: bool = True,
    profiler: Profiler | None = None,
    max_per_key: int | None = None,
    request_ids: bool = False,
) -> Drained:
    marks: dict[str, float] = {}
    with ProxyRun(redis_server.url, **proxy_sections(group, **topic_config), profiler=profiler) as proxy:

        def on_ready() -> None:
            marks["proxy"] = proxy.cpu_seconds()
            marks["redis"] = _redis_cpu_s(redis_server)

        spec = ProxyDrain(
            proxy.port, group, expected, CONNECTIONS, BATCH, poison_key=poison_key, wait_commit=wait_commit,
            max_per_key=max_per_key, request_ids=request_ids,
        )
        result = run_load(drain_proxy, spec, _load_timeout_s(expected), on_ready=on_ready)
        proxy_cpu = proxy.cpu_seconds() - marks["proxy"]
        redis_cpu = _redis_cpu_s(redis_server) - marks["redis"]
    return Drained(result, proxy_cpu, redis_cpu, proxy.profile)


def client_floor(messages: int) -> dict[str, float]:
    """P1's client load against :mod:`bench.replay` (no proxy work at all): rate and client CPU."""
    spec = ReplaySpec(free_port(), TOPIC, QUEUES, messages, KEYS, BATCH)
    with ClientProcess(serve_pull_replies, spec) as server:
        server.wait_ready(60)
        drain = ProxyDrain(spec.port, "cg-floor", messages, CONNECTIONS, BATCH, wait_commit=False)
        result = run_load(drain_proxy, drain, _load_timeout_s(messages))
    return {
        "msgs_per_s": messages / result["delivered_s"],
        "client_cpu_us_per_msg": result["client_cpu_s"] / messages * 1e6,
    }


def _rate(messages: int, seconds: float | None) -> float | None:
    return messages / seconds if seconds else None


def _fmt(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:,.0f} msg/s"


def _spread(rates: list[float]) -> float:
    """Half the range of repeated measurements, relative to their mean: the run's own noise."""
    return (max(rates) - min(rates)) / 2 / (sum(rates) / len(rates))


#: The rows ``--profile`` can name.
PROFILED_ROWS = ("P1", "P1j", "P1q", "P1-runs", "P1q-runs")


def _profiler(settings: Settings, row_id: str) -> Profiler | None:
    """A profiler for ``row_id``'s proxy when ``--profile`` named that row."""
    if settings.profile != row_id:
        return None
    profiler = Profiler(settings.results_dir, f"{row_id.lower()}-profile")
    log(f"{row_id}: profiling the proxy with {profiler.tool or '(no profiler installed)'}")
    return profiler


def throughput(settings: Settings) -> list[Row]:
    messages = settings.size(30_000, 200_000)
    rows = []
    with RedisServer() as redis_server:
        log(f"P1: producing {messages:,} messages over {KEYS} keys, {QUEUES} queues")
        produce_backlog(redis_server.url, messages, keys=KEYS)
        for variant, (order_key, actions) in ORDER_KEYS.items():
            row_id = ROW_IDS[variant]
            log(f"{row_id}: baseline XREADGROUP+XACK drains")
            before = drain_baseline(redis_server, [f"raw-{row_id}-a{i}" for i in range(BASELINE_RUNS)], messages)
            log(f"{row_id}: proxy drain, order_key {order_key}")
            proxy = drain_via_proxy(
                redis_server, f"cg-{row_id}", messages, {"actions": actions, "order_key": order_key},
                profiler=_profiler(settings, row_id),
            )
            runs = None
            if row_id in RUNS_TARGETS:
                log(f"{row_id}-runs: proxy drain, order_key {order_key}, maxPerKey {RUNS_PER_KEY}")
                runs = drain_via_proxy(
                    redis_server, f"cg-{row_id}-runs", messages, {"actions": actions, "order_key": order_key},
                    max_per_key=RUNS_PER_KEY, profiler=_profiler(settings, f"{row_id}-runs"),
                )
            log(f"{row_id}: baseline drains again")
            after = drain_baseline(redis_server, [f"raw-{row_id}-b{i}" for i in range(BASELINE_RUNS)], messages)
            floor = None
            if row_id == "P1":
                log("P1: the clients' floor, against a stand-in server with no proxy work")
                floor = client_floor(messages)
            row = _throughput_row(row_id, variant, order_key, actions, messages, before + after, proxy, floor)
            rows.append(row)
            if runs is not None:
                rows.append(_runs_row(row, order_key, actions, messages, before + after, runs))
    return rows


def _runs_row(
    plain: Row, order_key: str, actions: list[str], messages: int, baselines: list[Drained], runs: Drained
) -> Row:
    """``plain``'s twin with ordered runs, on the same data and baselines."""
    target = RUNS_TARGETS[plain.id]
    row = _throughput_row(
        f"{plain.id}-runs", "", order_key, actions, messages, baselines, runs,
        title=f"{plain.what}, ordered runs (maxPerKey {RUNS_PER_KEY})",
    )
    row.target = Target(">=", target if target is not None else round(plain.ratio or 0.0, 3))
    row.params["max_per_key"] = RUNS_PER_KEY
    row.data["ratio_without_runs"] = None if plain.ratio is None else round(plain.ratio, 3)
    return row


def hot_keys(settings: Settings) -> list[Row]:
    """P1h and P1h-runs: a backlog over a few hot keys, drained without and with ordered runs."""
    messages = settings.size(30_000, 200_000)
    order_key, actions = ORDER_KEYS["KEY"]
    config = {"actions": actions, "order_key": order_key}
    with RedisServer() as redis_server:
        log(f"P1h: producing {messages:,} messages over {HOT_KEYS} keys, {QUEUES} queues")
        backlog = produce_backlog(redis_server.url, messages, keys=HOT_KEYS)
        log("P1h: baseline XREADGROUP+XACK drains")
        before = drain_baseline(redis_server, [f"raw-P1h-a{i}" for i in range(BASELINE_RUNS)], messages)
        log("P1h: proxy drain, one message per key per reply")
        plain = drain_via_proxy(redis_server, "cg-P1h", messages, config)
        log(f"P1h-runs: proxy drain, maxPerKey {RUNS_PER_KEY}")
        runs = drain_via_proxy(redis_server, "cg-P1h-runs", messages, config, max_per_key=RUNS_PER_KEY)
        log("P1h: baseline drains again")
        after = drain_baseline(redis_server, [f"raw-P1h-b{i}" for i in range(BASELINE_RUNS)], messages)
    queues_used = len({queue_for_key(key, QUEUES) for key in backlog.per_key})
    rows = []
    for row_id, drained, target in (("P1h", plain, None), ("P1h-runs", runs, Target(">=", 0.45))):
        row = _throughput_row(
            row_id, "KEY", order_key, actions, messages, before + after, drained,
            title=f"throughput, {HOT_KEYS} hot keys, order key KEY"
            + ("" if drained is plain else f", ordered runs (maxPerKey {RUNS_PER_KEY})"),
        )
        row.target = target
        row.params["keys"] = HOT_KEYS
        row.params["queues_with_keys"] = queues_used
        if drained is runs:
            row.params["max_per_key"] = RUNS_PER_KEY
        rows.append(row)
    return rows


def cluster_throughput(settings: Settings) -> list[Row]:
    """P1c: P1 (order key KEY) on a 3-master Redis Cluster, against the raw consumer on the same cluster."""
    messages = settings.size(30_000, 200_000)
    order_key, actions = ORDER_KEYS["KEY"]
    with ClusterServer(masters=3) as cluster:
        log(f"P1c: producing {messages:,} messages over {KEYS} keys, {QUEUES} queues, on a 3-master cluster")
        produce_backlog(cluster.url, messages, keys=KEYS)
        log("P1c: baseline XREADGROUP+XACK drains")
        before = drain_baseline(cluster, [f"raw-P1c-a{i}" for i in range(BASELINE_RUNS)], messages)
        log(f"P1c: proxy drain, order_key {order_key}")
        proxy = drain_via_proxy(cluster, "cg-P1c", messages, {"actions": actions, "order_key": order_key})
        log("P1c: baseline drains again")
        after = drain_baseline(cluster, [f"raw-P1c-b{i}" for i in range(BASELINE_RUNS)], messages)
    row = _throughput_row("P1c", "KEY", order_key, actions, messages, before + after, proxy,
                          title="throughput on a 3-master Redis Cluster, order key KEY")
    row.params["redis"] = "cluster: 3 masters, no replicas"
    return [row]


def _throughput_row(
    row_id: str,
    variant: str,
    order_key: str,
    actions: list[str],
    messages: int,
    baselines: list[Drained],
    proxy: Drained,
    floor: dict[str, float] | None = None,
    title: str | None = None,
) -> Row:
    baseline_rates = [messages / b.result["elapsed_s"] for b in baselines]
    baseline_rate = statistics.median(baseline_rates)
    committed_rate = _rate(messages, proxy.result["committed_s"])
    delivered_rate = _rate(messages, proxy.result["delivered_s"])
    assert committed_rate is not None and delivered_rate is not None
    data: dict[str, Any] = {
        "proxy_msgs_per_s": round(committed_rate),
        "baseline_msgs_per_s": round(baseline_rate),
        "baseline_runs_msgs_per_s": [round(r) for r in baseline_rates],
        "baseline_spread": round(_spread(baseline_rates), 3),
        "proxy_delivered_msgs_per_s": round(delivered_rate),
        "ratio_delivered": round(delivered_rate / baseline_rate, 3),
        "proxy_committed_s": round(proxy.result["committed_s"], 3),
        "proxy_delivered_s": round(proxy.result["delivered_s"], 3),
        "duplicates": proxy.result["duplicates"],
        # Deliveries per reply that carried any: the batch size the proxy could fill.
        "messages_per_pull": round(
            (proxy.result["unique"] + proxy.result["duplicates"]) / max(1, proxy.result["replies_with_messages"]), 1
        ),
        "cpu_s": {
            "proxy_run": {"proxy": round(proxy.proxy_cpu_s, 2), "redis": round(proxy.redis_cpu_s, 2),
                          "clients": round(proxy.result["client_cpu_s"], 2)},
            "baseline_run": {"redis": round(statistics.median(b.redis_cpu_s for b in baselines), 2),
                             "clients": round(statistics.median(b.result["client_cpu_s"] for b in baselines), 2)},
        },
    }
    data["cpu_us_per_msg"] = {
        "proxy": round(proxy.proxy_cpu_s / messages * 1e6, 2),
        "clients": round(proxy.result["client_cpu_s"] / messages * 1e6, 2),
    }
    if floor is not None:
        data["client_floor_msgs_per_s"] = round(floor["msgs_per_s"])
        data["client_floor_ratio"] = round(floor["msgs_per_s"] / baseline_rate, 3)
        data["client_floor_cpu_us_per_msg"] = round(floor["client_cpu_us_per_msg"], 2)
    if proxy.profile is not None:
        data["profile"] = proxy.profile.as_json()
    params = {
        "messages": messages, "keys": KEYS, "queues": QUEUES, "batch": BATCH, "connections": CONNECTIONS,
        "order_key": order_key, "actions": "+".join(actions),
    }
    if proxy.profile is not None:
        params["profiled"] = proxy.profile.tool
    return Row(
        row_id, title or f"throughput, order key {variant}", _fmt(committed_rate),
        f"{_fmt(baseline_rate)} ±{_spread(baseline_rates):.0%}"
        + ("" if floor is None else f" (clients alone: {floor['msgs_per_s'] / baseline_rate:.2f})"),
        committed_rate / baseline_rate, Target(">=", TARGETS.get(row_id, 0.5)), params, data,
    )


POISON_KEY = "poison"
STUCK_RUNS = 3


def isolation(settings: Settings) -> list[Row]:
    """P2: the poison key stuck (redelivered forever, its later messages waiting)."""
    return _isolation(settings, "P2", "stuck", {"max_retry": 1_000_000})


def isolation_parked(settings: Settings) -> list[Row]:
    """P2p: the poison key parked after its retries (on_exhausted: park): no more redeliveries at all."""
    return _isolation(settings, "P2p", "parked", {"max_retry": 1, "on_exhausted": "park"})


def _isolation(settings: Settings, row_id: str, held: str, variant: dict[str, Any]) -> list[Row]:
    messages = settings.size(30_000, 200_000)
    config = {
        "actions": ["Order", "PullServer"], "order_key": "KEY",
        "timeout_ms": 1000, "retry_intervals_ms": [100], **variant,
    }
    control_config = {**config, "max_retry": 1_000_000, "on_exhausted": "dead_letter"}
    with RedisServer() as redis_server:
        log(f"{row_id}: producing {messages:,} messages over {KEYS} keys + {POISON_KEY!r}")
        backlog = produce_backlog(redis_server.url, messages, keys=KEYS, extra_keys=(POISON_KEY,))
        others = backlog.total - backlog.per_key[POISON_KEY]
        control_rates: list[float] = []
        stuck_rates: list[float] = []
        stuck: Drained | None = None
        # control, stuck, control, ... control: the medians shrug off a run hit by a neighbour
        for index in range(2 * STUCK_RUNS + 1):
            if index % 2 == 0:
                log(f"{row_id}: control drain {index // 2 + 1}, every key acked")
                control = drain_via_proxy(
                    redis_server, f"cg-control-{index}", backlog.total, control_config, wait_commit=False
                )
                control_rates.append(backlog.total / control.result["delivered_s"])
            else:
                log(f"{row_id}: drain {index // 2 + 1} with {POISON_KEY!r} never acked ({held})")
                stuck = drain_via_proxy(
                    redis_server, f"cg-{held}-{index}", others, config, poison_key=POISON_KEY, wait_commit=False
                )
                stuck_rates.append(others / stuck.result["delivered_s"])
    assert stuck is not None
    control_rate = statistics.median(control_rates)
    stuck_rate = statistics.median(stuck_rates)
    data = {
        "proxy_msgs_per_s": round(stuck_rate),
        "control_msgs_per_s": round(control_rate),
        f"{held}_runs_msgs_per_s": [round(r) for r in stuck_rates],
        "control_runs_msgs_per_s": [round(r) for r in control_rates],
        "control_spread": round(_spread(control_rates), 3),
        "poison_messages": backlog.per_key[POISON_KEY],
        "poison_deliveries_last_run": stuck.result["poison_deliveries"],
        "other_duplicates_last_run": stuck.result["duplicates"],
        "clock": "until the last message of the other keys reached a client (the poison key never commits)",
    }
    params = {
        "messages": backlog.total, "keys": f"{KEYS}+1", "batch": BATCH, "connections": CONNECTIONS,
        "timeout_ms": 1000, **variant,
    }
    return [Row(
        row_id, f"other keys' msg/s with one key {held}, / control", _fmt(stuck_rate),
        f"{_fmt(control_rate)} ±{_spread(control_rates):.0%} (control)",
        stuck_rate / control_rate, Target(">=", 0.95), params, data,
    )]
