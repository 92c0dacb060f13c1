"""The client verbs beside ack and fail: fail with details, release, extend (``ConsumeResult`` fields
80-82, the HTTP results' ``fail_details``, ``release`` and ``extend``).

They follow the rule of acks: only messages in flight to the group count; anything else is ignored and
counted (``ddmq_fails_unknown``, ``ddmq_verbs_ignored``). A result that carries none of them takes
the plain ack/fail path and pays nothing for them.
"""

from __future__ import annotations

from typing import Final, Protocol

from ddmq.proxy.core.types import FailNote, QueueId, QueueResult

__all__ = ["GENERIC_REASON", "REASON_MAX_BYTES", "VerbTarget", "apply_verbs", "clip_reason", "noted_fails_once"]

#: A client's reason is kept to this many bytes of UTF-8 (dead letters, blocked keys and the keys API
#: show it; a longer one would let a client fill Redis through them).
REASON_MAX_BYTES: Final = 1024
#: The last error of a message a client failed without saying why.
GENERIC_REASON: Final = "client reported failure"


class VerbTarget(Protocol):
    """What the verbs need of a group's pull buffer."""

    def fail(
        self, queue: QueueId, offsets: list[int], reason: str = ..., retry_after_ms: int | None = None
    ) -> None: ...

    def release(self, queue: QueueId, offsets: list[int]) -> None: ...

    def extend(self, queue: QueueId, offsets: list[int]) -> None: ...


def clip_reason(reason: str | None) -> str:
    """``reason`` within :data:`REASON_MAX_BYTES` bytes of UTF-8 (cut on a character boundary), or the
    generic reason when the client gave none."""
    if not reason:
        return GENERIC_REASON
    raw = reason.encode("utf-8", "replace")
    if len(raw) <= REASON_MAX_BYTES:
        return reason
    return raw[:REASON_MAX_BYTES].decode("utf-8", "ignore")


def noted_fails_once(result: QueueResult) -> QueueResult:
    """``result`` with offsets that also have a fail detail taken out of its plain fails: the detail
    says the same and more, and one failure must count one attempt."""
    noted = {note.offset for note in result.fail_details}
    return result._replace(fail=[offset for offset in result.fail if offset not in noted])


def apply_verbs(buffer: VerbTarget, queue: QueueId, result: QueueResult) -> None:
    """Apply ``result``'s fail details, then releases, then extensions (its acks and plain fails are
    applied before, so a message acked in the same result is finished already and its verbs ignored)."""
    for note in result.fail_details:
        apply_fail_note(buffer, queue, note)
    if result.release:
        buffer.release(queue, list(result.release))
    if result.extend:
        buffer.extend(queue, list(result.extend))


def apply_fail_note(buffer: VerbTarget, queue: QueueId, note: FailNote) -> None:
    buffer.fail(queue, [note.offset], clip_reason(note.reason), note.retry_after_ms)
