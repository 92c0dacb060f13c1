"""The rules of a client's request, shared by every server adapter: one table for both wires.

The Thrift and HTTP servers translate their wire forms into :class:`~ddmq.proxy.api.surface.ConsumeService`
calls and the service's errors back; what a request may hold, and what the proxy makes of what it
leaves out, is decided here once, so both protocols answer the same request the same way. The HTTP
models take their bounds from :data:`REQUEST_BOUNDS` and :data:`RESULT_BOUNDS` (and the OpenAPI
document states them; a test holds the three equal), the service checks them for Thrift too:

- a request's own fields (:data:`REQUEST_BOUNDS`: names, ``maxBatchSize``/``max_batch``,
  ``maxLingerTime``/``linger_ms``, ``maxPerKey``/``max_per_key``, ``requestId``/``request_id``) outside
  their bounds refuse the request (1003), nothing of it applied (:func:`check_pull`, :func:`check_group`);
- unset linger means :data:`DEFAULT_LINGER_MS`, any linger is bounded by ``max_linger_ms`` of the
  server the request came through; unset or 0 batch size means the topic's ``max_pull_batch_size``,
  which also bounds it; unset, 0 or 1 ``maxPerKey`` means one message per key;
- results (acks, fails, fail details, releases, extensions) never cost the rest of their request: an
  entry that names no message (:data:`RESULT_BOUNDS`: an offset below 1, a qid that is no queue's, a
  result without a topic, a negative retry delay) is left out and counted (:func:`valid_results`),
  as one naming a message this proxy does not hold is; only a request over
  :data:`~ddmq.proxy.api.surface.MAX_RESULT_OFFSETS` offsets is refused whole (:func:`too_many_offsets`);
- a result that names no group is the request's; a request without a group of its own (Thrift's
  ``submit``) takes its first result's (:func:`request_group`), and an unknown one is refused (1001).

Each server adapter holds a view of :class:`~ddmq.proxy.api.consume.ConsumeApi` bound to that server's
:class:`RequestRules`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS
from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.core.types import FailNote, QueueResult

#: Long-poll wait when a client does not say.
DEFAULT_LINGER_MS: Final = 1000
#: The IDL's integer types: a value outside them is refused whole on both wires (the Thrift decoder
#: refuses it before the call, the HTTP models as a 400).
I32_MAX: Final = 2**31 - 1
I64_MAX: Final = 2**63 - 1
#: The highest qid: a topic has at most 4,096 queues (``queues`` in ``config/schema/topics.py``).
MAX_QID: Final = 4095


class Bound(NamedTuple):
    """``low..high`` inclusive: of a number, or of a text's length in characters."""

    low: int
    high: int

    def holds(self, value: int) -> bool:
        return self.low <= value <= self.high


#: A request's own fields: outside these it is refused (1003). Keyed by the HTTP name; the Thrift
#: name is in :data:`THRIFT_NAMES`.
REQUEST_BOUNDS: Final[dict[str, Bound]] = {
    "group": Bound(1, 200),
    "topic": Bound(0, 200),  # 0: the empty topic is no topic (any of the group's)
    "max_batch": Bound(0, I32_MAX),
    "linger_ms": Bound(0, I32_MAX),
    "max_per_key": Bound(0, I32_MAX),
    "request_id": Bound(1, 128),  # a pull's retry id (proxy/api/pull_retries.py), in characters
    "key": Bound(1, 4096),  # an order key named by an operator (the admin API's keys and replays)
}
#: What a result's entries must be to name a message; an entry outside is left out and counted.
RESULT_BOUNDS: Final[dict[str, Bound]] = {
    "topic": Bound(1, 200),
    "qid": Bound(0, MAX_QID),
    "offset": Bound(1, I64_MAX),
    "retry_after_ms": Bound(0, I32_MAX),
}
THRIFT_NAMES: Final[dict[str, str]] = {
    "group": "groupId", "topic": "topic", "max_batch": "maxBatchSize", "linger_ms": "maxLingerTime",
    "max_per_key": "maxPerKey", "request_id": "requestId",
}


def _refuse(field: str, value: object, bound: Bound, what: str = "") -> BadRequestError:
    name = f"{field} ({THRIFT_NAMES[field]})" if THRIFT_NAMES.get(field, field) != field else field
    return BadRequestError(f"{name}{what} must be within {bound.low}..{bound.high}, got {value!r}")


def check_group(group: str) -> None:
    """Refuse (1003) a group name outside its length bound."""
    bound = REQUEST_BOUNDS["group"]
    if not bound.holds(len(group)):
        raise _refuse("group", group[:40] + ("..." if len(group) > 40 else ""), bound, "'s length")


def check_pull(
    group: str, topic: str | None, max_batch: int | None, linger_ms: int | None, max_per_key: int | None,
    request_id: str | None = None,
) -> None:
    """Refuse (1003) a pull whose own fields are outside :data:`REQUEST_BOUNDS`, before anything of it
    (its results included) is applied."""
    check_group(group)
    if topic is not None and not REQUEST_BOUNDS["topic"].holds(len(topic)):
        raise _refuse("topic", topic[:40] + "...", REQUEST_BOUNDS["topic"], "'s length")
    if request_id is not None and not REQUEST_BOUNDS["request_id"].holds(len(request_id)):
        raise _refuse("request_id", request_id[:40] + "...", REQUEST_BOUNDS["request_id"], "'s length")
    for field, value in (("max_batch", max_batch), ("linger_ms", linger_ms), ("max_per_key", max_per_key)):
        if value is not None and not REQUEST_BOUNDS[field].holds(value):
            raise _refuse(field, value, REQUEST_BOUNDS[field])


class RequestRules(NamedTuple):
    """The limits of one server (its ``max_linger_ms``) and the rules every request follows."""

    max_linger_ms: int

    def linger(self, asked_ms: int | None) -> int:
        """The client's long-poll wait, at most ``max_linger_ms``; unset: the default, within the same
        bound; negative: refused (1003)."""
        if asked_ms is None:
            return min(DEFAULT_LINGER_MS, self.max_linger_ms)
        if asked_ms < 0:
            raise _refuse("linger_ms", asked_ms, REQUEST_BOUNDS["linger_ms"])
        return min(asked_ms, self.max_linger_ms)


def batch_size(asked: int | None, cap: int) -> int:
    """At most ``cap`` messages; unset or 0 asks for ``cap``."""
    if asked is not None and asked < 0:
        raise _refuse("max_batch", asked, REQUEST_BOUNDS["max_batch"])
    return min(asked, cap) if asked else cap


def per_key(asked: int | None) -> int:
    """How many messages of one key a reply may carry (an ordered run); unset or 0 means one."""
    if asked is not None and asked < 0:
        raise _refuse("max_per_key", asked, REQUEST_BOUNDS["max_per_key"])
    return asked or 1


def request_group(results: list[QueueResult]) -> str | None:
    """The group of a request that names none of its own (Thrift's ``submit``): its first result's.
    None for no results; a request whose results all name no group is refused (1003), since nothing
    of it could be applied."""
    if not results:
        return None
    for result in results:
        if result.group:
            return result.group
    raise BadRequestError("no result names a group (ConsumeResult.context.groupId)")


def _qid_holds(qid: str) -> bool:
    return qid.isdigit() and qid.isascii() and len(qid) <= 5 and RESULT_BOUNDS["qid"].holds(int(qid))


def _offsets_hold(offsets: Sequence[int]) -> bool:
    # min/max run in C: a request of 100,000 valid acks pays two passes, not a Python loop.
    bound = RESULT_BOUNDS["offset"]
    return not offsets or (min(offsets) >= bound.low and max(offsets) <= bound.high)


def _note_holds(note: FailNote) -> bool:
    delay = note.retry_after_ms
    if delay is not None and not RESULT_BOUNDS["retry_after_ms"].holds(delay):
        return False
    return RESULT_BOUNDS["offset"].holds(note.offset)


def valid_results(results: list[QueueResult]) -> tuple[list[QueueResult], int, str]:
    """``results`` without the entries that name no message, how many entries were left out, and the
    first reason (for the log). A result whose topic or qid names no queue is left out whole."""
    if all(_result_holds(r) for r in results):
        return results, 0, ""
    kept: list[QueueResult] = []
    dropped, reason = 0, ""
    for r in results:
        if _result_holds(r):
            kept.append(r)
            continue
        if not RESULT_BOUNDS["topic"].holds(len(r.topic)) or not _qid_holds(r.qid):
            dropped += r.size
            reason = reason or f"result for topic {r.topic[:40]!r} qid {r.qid[:20]!r}: no such queue can exist"
            continue
        offset = RESULT_BOUNDS["offset"]
        lists = [[o for o in part if offset.holds(o)] for part in (r.success, r.fail, r.release, r.extend)]
        notes = [n for n in r.fail_details if _note_holds(n)]
        left_out = r.size - sum(map(len, lists)) - len(notes)
        dropped += left_out
        reason = reason or f"{r.topic}#{r.qid}: {left_out} offset(s) outside 1..{I64_MAX} or a negative retry delay"
        kept.append(r._replace(success=lists[0], fail=lists[1], release=tuple(lists[2]), extend=tuple(lists[3]),
                               fail_details=notes))
    return kept, dropped, reason


def _result_holds(r: QueueResult) -> bool:
    return (
        RESULT_BOUNDS["topic"].holds(len(r.topic)) and _qid_holds(r.qid)
        and _offsets_hold(r.success) and _offsets_hold(r.fail) and _offsets_hold(r.release)
        and _offsets_hold(r.extend) and all(map(_note_holds, r.fail_details))
    )


def too_many_offsets(total: int | None = None) -> BadRequestError:
    """The refusal of a request over MAX_RESULT_OFFSETS (``total`` when it is known: the Thrift
    decoder stops counting at the limit)."""
    has = f", this one has {total}" if total is not None else ""
    return BadRequestError(
        f"a request may carry at most {MAX_RESULT_OFFSETS} offsets (acks and fails together){has}; "
        "split them over several"
    )
