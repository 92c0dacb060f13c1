"""Producing test data, collecting what a streaming query's sink saw, and reading the proxy's positions."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ddmq.client.thrift_client import ProxyClient
from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.wire import ConsumeStatsRequest

from ..support import OrderChecker, ProxyProcess, body


def produce(redis_url: str, keys: int, per_key: int, topic: str = "t", seed: int = 11) -> dict[str, int]:
    """``keys * per_key`` messages, each key's ``seq`` 0, 1, ... in order, keys randomly interleaved."""
    rng = random.Random(seed)
    remaining = {f"k{i}": 0 for i in range(keys)}
    items = []
    while remaining:
        for key in rng.sample(list(remaining), min(500, len(remaining))):
            items.append({"key": key, "value": body(key, remaining[key])})
            remaining[key] += 1
            if remaining[key] == per_key:
                del remaining[key]
    with Producer(redis_url) as producer:
        for start in range(0, len(items), 5000):
            producer.send_batch(topic, items[start : start + 5000])
    return {f"k{i}": per_key for i in range(keys)}


@dataclass
class Collector:
    """A ``foreachBatch`` sink that keeps (batch id, rows) in the driver; ``fail_batches`` raise once."""

    fail_batches: set[int] = field(default_factory=set)
    batches: list[tuple[int, list[tuple[str, int, int, int]]]] = field(default_factory=list)
    failed: dict[int, list[tuple[str, int, int, int]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [
            (event["k"], event["seq"], row.qid, row.offset)
            for row in df.select("value", "qid", "offset").collect()
            for event in [json.loads(bytes(row.value))]
        ]
        with self.lock:
            if batch_id in self.fail_batches:
                self.fail_batches.discard(batch_id)
                self.failed[batch_id] = rows
                raise RuntimeError(f"sink fails batch {batch_id} once (test)")
            self.batches.append((batch_id, rows))

    @property
    def count(self) -> int:
        with self.lock:
            return sum(len(rows) for _, rows in self.batches)

    def check(self) -> OrderChecker:
        """Replays the sink's rows in batch order through the per-key order/no-loss checker. A batch's
        rows of one key are an ordered run (successive messages, in order), so each row counts as
        processed before the next: a gap or a step back within a batch is a violation."""
        checker = OrderChecker()
        with self.lock:
            for _, rows in sorted(self.batches, key=lambda item: item[0]):
                for key, seq, _, _ in rows:
                    checker.delivered(key, seq)
                    checker.acked(key, seq)
        return checker


def positions(proxy: ProxyProcess, group: str = "g") -> dict[tuple[str, str], tuple[int, int]]:
    with ProxyClient("127.0.0.1", proxy.port) as client:
        stats = client.get_consume_stats(ConsumeStatsRequest(group=group))
    return {
        (row.topic or "", qid): (consume, (row.produceOffsets or {}).get(qid, 0))
        for row in stats
        for qid, consume in (row.consumeOffsets or {}).items()
    }


def owners(proxy: ProxyProcess, group: str = "g") -> dict[str, str]:
    """qid -> instance id of the proxy holding its lease, as ``proxy`` reports it."""
    with ProxyClient("127.0.0.1", proxy.port) as client:
        stats = client.get_consume_stats(ConsumeStatsRequest(group=group))
    return {qid: owner for row in stats for qid, owner in (row.owners or {}).items()}


def drained(proxy: ProxyProcess, group: str = "g") -> bool:
    """Every produced message of the group finished (acked): consume offset = produce offset everywhere."""
    return all(consume == produce for consume, produce in positions(proxy, group).values())


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)
