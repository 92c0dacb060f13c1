"""The calls of a producer: the messages it is given, how they become one idempotent script call per
queue under a sequence number (:class:`Planner`), and how a round of calls is sent and answered
(:class:`Send`). :mod:`ddmq.protocol.produce.producer` builds its sync and async producers on these; the
layout and the failure rules are described there.
"""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import redis.exceptions
from redis.exceptions import NoScriptError

from ddmq.protocol.produce.delivery import (
    DeliveryError,
    MessageTooLargeError,
    RedisFullError,
    RetryPolicy,
    WrittenMessage,
    is_redis_full,
    is_retriable,
)
from ddmq.protocol.redis import keys, stream_entry
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.queues import (
    ProduceError,
)
from ddmq.protocol.redis.scripts import CALLS_REMEMBERED, IDEMPOTENT_PRODUCE_LUA, OUT_OF_ORDER

logger = logging.getLogger(__name__)

#: Messages per script call; bigger batches for one queue become several calls in the same round trip,
#: so one call never blocks Redis for long.
MAX_MESSAGES_PER_CALL = 1000

#: How long a dedup id is remembered unless the producer says otherwise (SQS's window).
DEFAULT_DEDUP_WINDOW_S = 300

#: Longest dedup id, in bytes (it becomes part of a Redis key).
MAX_DEDUP_ID_BYTES = 256

# The producer state outlives the longest retry of a call by this much, so a retry that comes at the
# very end of its deadline still finds the answer (Redis and the producer measure time separately).
_STATE_MARGIN_MS = 60_000


class SendResult(NamedTuple):
    """Where a message is. For a message whose dedup id was already known, where the first one went."""

    topic: str
    qid: int
    offset: int


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message for :meth:`Producer.send_batch`; a dict with the same keys works too.

    An empty key counts as no key (the entry cannot tell them apart), so the queue is round-robin.
    ``dedup_id``: a message with an id the queue saw within the producer's dedup window is not written
    again (its result is where the first one went).
    """

    value: bytes | str
    key: str | None = None
    tag: str | None = None
    properties: Mapping[str, str] | None = None
    qid: int | None = None
    dedup_id: str | None = None


MESSAGE_FIELDS = frozenset({"value", "key", "tag", "properties", "qid", "dedup_id"})


def as_message(item: OutgoingMessage | Mapping[str, Any]) -> OutgoingMessage:
    if isinstance(item, OutgoingMessage):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - MESSAGE_FIELDS
        if unknown:
            raise ValueError(f"unknown message field(s) {sorted(unknown)}; known: {sorted(MESSAGE_FIELDS)}")
        if "value" not in item:
            raise ValueError("a message needs a 'value'")
        return OutgoingMessage(**item)
    raise TypeError(f"expected OutgoingMessage or a mapping, not {type(item).__name__}")


def _check_dedup_id(dedup_id: object) -> str:
    if not isinstance(dedup_id, str):
        raise TypeError(f"dedup_id must be a str or None, not {type(dedup_id).__name__}")
    if not dedup_id or len(dedup_id.encode("utf-8")) > MAX_DEDUP_ID_BYTES:
        raise ValueError(f"dedup_id must be 1 to {MAX_DEDUP_ID_BYTES} bytes, not {dedup_id!r:.80}")
    return dedup_id


@dataclass
class _Call:
    """One script call: messages (by input position) for one queue, under one sequence number."""

    qid: int
    seq: int
    positions: list[int]
    keys: list[str]
    args: list[bytes | int]

    #: where ``args`` holds the producer's highest answered sequence number, filled in per attempt
    ACKED = 3


@dataclass
class Sequences:
    """The producer's id and, per queue, the last sequence number it gave and the highest one up to
    which it holds every answer (the script applies a call right after that one even without state)."""

    producer_id: str = field(default_factory=lambda: secrets.token_hex(8))
    given: dict[tuple[str, int], int] = field(default_factory=dict)
    answered: dict[tuple[str, int], int] = field(default_factory=dict)
    early: dict[tuple[str, int], set[int]] = field(default_factory=dict)

    def take(self, topic: str, qid: int) -> int:
        seq = self.given.get((topic, qid), 0) + 1
        self.given[(topic, qid)] = seq
        return seq

    def answer(self, topic: str, qid: int, seq: int) -> None:
        queue = (topic, qid)
        done = self.early.setdefault(queue, set())
        done.add(seq)
        upto = self.answered.get(queue, 0)
        while upto + 1 in done:
            upto += 1
            done.discard(upto)
        self.answered[queue] = upto

    def renew(self) -> None:
        """A new producer id: calls left unanswered by a failed send are never waited for again."""
        self.producer_id = secrets.token_hex(8)
        self.given.clear()
        self.answered.clear()
        self.early.clear()


class Planner:
    """Queue choice and script arguments; shared by the sync and async producers (no I/O here)."""

    def __init__(
        self,
        default_queues: int,
        maxlen: int | None,
        *,
        delivery_timeout_ms: int,
        dedup_window_s: float,
        max_message_bytes: int | None,
    ) -> None:
        if default_queues < 1:
            raise ValueError("default_queues must be at least 1")
        if maxlen is not None and maxlen < 1:
            raise ValueError("maxlen must be at least 1 (or None for no trimming)")
        if not dedup_window_s > 0:
            raise ValueError(f"dedup_window_s must be positive, not {dedup_window_s!r}")
        if max_message_bytes is not None and (isinstance(max_message_bytes, bool) or max_message_bytes < 1):
            raise ValueError(f"max_message_bytes must be at least 1 (or None), not {max_message_bytes!r}")
        self.default_queues = default_queues
        self.maxlen = maxlen
        self.max_message_bytes = max_message_bytes
        self.state_ttl_ms = delivery_timeout_ms + _STATE_MARGIN_MS
        self.dedup_window_ms = max(1, int(dedup_window_s * 1000))
        self.queues: dict[str, int] = {}
        self.sequences = Sequences()
        self._next_rr: dict[str, int] = {}

    @staticmethod
    def check_qid(topic: str, qid: int | None, queues: int) -> None:
        if qid is not None and (isinstance(qid, bool) or not isinstance(qid, int) or not 0 <= qid < queues):
            raise ValueError(f"qid {qid!r} is out of range for topic {topic!r} with {queues} queues")

    def choose_qid(self, topic: str, message: OutgoingMessage, queues: int) -> int:
        if message.qid is not None:
            return message.qid
        if message.key:
            return queue_for_key(message.key, queues)
        if message.dedup_id is not None:
            return queue_for_key(message.dedup_id, queues)
        # a random start, so many short-lived producers do not all begin at queue 0
        rr = self._next_rr.get(topic)
        if rr is None:
            rr = random.randrange(queues)
        self._next_rr[topic] = (rr + 1) % queues
        return rr % queues

    def encode(
        self, message: OutgoingMessage, now_ms: int, what: str = "a message",
        memo: stream_entry.PropertiesMemo | None = None,
    ) -> list[bytes]:
        """The entry's items; TypeError/ValueError for a bad field, MessageTooLargeError past the limit."""
        items = stream_entry.encode_entry(message.value, message.key, message.tag, message.properties, now_ms, memo)
        if message.dedup_id is not None:
            _check_dedup_id(message.dedup_id)
        if self.max_message_bytes is not None:
            size = sum(len(item) for item in items)
            if size > self.max_message_bytes:
                raise MessageTooLargeError(
                    f"{what} of {size} bytes (value, key, tag, properties and field names) is over "
                    f"max_message_bytes {self.max_message_bytes}"
                )
        return items

    def _encode(self, messages: Sequence[OutgoingMessage], now_ms: int) -> list[list[bytes]]:
        memo: stream_entry.PropertiesMemo = {}
        if self.max_message_bytes is None and all(m.dedup_id is None for m in messages):
            encode = stream_entry.encode_entry  # the common case, without a check per message
            return [encode(m.value, m.key, m.tag, m.properties, now_ms, memo) for m in messages]
        entries = []
        for position, message in enumerate(messages):
            try:
                entries.append(self.encode(message, now_ms, f"message {position}", memo))
            except MessageTooLargeError as exc:
                raise MessageTooLargeError(f"{exc}; nothing of this batch was written") from None
        return entries

    def plan(self, topic: str, messages: Sequence[OutgoingMessage], queues: int) -> list[_Call]:
        now_ms = time.time_ns() // 1_000_000
        by_queue: dict[int, list[tuple[int, list[bytes]]]] = {}
        # validate everything before choosing queues, so a bad message does not advance round-robin
        entries = self._encode(messages, now_ms)
        for message in messages:
            self.check_qid(topic, message.qid, queues)
        for position, (message, items) in enumerate(zip(messages, entries, strict=True)):
            qid = self.choose_qid(topic, message, queues)
            by_queue.setdefault(qid, []).append((position, items))
        calls = []
        maxlen: bytes | int = b"" if self.maxlen is None else self.maxlen
        for qid, queued in by_queue.items():
            for start in range(0, len(queued), MAX_MESSAGES_PER_CALL):
                chunk = queued[start:start + MAX_MESSAGES_PER_CALL]
                seq = self.sequences.take(topic, qid)
                args: list[bytes | int] = [len(chunk), maxlen, seq, 0, self.state_ttl_ms, self.dedup_window_ms]
                call_keys = [
                    keys.stream(topic, qid), keys.sequence(topic, qid),
                    keys.producer_state(topic, qid, self.sequences.producer_id),
                ]
                ids = [messages[position].dedup_id for position, _ in chunk]
                if all(dedup_id is None for dedup_id in ids):
                    for _, items in chunk:
                        args.append(len(items))
                        args.extend(items)
                else:  # a flag per message says which take a dedup key
                    for (_, items), dedup_id in zip(chunk, ids, strict=True):
                        if dedup_id is not None:
                            call_keys.append(keys.dedup_id(topic, qid, dedup_id))
                        args.append(0 if dedup_id is None else 1)
                        args.append(len(items))
                        args.extend(items)
                calls.append(_Call(qid, seq, [p for p, _ in chunk], call_keys, args))
        return calls


def _offsets(reply: object, count: int) -> list[int] | None:
    """The offsets a script reply gives a call of ``count`` messages; None when it is not an answer."""
    if isinstance(reply, bool):
        return None
    if isinstance(reply, int):
        return list(range(reply, reply + count))
    if isinstance(reply, (bytes, str)):
        text = reply.decode() if isinstance(reply, bytes) else reply
        try:
            parts = [int(part) for part in text.split(",")]
        except ValueError:
            return None
        if len(parts) == 1:
            return list(range(parts[0], parts[0] + count))
        return parts if len(parts) == count else None
    return None


#: Errors after which a call may have run: its request left, its answer did not come.
_CUT_OFF = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError, TimeoutError)


class Send:
    """One ``send_batch`` in flight: which calls are answered, which go in the next round trip, and when
    to give up. No I/O here; the sync and async producers drive it."""

    def __init__(
        self, topic: str, calls: list[_Call], total: int, sequences: Sequences, policy: RetryPolicy
    ) -> None:
        self.topic, self.calls, self.total = topic, calls, total
        self.sequences, self.policy = sequences, policy
        self.pending = list(range(len(calls)))
        self.answers: dict[int, list[int]] = {}
        #: calls whose last round trip was lost: they may have run
        self.maybe: set[int] = set()
        self.started = time.monotonic()
        self.deadline = policy.deadline()
        self.retries = 0
        self.use_eval = False
        self.last_error: BaseException | None = None

    def round(self) -> list[int]:
        """The calls to send now, in sequence order: at most CALLS_REMEMBERED per queue, so every call
        that may have run is still answerable from the script's state."""
        per_queue: dict[int, int] = {}
        chosen = []
        for index in self.pending:
            call = self.calls[index]
            if per_queue.get(call.qid, 0) < CALLS_REMEMBERED:
                per_queue[call.qid] = per_queue.get(call.qid, 0) + 1
                call.args[_Call.ACKED] = self.sequences.answered.get((self.topic, call.qid), 0)
                chosen.append(index)
        return chosen

    def command(self, index: int, sha: str) -> tuple[Any, ...]:
        call = self.calls[index]
        script = IDEMPOTENT_PRODUCE_LUA if self.use_eval else sha
        return ("EVAL" if self.use_eval else "EVALSHA", script, len(call.keys), *call.keys, *call.args)

    def absorb(self, chosen: Sequence[int], replies: Sequence[object]) -> bool:
        """Take a round trip's replies; True when something must be retried after a backoff.

        Raises :class:`DeliveryError` for an error that retrying cannot cure."""
        backoff = refused = False
        answered = len(self.answers)
        final: tuple[str, BaseException] | None = None
        for index, reply in zip(chosen, replies, strict=True):
            call = self.calls[index]
            offsets = None if isinstance(reply, BaseException) else _offsets(reply, len(call.positions))
            if offsets is not None:
                self.answers[index] = offsets
                self.sequences.answer(self.topic, call.qid, call.seq)
                continue
            if isinstance(reply, NoScriptError):
                # A restarted server, or a replica just promoted, has an empty script cache: EVAL sends the
                # script itself (and caches it there); SCRIPT LOAD would reach only the masters redis-py knew.
                self.use_eval = True
                continue
            error = reply if isinstance(reply, BaseException) else ProduceError(
                f"unexpected reply {reply!r:.100}", retriable=False)
            if not is_retriable(error):
                # the round's other answers count first, so the error lists what they wrote
                final = final or (f"queue {call.qid}: {error}", error)
            elif OUT_OF_ORDER in str(error):
                # the script ran and found the call not applied; it goes again after its predecessor
                self.maybe.discard(index)
                refused = True
            else:
                if isinstance(error, _CUT_OFF):  # a cluster pipeline reports a lost node per command
                    self.maybe.add(index)
                self.last_error = error
                backoff = True
        self.pending = [index for index in self.pending if index not in self.answers]
        if final is not None:
            raise self.failure(*final)
        return backoff or (refused and len(self.answers) == answered)

    def lost(self, chosen: Sequence[int], exc: BaseException) -> None:
        """The whole round trip failed (connection, timeout): every call in it may or may not have run."""
        self.maybe.update(chosen)
        if not is_retriable(exc):
            raise self.failure(str(exc), exc)
        self.last_error = exc

    def before_retry(self) -> float:
        """Count a retry; the seconds to wait first. Raises :class:`DeliveryError` past the deadline."""
        if time.monotonic() >= self.deadline:
            raise self.failure(
                f"delivery_timeout_ms ({self.policy.delivery_timeout_ms}) passed; last error: {self.last_error}",
                self.last_error,
            )
        self.retries += 1
        logger.debug("producing to %r: retry %d after %s", self.topic, self.retries, self.last_error)
        return self.policy.wait_s(self.retries, self.deadline)

    def failure(self, reason: str, cause: BaseException | None) -> DeliveryError:
        written, unwritten, unknown = [], [], []
        for index, call in enumerate(self.calls):
            if index in self.answers:
                pairs = zip(call.positions, self.answers[index], strict=True)
                written += [WrittenMessage(position, call.qid, offset) for position, offset in pairs]
            elif index in self.maybe:
                unknown += call.positions
            else:
                unwritten += call.positions
        self.sequences.renew()
        kind = DeliveryError
        if is_redis_full(cause):
            kind = RedisFullError
            reason = f"Redis is full (used memory > maxmemory), retriable once memory is freed: {reason}"
        error = kind(
            self.topic, reason, written, unwritten, unknown, self.retries, time.monotonic() - self.started,
            retriable=cause is None or is_retriable(cause),
        )
        error.__cause__ = cause
        return error

    def results(self) -> list[SendResult]:
        results: list[SendResult | None] = [None] * self.total
        for index, call in enumerate(self.calls):
            for position, offset in zip(call.positions, self.answers[index], strict=True):
                results[position] = SendResult(self.topic, call.qid, offset)
        return [r for r in results if r is not None]
