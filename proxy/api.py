"""The one surface the server adapters (Thrift, later HTTP) call. Adapters decode, call, encode."""

from __future__ import annotations

from typing import Protocol

from ddmq.proxy.types import ConsumeStatsRow, PullBatch, QueueResult


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
