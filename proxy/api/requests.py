"""The rules of a client's request, shared by every server adapter.

The Thrift and HTTP servers translate their wire forms into :class:`~ddmq.proxy.api.surface.ConsumeService`
calls and the service's errors back; what a request may ask and what the proxy makes of what it
leaves out is decided here, once, so that both protocols answer the same request the same way:

- the long-poll wait (``maxLingerTime`` / ``linger_ms``): unset means :data:`DEFAULT_LINGER_MS`,
  and it is bounded by ``0..max_linger_ms`` of the server the request came through;
- the batch size: unset or 0 means the topic's ``max_pull_batch_size``, which also bounds it;
- ``maxPerKey``: unset, 0 or 1 means one message per key;
- acks and fails: at most :data:`~ddmq.proxy.api.surface.MAX_RESULT_OFFSETS` offsets per request, else the
  request is refused whole (:func:`too_many_offsets`); a result that names no group belongs to the
  request's group (both applied with the results, in :mod:`ddmq.proxy.api.results`).

Each server adapter holds a view of :class:`~ddmq.proxy.api.consume.ConsumeApi` bound to that server's
:class:`RequestRules`.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS
from ddmq.proxy.core.errors import BadRequestError

#: Long-poll wait when a client does not say.
DEFAULT_LINGER_MS: Final = 1000


class RequestRules(NamedTuple):
    """The limits of one server (its ``max_linger_ms``) and the rules every request follows."""

    max_linger_ms: int

    def linger(self, asked_ms: int | None) -> int:
        """The client's long-poll wait within ``0..max_linger_ms``; unset: the default, within the same bound."""
        if asked_ms is None:
            return min(DEFAULT_LINGER_MS, self.max_linger_ms)
        return min(max(asked_ms, 0), self.max_linger_ms)


def batch_size(asked: int | None, cap: int) -> int:
    """At most ``cap`` messages; unset or 0 asks for ``cap``."""
    if asked is not None and asked < 0:
        raise BadRequestError(f"maxBatchSize must not be negative, got {asked}")
    return min(asked, cap) if asked else cap


def per_key(asked: int | None) -> int:
    """How many messages of one key a reply may carry (an ordered run); unset or 0 means one."""
    if asked is not None and asked < 0:
        raise BadRequestError(f"maxPerKey must not be negative, got {asked}")
    return asked or 1


def too_many_offsets(total: int | None = None) -> BadRequestError:
    """The refusal of a request over MAX_RESULT_OFFSETS (``total`` when it is known: the Thrift
    decoder stops counting at the limit)."""
    has = f", this one has {total}" if total is not None else ""
    return BadRequestError(
        f"a request may carry at most {MAX_RESULT_OFFSETS} offsets (acks and fails together){has}; "
        "split them over several"
    )
