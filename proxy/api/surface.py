"""The one surface the server adapters (Thrift and HTTP) call: they decode, call, encode.

What a request may ask (linger, batch size, maxPerKey, offsets per request, which group a result
belongs to) is decided behind this surface, in :mod:`ddmq.proxy.api.requests` and the service, never in
an adapter: both protocols answer the same request the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from ddmq.proxy.core.types import ConsumeStatsRow, FetchedQueue, PullBatch, PullLease, QueueResult, ReplySize

#: Most offsets (acks and fails of all its results together) one pull or submit may carry, over
#: Thrift and HTTP alike. A request over it is refused whole (BadRequestError, 1003): nothing of it
#: is applied. It bounds the memory and the time one request takes; a client with more acks sends
#: them in several requests.
MAX_RESULT_OFFSETS: Final = 100_000


class ConsumeService(Protocol):
    async def pull(
        self,
        group: str,
        topic: str | None,
        max_batch: int | None,
        linger_ms: int | None,
        results: list[QueueResult],
        lease: PullLease | None = None,
        max_per_key: int | None = None,
        reply: ReplySize | None = None,
        early: Callable[[PullBatch], None] | None = None,
        request_id: str | None = None,
    ) -> PullBatch:
        """Apply the piggy-backed ``results`` first (at most :data:`MAX_RESULT_OFFSETS` offsets, all
        or none; a result naming no group is ``group``'s), then return ready messages of one queue,
        waiting up to ``linger_ms`` when none are ready (as the client asked it: None = the default;
        the service bounds it). ``max_batch`` and ``max_per_key`` as asked (None = the defaults).
        The answer stays within the topic's ``max_reply_bytes`` as ``reply`` counts the adapter's
        bytes (None: a Thrift frame), but always carries one message when any is ready.
        With a ``lease``, a repeated pull of the same lease and index answers the same messages
        (until acked/expired). Results count even when the group was just removed.
        ``early``, when given, is called with the answer of a pull that had to wait, in the step that
        answers it and before this coroutine returns it: an adapter may write its reply there, one
        loop iteration sooner (and before the other reads of that iteration are taken in).
        A ``request_id`` (at most 128 characters) makes the pull retriable: a pull naming an id this
        proxy served answers what that pull answered and is still in flight, its results not applied
        again (:mod:`ddmq.proxy.api.pull_retries`).

        Raises UnknownGroupError / UnknownTopicError / BadRequestError / UnavailableError.
        """
        ...

    async def submit(self, results: list[QueueResult], group: str | None = None) -> None:
        """Apply acks/fails without pulling, all or none (at most :data:`MAX_RESULT_OFFSETS`
        offsets). Offsets of queues the proxy does not serve are ignored (counted). With ``group``
        (the request's group, when its protocol names one): a result naming no group is its, and an
        unknown group is refused (UnknownGroupError) with nothing applied; a group being removed
        still takes acks while it drains."""
        ...

    async def ack_leases(self, group: str, lease_ids: list[str], abandon: bool = False) -> int:
        """Ack every message of the named pull leases; returns how many were acked. Ids of leases
        another proxy served are acked from their records in Redis; unknown ids are ignored. With
        ``abandon``, mark the leases given up instead (no later ack finishes anything of them; answers
        0). Raises UnknownGroupError."""
        ...

    async def consume_stats(self, group: str, topic: str | None) -> list[ConsumeStatsRow]:
        """Per topic of the group (or just ``topic``): consume vs produce offsets per qid."""
        ...

    async def fetch(
        self,
        group: str,
        offsets: dict[str, dict[str, int]] | None,
        max_batch: int | None,
        linger_ms: int | None,
    ) -> list[FetchedQueue]:
        """Low-level read (no ordering gates): per named topic -> qid -> offset (-1 = the stored
        position), up to ``max_batch`` messages each; none named = every queue of the group from its
        stored position. Waits up to ``linger_ms`` (as asked; bounded like pull's) when there are no
        messages at all.
        """
        ...

    async def ack(self, group: str, offsets: dict[str, dict[str, int]]) -> None:
        """Store each topic -> qid -> offset as the group's low-level position (the next offset to fetch)."""
        ...
