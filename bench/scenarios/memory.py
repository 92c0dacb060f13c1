"""P5 memory: the proxy's RSS with a backlog far larger than its window.

1M messages (quick: 600k) are produced before the proxy starts; the group uses the default
``concurrency`` (1000 unfinished messages). The proxy's ``VmRSS`` is sampled every 0.2 s from the
moment it listens: first no client at all, then one slow client (16 messages every 100 ms), then 8
connections draining at full speed until the time is up or the backlog is gone.

Two figures: the maximum RSS, and its trend while the backlog is being drained: a least-squares
slope (MB per minute) over the fast phase minus its first 2 s (going from idle to busy grows the
working set once: connections, buffers, a full window of jobs in flight; that step is not a trend).
"Flat" means the fitted growth over that stretch is at most 5% of the maximum (or 2 MB): memory
bounded by the configuration (the window), not by the backlog or the messages consumed. The growth
per 100k messages consumed is reported too, and the slope over the whole run for information.
Target: at most 250 MB and flat.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.clients import SlowDrain, slow_drain
from bench.dataset import QUEUES, produce_backlog
from bench.report import Row, Target
from bench.scenarios.base import Settings, log, proxy_sections, run_load
from tests.harness.stack import ProxyRun, RedisServer, rss_mb

__all__ = ["RssSampler", "memory", "trend"]

INTERVAL_S = 0.2
SETTLE_S = 2.0
MAX_RSS_MB = 250
FLAT_FRACTION = 0.05
FLAT_MIN_MB = 2.0


class RssSampler:
    """A thread reading ``VmRSS`` of one pid every ``interval_s`` until stopped."""

    def __init__(self, pid: int, interval_s: float = INTERVAL_S) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (time.time(), MiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rss-{pid}", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.time(), rss_mb(self.pid)))
            except OSError:
                return  # the process is gone
            self._stop.wait(self.interval_s)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, float]]:
        self._stop.set()
        self._thread.join()
        return self.samples


def trend(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of RSS over time, in MB per minute."""
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    cov = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return 60 * cov / var if var else 0.0


def _phase_max(samples: list[tuple[float, float]], began: float, ended: float) -> float | None:
    inside = [v for t, v in samples if began <= t <= ended]
    return round(max(inside), 1) if inside else None


def memory(settings: Settings) -> list[Row]:
    backlog = settings.size(600_000, 1_000_000)
    idle_s = settings.seconds(4, 10)
    slow_s = settings.seconds(6, 15)
    fast_s = settings.seconds(12, 45)
    group = "cg-memory"
    with RedisServer() as redis_server:
        log(f"P5: producing a backlog of {backlog:,} messages")
        produce_backlog(redis_server.url, backlog)
        config = {"actions": ["Order", "PullServer"], "order_key": "KEY"}
        with ProxyRun(redis_server.url, **proxy_sections(group, **config)) as proxy:
            sampler = RssSampler(proxy.pid).start()
            started = time.time()
            log(f"P5: no client for {idle_s:g}s, then a slow one for {slow_s:g}s, then 8 fast for <= {fast_s:g}s")
            time.sleep(idle_s)
            spec = SlowDrain(proxy.port, group, backlog, slow_s=slow_s, fast_s=fast_s)
            result = run_load(slow_drain, spec, slow_s + fast_s + 120)
            samples = sampler.stop()
    phases: dict[str, Any] = {"idle": {"began": started, "ended": started + idle_s, "messages": 0}}
    phases.update(result["phases"])
    peak = max(v for _, v in samples)
    fast = phases["fast"]
    busy = [(t, v) for t, v in samples if fast["began"] + SETTLE_S <= t <= fast["ended"]]
    busy_span_s = busy[-1][0] - busy[0][0] if len(busy) > 1 else 0.0
    busy_slope = trend(busy)
    busy_growth = busy_slope * busy_span_s / 60
    fast_s_taken = max(fast["ended"] - fast["began"], 1e-9)
    busy_messages = fast["messages"] * busy_span_s / fast_s_taken
    flat = len(busy) >= 3 and busy_growth <= max(FLAT_MIN_MB, FLAT_FRACTION * peak)
    data = {
        "rss_mb": round(peak, 1),
        "slope_mb_per_min": round(busy_slope, 2),
        "fitted_growth_mb": round(busy_growth, 1),
        "growth_mb_per_100k_messages": round(100_000 * busy_growth / busy_messages, 2) if busy_messages else None,
        "flat": flat,
        "judged_over": f"fast phase after {SETTLE_S:g}s: {len(busy)} samples, {busy_span_s:.1f}s",
        "whole_run_slope_mb_per_min": round(trend([(t, v) for t, v in samples if t >= started + SETTLE_S]), 2),
        "rss_first_mb": round(samples[0][1], 1),
        "rss_last_mb": round(samples[-1][1], 1),
        "max_by_phase_mb": {name: _phase_max(samples, p["began"], p["ended"]) for name, p in phases.items()},
        "consumed_by_phase": {name: p["messages"] for name, p in phases.items()},
        "samples": [[round(t - started, 2), round(v, 1)] for t, v in samples],
    }
    params = {
        "backlog": backlog, "queues": QUEUES, "concurrency": "default (1000)",
        "phases_s": f"idle {idle_s:g}, slow {slow_s:g}, fast <= {fast_s:g}",
    }
    verdict = "PASS" if peak <= MAX_RSS_MB and flat else "MISS"
    return [Row(
        "P5", "proxy RSS: max, trend while draining", f"{peak:.1f} MB, {busy_slope:+.1f} MB/min", "-", None,
        Target("<=", MAX_RSS_MB, " MB, flat"), params, data, verdict=verdict,
    )]
