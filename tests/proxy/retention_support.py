"""Consuming through an in-process ProxyService for the retention tests, with the order/no-loss checker."""

from __future__ import annotations

import asyncio
import json
import time

from ddmq.proxy.core.types import QueueResult
from ddmq.proxy.service import ProxyService
from tests.support import OrderChecker


async def consume(
    service: ProxyService, group: str, checker: OrderChecker, total: int, *, topic: str = "t",
    pause_s: float = 0.0, deadline_s: float = 60.0, max_batch: int = 64,
) -> int:
    """Pull and ack ``group``'s messages of ``topic`` until ``checker`` saw ``total`` deliveries (or the
    deadline passes), recording order; waits ``pause_s`` between pulls (a slow group). Returns the
    number of deliveries; the last acks are submitted before returning."""
    results: list[QueueResult] = []
    deadline = time.monotonic() + deadline_s
    while checker.deliveries < total and time.monotonic() < deadline:
        batch = await service.api.pull(group, topic, max_batch, 200, results)
        results = []
        if batch.queue is None or not batch.messages:
            continue
        for message in batch.messages:
            event = json.loads(message.value)
            checker.delivered(event["k"], event["seq"])
            checker.acked(event["k"], event["seq"])
        results = [QueueResult(group, topic, str(batch.queue.qid), [m.offset for m in batch.messages], [])]
        if pause_s:
            await asyncio.sleep(pause_s)
    if results:
        await service.api.submit(results)
    return checker.deliveries


async def wait_for(condition: object, timeout_s: float = 20.0, what: str = "condition") -> None:
    """Poll an async ``condition()`` until it returns true."""
    deadline = time.monotonic() + timeout_s
    while not await condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
