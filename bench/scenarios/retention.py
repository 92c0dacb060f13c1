"""R1 retention: Redis memory and proxy RSS under a sustained produce + consume.

The harness produces N messages (full 1M, quick 200k) at a steady rate (full 8k msg/s, quick 10k)
while 8 pull connections in the client process consume them through a proxy with the default
retention (``consumed``: each queue trimmed up to the group's committed offset, every second). Every
0.5 s it samples Redis ``used_memory``, the entries left in the topic's streams and the proxy's
``VmRSS``. Without retention, Redis would end holding every message (about 1M x 150 bytes here);
with it, memory must stay flat after warm-up.

Figures: used memory (MB) at the start of the steady part (after 10% of the run), at its middle and at
its end, and the least-squares growth over the steady part; the same for the proxy's RSS; the most
entries the streams held at once. "Flat" = fitted growth over the steady part ≤ 5% of the maximum (or
2 MB), for both.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from bench.clients import ProxyDrain, drain_proxy
from bench.dataset import QUEUES, TOPIC, body, key_names
from bench.report import Row, Target
from bench.scenarios.base import Settings, log, proxy_sections, run_load
from bench.scenarios.memory import trend
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys
from tests.harness.stack import ProxyRun, RedisServer, rss_mb

__all__ = ["retention_memory"]

INTERVAL_S = 0.5
WARMUP_FRACTION = 0.1
FLAT_FRACTION = 0.05
FLAT_MIN_MB = 2.0
_BATCH = 500


def _produce_steadily(url: str, count: int, rate: float, done: threading.Event, errors: list[str]) -> None:
    names = key_names(1000)
    seqs = dict.fromkeys(names, 0)
    try:
        with Producer(url) as producer:
            started = time.monotonic()
            for first in range(0, count, _BATCH):
                batch = []
                for i in range(first, min(first + _BATCH, count)):
                    key = names[i % len(names)]
                    batch.append({"key": key, "value": body(key, seqs[key])})
                    seqs[key] += 1
                producer.send_batch(TOPIC, batch)
                ahead = started + (first + len(batch)) / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
    except Exception as exc:  # reported in the row; the drain then times out
        errors.append(repr(exc))
    finally:
        done.set()


class _Sampler:
    def __init__(self, url: str, proxy_pid: int) -> None:
        self.client = redis.Redis.from_url(url)
        self.pid = proxy_pid
        self.samples: list[tuple[float, float, float, int]] = []  # (time, redis MB, proxy MB, entries)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retention-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            used = int(self.client.info("memory")["used_memory"]) / 1_048_576
            pipe = self.client.pipeline(transaction=False)
            for qid in range(QUEUES):
                pipe.xlen(keys.stream(TOPIC, qid))
            entries = sum(int(n) for n in pipe.execute())
            self.samples.append((time.time(), used, rss_mb(self.pid), entries))
            self._stop.wait(INTERVAL_S)

    def start(self) -> _Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[tuple[float, float, float, int]]:
        self._stop.set()
        self._thread.join()
        self.client.close()
        return self.samples


def _wait_committed(url: str, group: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with redis.Redis.from_url(url) as client:
        while time.monotonic() < deadline:
            pipe = client.pipeline(transaction=False)
            for qid in range(QUEUES):
                pipe.get(keys.committed(group, TOPIC, qid))
                pipe.get(keys.sequence(TOPIC, qid))
            replies = pipe.execute()
            if all(int(c or 0) == int(s or 0) + 1 for c, s in zip(replies[::2], replies[1::2], strict=True)):
                return
            time.sleep(0.1)
    log("R1: offsets not all committed in time")


def _at(samples: list[tuple[float, float]], fraction: float) -> float:
    return round(samples[min(len(samples) - 1, int(fraction * (len(samples) - 1)))][1], 1)


def retention_memory(settings: Settings) -> list[Row]:
    count = settings.size(200_000, 1_000_000)
    rate = settings.size(10_000, 8_000)
    group = "cg-retention"
    errors: list[str] = []
    produced = threading.Event()
    with RedisServer() as redis_server:
        with ProxyRun(redis_server.url, **proxy_sections(group, retention=None, order_key="KEY",
                                                          actions=["Order", "PullServer"])) as proxy:
            with Producer(redis_server.url) as producer:
                producer.ensure_topic(TOPIC, QUEUES)
            sampler = _Sampler(redis_server.url, proxy.pid).start()
            producer_thread = threading.Thread(
                target=_produce_steadily, args=(redis_server.url, count, rate, produced, errors), daemon=True)
            log(f"R1: producing {count:,} messages at {rate:,} msg/s while 8 connections consume")
            # Commits are awaited here, from Redis: the drain's stats connection would sit idle past the
            # proxy's idle timeout during a long run.
            spec = ProxyDrain(proxy.port, group, count, timeout_s=count / rate + 300, wait_commit=False)
            result = run_load(drain_proxy, spec, count / rate + 400, on_ready=producer_thread.start)
            producer_thread.join()
            _wait_committed(redis_server.url, group, 120)
            time.sleep(3)  # the last trims (one retention round) after the last commit
            samples = sampler.stop()
    began = samples[0][0]
    steady = [s for s in samples if s[0] >= began + WARMUP_FRACTION * (samples[-1][0] - began)]
    redis_mb = [(t, r) for t, r, _, _ in steady]
    proxy_mb = [(t, p) for t, _, p, _ in steady]
    span_s = steady[-1][0] - steady[0][0] if len(steady) > 1 else 0.0
    redis_growth = trend(redis_mb) * span_s / 60
    proxy_growth = trend(proxy_mb) * span_s / 60
    redis_max = max(r for _, r in redis_mb)
    proxy_max = max(p for _, p in proxy_mb)
    redis_flat = redis_growth <= max(FLAT_MIN_MB, FLAT_FRACTION * redis_max)
    proxy_flat = proxy_growth <= max(FLAT_MIN_MB, FLAT_FRACTION * proxy_max)
    data: dict[str, Any] = {
        "redis_used_mb": {"start": _at(redis_mb, 0), "middle": _at(redis_mb, 0.5), "end": _at(redis_mb, 1)},
        "redis_fitted_growth_mb": round(redis_growth, 2),
        "proxy_rss_mb": {"start": _at(proxy_mb, 0), "middle": _at(proxy_mb, 0.5), "end": _at(proxy_mb, 1)},
        "proxy_fitted_growth_mb": round(proxy_growth, 2),
        "max_entries_in_streams": max(e for _, _, _, e in samples),
        "entries_at_end": samples[-1][3],
        "redis_flat": redis_flat,
        "proxy_flat": proxy_flat,
        "delivered_s": result.get("delivered_s"),
        "producer_errors": errors,
        "samples": [[round(t - began, 1), round(r, 1), round(p, 1), e] for t, r, p, e in samples],
    }
    params = {"messages": count, "rate_msg_s": rate, "queues": QUEUES, "retention": "default (consumed, 1 s)"}
    figure = (f"redis {data['redis_used_mb']['start']}/{data['redis_used_mb']['middle']}/"
              f"{data['redis_used_mb']['end']} MB, proxy {data['proxy_rss_mb']['start']}/"
              f"{data['proxy_rss_mb']['middle']}/{data['proxy_rss_mb']['end']} MB")
    verdict = "PASS" if redis_flat and proxy_flat and not errors else "MISS"
    return [Row("R1", "Redis memory and proxy RSS, sustained produce + consume (start/middle/end)", figure, "-",
                None, Target("<=", FLAT_FRACTION, " growth, flat"), params, data, verdict=verdict)]
