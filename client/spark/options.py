"""The options of ``format("ddmq")``, read once into a frozen value (keys are case-insensitive).

Spark hands a data source its options as a case-insensitive mapping; ``dict(options)`` would lower-case
every key, so the options are read from that mapping directly, by their documented names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from ddmq.client.consumer import parse_servers

__all__ = ["MODES", "SourceOptions", "parse_options"]

MODES: Final = ("pull", "queue")
#: Ordered runs per key and pull in pull mode: a key's backlog moves in one micro-batch, not one
#: message per micro-batch (a pull is still capped by the topic's ``max_pull_batch_size``).
DEFAULT_MAX_PER_KEY: Final = 1000
#: Long enough for a slow micro-batch plus the trigger interval plus the ack that follows it.
DEFAULT_LEASE_TIMEOUT_MS: Final = 300_000


@dataclass(frozen=True)
class SourceOptions:
    servers: tuple[tuple[str, int], ...]
    group: str
    topic: str | None
    mode: str
    consumer_id: str
    num_partitions: int
    max_batch_size: int
    pulls_per_partition: int
    linger_ms: int
    lease_timeout_ms: int
    max_per_key: int
    max_messages_per_trigger: int | None
    max_messages: int | None
    timeout_s: float
    #: Testing hook (option ``testAckGate``): a directory; when it holds ``hold-N``, the pull-mode
    #: driver, before acking the leases up to offset ``seq`` N, creates ``ack-N.wait`` there and waits
    #: (up to two minutes) until ``ack-N.go`` exists.
    ack_gate: str | None = None
    #: Kafka's ``failOnDataLoss``: when offsets of a range are gone from Redis (trimmed by a retention
    #: cap or a producer's maxlen before the query read them), fail the query naming them (True), or
    #: log them and go on (False).
    fail_on_data_loss: bool = True

    def server(self, index: int) -> tuple[str, int]:
        """The server partition ``index`` talks to (partitions are spread round-robin)."""
        return self.servers[index % len(self.servers)]

    def rows_per_partition(self, max_rows: int | None, partitions: int) -> int:
        """At most this many rows per partition so the batch stays within ``max_rows``."""
        largest = self.max_batch_size * self.pulls_per_partition
        if max_rows is None:
            return largest
        return max(1, min(largest, math.ceil(max_rows / max(partitions, 1))))


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name)
    if value is None:  # plain dicts (tests, direct use) are case-sensitive
        lowered = name.lower()
        value = next((v for k, v in options.items() if k.lower() == lowered), None)
    return None if value is None else str(value)


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"ddmq option {name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ValueError(f"ddmq option {name}={value} must be at least {minimum}")
    return value


def parse_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate ``options``; a bad or missing one raises ValueError naming it."""
    servers_text = _get(options, "servers")
    if not servers_text:
        raise ValueError('ddmq option "servers" is required, e.g. .option("servers", "h1:9713,h2:9713")')
    servers = tuple(parse_servers(servers_text))
    group = _get(options, "group")
    if not group:
        raise ValueError('ddmq option "group" is required (the consumer group)')
    mode = (_get(options, "mode") or "pull").lower()
    if mode not in MODES:
        raise ValueError(f"ddmq option mode={mode!r}: expected one of {', '.join(MODES)}")
    topic = _get(options, "topic") or None
    num_partitions = _int(options, "numPartitions", 2 * len(servers), 1)
    max_batch_size = _int(options, "maxBatchSize", 256, 1)
    pulls = _int(options, "pullsPerPartition", 8, 1)
    linger_ms = _int(options, "lingerMs", 500, 0)
    lease_timeout_ms = _int(options, "leaseTimeoutMs", DEFAULT_LEASE_TIMEOUT_MS, 1000)
    max_per_key = _int(options, "maxPerKey", DEFAULT_MAX_PER_KEY, 1)
    timeout_raw = _get(options, "timeoutSec")
    try:
        timeout_s = float(timeout_raw) if timeout_raw else 30.0
    except ValueError:
        raise ValueError(f"ddmq option timeoutSec={timeout_raw!r} is not a number") from None
    assert num_partitions is not None and max_batch_size is not None and pulls is not None
    assert linger_ms is not None and lease_timeout_ms is not None and max_per_key is not None
    return SourceOptions(
        servers=servers,
        group=group,
        topic=topic,
        mode=mode,
        consumer_id=_get(options, "consumerId") or f"spark-{group}-{topic or 'all'}",
        num_partitions=num_partitions,
        max_batch_size=max_batch_size,
        pulls_per_partition=pulls,
        linger_ms=linger_ms,
        lease_timeout_ms=lease_timeout_ms,
        max_per_key=max_per_key,
        max_messages_per_trigger=_int(options, "maxMessagesPerTrigger", None, 1),
        max_messages=_int(options, "maxMessages", None, 1),
        timeout_s=timeout_s,
        ack_gate=_get(options, "testAckGate") or None,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
    )


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _get(options, name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    raise ValueError(f"ddmq option {name}={raw!r}: expected true or false")
