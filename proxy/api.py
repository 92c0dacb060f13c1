"""The one surface the server adapters (Thrift, later HTTP) call. Adapters decode, call, encode."""

from __future__ import annotations

from typing import Protocol

from ddmq.proxy.types import ConsumeStatsRow, FetchedQueue, PullBatch, QueueResult


class ConsumeService(Protocol):
    async def pull(
        self,
        group: str,
        topic: str | None,
        max_batch: int | None,
        linger_ms: int | None,
        results: list[QueueResult],
    ) -> PullBatch:
        """Apply the piggy-backed ``results`` first, then return ready messages of one queue,
        waiting up to ``linger_ms`` (None = the proxy default) when none are ready.

        Raises UnknownGroupError / UnknownTopicError / BadRequestError / UnavailableError.
        """
        ...

    async def submit(self, results: list[QueueResult]) -> None:
        """Apply acks/fails without pulling. Unknown offsets are ignored (counted)."""
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
