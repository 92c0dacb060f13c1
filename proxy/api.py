"""The one surface the server adapters (Thrift, later HTTP) call. Adapters decode, call, encode."""

from __future__ import annotations

from typing import Final, Protocol

from ddmq.proxy.types import ConsumeStatsRow, FetchedQueue, PullBatch, PullLease, QueueResult

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
    ) -> PullBatch:
        """Apply the piggy-backed ``results`` first (at most :data:`MAX_RESULT_OFFSETS` offsets),
        then return ready messages of one queue,
        waiting up to ``linger_ms`` (None = the proxy default) when none are ready. With a ``lease``,
        a repeated pull of the same lease and index answers the same messages (until acked/expired).

        Raises UnknownGroupError / UnknownTopicError / BadRequestError / UnavailableError.
        """
        ...

    async def submit(self, results: list[QueueResult]) -> None:
        """Apply acks/fails without pulling. Unknown offsets are ignored (counted)."""
        ...

    async def ack_leases(self, group: str, lease_ids: list[str]) -> int:
        """Ack every message of the named pull leases; returns how many were acked. Unknown ids are
        ignored. Raises UnknownGroupError."""
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
        stored position. Waits up to ``linger_ms`` when there are no messages at all.
        """
        ...

    async def ack(self, group: str, offsets: dict[str, dict[str, int]]) -> None:
        """Store each topic -> qid -> offset as the group's low-level position (the next offset to fetch)."""
        ...
