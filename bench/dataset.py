"""The data every scenario consumes: small JSON messages over many keys in one 8-queue topic.

A body is ``{"k": <key>, "seq": <n-th message of that key>, "ts": <produce time, time.time()>}``
plus, for P3, ``"w"``: the simulated work of that message in milliseconds. Keys are chosen at
random (seeded, so every run consumes the same data) from ``k0000`` .. ``k0999``; the message key and
``$.k`` are the same string, so the KEY, JSONPath and QID variants order exactly the same messages.
Producing goes through the project's own :class:`~ddmq.client.Producer` (its Lua script
gives the dense offsets the proxy needs).
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from ddmq.protocol.produce.producer import Producer
from ddmq.protocol.redis import keys as redis_keys

__all__ = ["QUEUES", "TOPIC", "Backlog", "body", "draw", "key_names", "produce_backlog", "streams"]

TOPIC = "bench"
QUEUES = 8
_BATCH = 2000
#: Every run consumes the same data.
DEFAULT_SEED = 20261122


def key_names(count: int) -> list[str]:
    return [f"k{i:04d}" for i in range(count)]


def streams(topic: str = TOPIC, queues: int = QUEUES) -> list[str]:
    """The Redis stream of each queue, by qid."""
    return [redis_keys.stream(topic, qid) for qid in range(queues)]


def body(key: str, seq: int, **extra: float) -> str:
    return json.dumps({"k": key, "seq": seq, "ts": time.time(), **extra}, separators=(",", ":"))


@dataclass
class Backlog:
    """What was produced: per-key counts, the total, and (P3) each message's work in milliseconds."""

    per_key: Counter[str] = field(default_factory=Counter)
    work_ms: list[float] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.per_key.values())


def _choices(rng: random.Random, names: list[str], count: int) -> Iterator[str]:
    step = 10_000
    for start in range(0, count, step):
        yield from rng.choices(names, k=min(step, count - start))


def draw(
    count: int,
    *,
    keys: int = 1000,
    extra_keys: tuple[str, ...] = (),
    work_ms: tuple[float, float] | None = None,
    seed: int = DEFAULT_SEED,
) -> Iterator[tuple[str, int, float | None]]:
    """The backlog's messages in produce order: (key, its n-th message of that key, work in ms or None).
    Keys over ``keys`` names (plus ``extra_keys``, each as frequent as one ordinary key); with
    ``work_ms=(lo, hi)`` each message's work is uniform random in that range."""
    rng = random.Random(seed)
    names = key_names(keys) + list(extra_keys)
    seqs: Counter[str] = Counter()
    for key in _choices(rng, names, count):
        seq = seqs[key]
        seqs[key] = seq + 1
        yield key, seq, None if work_ms is None else round(rng.uniform(*work_ms), 3)


def produce_backlog(
    redis_url: str,
    count: int,
    *,
    keys: int = 1000,
    extra_keys: tuple[str, ...] = (),
    work_ms: tuple[float, float] | None = None,
    seed: int = DEFAULT_SEED,
    pad: int = 0,
) -> Backlog:
    """Produce :func:`draw`'s messages: bodies as :func:`body`, with ``w`` when there is work and
    ``pad`` spaces after the JSON (bigger messages, the same content)."""
    backlog = Backlog()
    with Producer(redis_url) as producer:
        producer.ensure_topic(TOPIC, QUEUES)
        batch: list[dict[str, str]] = []
        for key, seq, work in draw(count, keys=keys, extra_keys=extra_keys, work_ms=work_ms, seed=seed):
            backlog.per_key[key] = seq + 1
            if work is None:
                value = body(key, seq)
            else:
                backlog.work_ms.append(work)
                value = body(key, seq, w=work)
            batch.append({"key": key, "value": value + " " * pad if pad else value})
            if len(batch) == _BATCH:
                producer.send_batch(TOPIC, batch)
                batch = []
        if batch:
            producer.send_batch(TOPIC, batch)
    return backlog
