"""How a producer rides out Redis failures: which errors it retries, how long it waits, and the one error
it raises when it gives up.

A produce call is retried as a whole on every error here called retriable (a lost connection, a socket
timeout, a Cluster redirection or failover, a loading or read-only server, a full Redis, a refusal of
the idempotent script because an earlier call must go first) with exponential backoff and jitter,
until the call's ``delivery_timeout_ms`` has passed since it began. Retrying never writes twice: the
produce script recognises a call it already applied (see ``IDEMPOTENT_PRODUCE_LUA``). Any other error
(a key of the wrong type, a bad argument) is final at once.

:class:`DeliveryError` says, per input message, whether it was written (queue and offset), was not
written, or may have been (its call ran or not, the reply never came): those are safe to send again
with a ``dedup_id``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import redis.exceptions
from redis.exceptions import RedisClusterException

from ddmq.protocol.errors import DdmqError
from ddmq.protocol.redis.queues import ProduceError
from ddmq.protocol.redis.scripts import OUT_OF_ORDER

__all__ = [
    "DEFAULT_DELIVERY_TIMEOUT_MS",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "DeliveryError",
    "MessageTooLargeError",
    "RedisFullError",
    "RetryPolicy",
    "WrittenMessage",
    "is_retriable",
]

#: As Kafka's ``delivery.timeout.ms``: how long one send may keep retrying.
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
#: As Kafka's ``request.timeout.ms``: how long one round trip may take before it counts as failed.
DEFAULT_REQUEST_TIMEOUT_MS = 30_000

_RETRIABLE_TYPES: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.ClusterError,
    redis.exceptions.MasterDownError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.SlotNotCoveredError,
    RedisClusterException,
    ConnectionError,  # the OS's, when redis-py lets one through
    TimeoutError,
)

# A script that fails inside reports the inner error after "ERR Error running script", so the reason
# is looked for anywhere in the text.
_RETRIABLE_TEXT = (
    OUT_OF_ORDER, "command not allowed when used memory", "LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN",
    "TRYAGAIN", "MOVED", "ASK ", "BUSY",
)


def is_redis_full(exc: BaseException | None) -> bool:
    """Whether Redis refused a write because ``used_memory`` is past ``maxmemory`` (policy noeviction)."""
    return isinstance(exc, redis.exceptions.OutOfMemoryError) or (
        isinstance(exc, redis.exceptions.ResponseError) and "command not allowed when used memory" in str(exc)
    )


def is_retriable(exc: BaseException) -> bool:
    """Whether repeating the same call may succeed (and, the script being idempotent, is safe)."""
    if isinstance(exc, _RETRIABLE_TYPES):
        return True
    if isinstance(exc, redis.exceptions.ResponseError):
        text = str(exc)
        return any(reason in text for reason in _RETRIABLE_TEXT)
    return False


@dataclass
class RetryPolicy:
    """Backoff between attempts: ``backoff_ms`` doubling up to ``backoff_max_ms``, each wait drawn
    between half and all of that (jitter, so producers that failed together do not retry together),
    never past the deadline."""

    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    backoff_ms: int = 50
    backoff_max_ms: int = 1000
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        for name in ("delivery_timeout_ms", "backoff_ms", "backoff_max_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, not {value!r}")

    def deadline(self) -> float:
        return time.monotonic() + self.delivery_timeout_ms / 1000

    def wait_s(self, attempt: int, deadline: float) -> float:
        """Seconds to wait before retry number ``attempt`` (1 for the first), at most until the deadline."""
        ceiling: float = min(self.backoff_max_ms, self.backoff_ms * 2 ** min(attempt - 1, 30)) / 1000
        wait: float = ceiling * self.rng.uniform(0.5, 1.0)
        return max(0.0, min(wait, deadline - time.monotonic()))


class WrittenMessage(NamedTuple):
    """An input message (by its position in the batch) and where it is."""

    position: int
    qid: int
    offset: int


class MessageTooLargeError(DdmqError, ValueError):
    """A message is larger than the producer's ``max_message_bytes``; nothing of its batch was written.
    Not retriable (the same message is as large the next time); a ValueError, as the producer's other
    refusals of what it was given."""

    retriable = False


class DeliveryError(ProduceError):
    """A send gave up: the deadline passed while Redis kept failing, or Redis refused it for good.

    ``written``: messages that are in their queue (position, qid, offset); ``unwritten``: positions of
    messages that are not; ``unknown``: positions whose call was sent but whose answer never came (they
    may be in the queue). Positions index the batch as given to ``send_batch``. After this error the
    producer starts a new producer id, so its next sends do not wait for the unanswered calls.

    ``retriable``: whether sending again may succeed, i.e. whether the error it gave up on is one the
    producer retries (the deadline passed while Redis kept failing); not when Redis refused the send
    for good. What may have been written is safe to send again with a ``dedup_id``.
    """

    def __init__(
        self,
        topic: str,
        reason: str,
        written: Sequence[WrittenMessage],
        unwritten: Sequence[int],
        unknown: Sequence[int],
        retries: int,
        elapsed_s: float,
        retriable: bool | None = None,
    ) -> None:
        self.topic = topic
        self.reason = reason
        self.written = sorted(written)
        self.unwritten = sorted(unwritten)
        self.unknown = sorted(unknown)
        self.retries = retries
        self.elapsed_s = elapsed_s
        super().__init__(
            f"producing to topic {topic!r} failed after {elapsed_s:.1f}s and {retries} retr"
            f"{'y' if retries == 1 else 'ies'}: {reason}; written {len(self.written)} message(s)"
            f"{_ranges(self.written)}, not written {len(self.unwritten)}, unknown {len(self.unknown)}",
            retriable,
        )


def _ranges(written: Sequence[WrittenMessage]) -> str:
    """`` (queue 0 offsets 1-100, queue 3 offsets 7-9)``: the written offsets, per queue, as ranges."""
    by_queue: dict[int, list[int]] = {}
    for message in written:
        by_queue.setdefault(message.qid, []).append(message.offset)
    parts = []
    for qid in sorted(by_queue):
        offsets = sorted(set(by_queue[qid]))
        runs: list[str] = []
        start = prev = offsets[0]
        for offset in [*offsets[1:], -1]:
            if offset != prev + 1:
                runs.append(f"{start}" if start == prev else f"{start}-{prev}")
                start = offset
            prev = offset
        parts.append(f"queue {qid} offsets {','.join(runs)}")
    return f" ({'; '.join(parts)})" if parts else ""


class RedisFullError(DeliveryError):
    """A send gave up because Redis stayed full (``maxmemory`` reached, nothing evicted) until the
    deadline. Retriable: the proxy's trims and the consumers' progress free memory, and the same send
    succeeds once they have (docs/retention.md says how to size Redis)."""
