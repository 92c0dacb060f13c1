"""Small value types shared by the engine, the adapters and the client."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from ddmq.protocol.redis.stream_entry import (
    StoredMessage as StoredMessage,  # re-exported: the engine names it from here
)
from ddmq.proxy.core.pull_codec import REPLY_OVERHEAD_BYTES, message_bytes_bound


class QueueId(NamedTuple):
    """One queue of a topic: a single Redis stream, read in order by one proxy."""

    topic: str
    qid: int

    def __str__(self) -> str:
        return f"{self.topic}#{self.qid}"


class FailNote(NamedTuple):
    """A failure in the client's words (the wire's ``FailDetail``): ``retry_after_ms`` asks for the next
    attempt that many milliseconds from now (None: the group's retry interval); ``reason`` becomes the
    message's last error (None: the generic one)."""

    offset: int
    retry_after_ms: int | None = None
    reason: str | None = None


class QueueResult(NamedTuple):
    """Ack/fail offsets a client reports for one (topic, qid); one node of DDMQ's ConsumeResult list.

    ``qid`` stays the wire's string: the engine parses it and ignores (counts) what it cannot match.
    ``release``, ``extend`` and ``fail_details`` are the ddmq verbs (fields 80-82): empty unless sent.
    """

    group: str
    topic: str
    qid: str
    success: list[int]
    fail: list[int]
    release: Sequence[int] = ()
    extend: Sequence[int] = ()
    fail_details: Sequence[FailNote] = ()

    @property
    def size(self) -> int:
        """Offsets this result carries, every verb together (the per-request limit counts these)."""
        return len(self.success) + len(self.fail) + len(self.release) + len(self.extend) + len(self.fail_details)


class PullBatch(NamedTuple):
    """What one pull answers: messages of a single queue (``queue`` is None when empty)."""

    queue: QueueId | None
    messages: list[StoredMessage]
    #: Sizes of the batch's ordered runs (consecutive messages of one key), in order; None when every
    #: message is the only one of its key in the batch.
    runs: list[int] | None = None


class ReplySize(Protocol):
    """How one server counts a pull reply's bytes, so the pull buffer can fill a reply up to the topic's
    ``max_reply_bytes``: a bound on what the reply takes besides its messages, and on what each message
    adds to it (its encoding, its entry in ``runs``). Each server encodes differently (Thrift frames,
    JSON with base64), so each brings its own."""

    @property
    def overhead(self) -> int: ...

    def message(self, message: StoredMessage) -> int: ...


class _ThriftReply:
    """A pull reply's size as a Thrift frame (:mod:`ddmq.proxy.core.pull_codec`'s bound)."""

    overhead = REPLY_OVERHEAD_BYTES

    @staticmethod
    def message(message: StoredMessage) -> int:
        return message_bytes_bound(message)


#: The Thrift server's reply arithmetic; also what a pull that names none is filled by.
THRIFT_REPLY: ReplySize = _ThriftReply()


class PullLease(NamedTuple):
    """A replayable pull: pull number ``pull_index`` of lease ``lease_id``, held ``timeout_ms`` (None:
    the topic's ``timeout_ms``) until acked. See :mod:`ddmq.proxy.engine.replays`."""

    lease_id: str
    pull_index: int
    timeout_ms: int | None


class FetchedQueue(NamedTuple):
    """One queue's page of a low-level ``fetch``: messages in offset order and where to continue."""

    topic: str
    qid: int
    next_offset: int
    messages: list[StoredMessage]


class ConsumeStatsRow(NamedTuple):
    """Per queue of one (group, topic): next offset to consume vs next offset to be produced."""

    group: str
    topic: str
    consume_offsets: dict[str, int]
    produce_offsets: dict[str, int]
    #: Per qid with a live lease: holder, milliseconds left, term.
    owners: dict[str, str] = {}
    lease_ttl_ms: dict[str, int] = {}
    lease_terms: dict[str, int] = {}
    #: Per qid where the group lost entries (trimmed before it read them): how many, and the latest
    #: range as ``"first..last"``.
    expired: dict[str, int] = {}
    expired_last: dict[str, str] = {}
