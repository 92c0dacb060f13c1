"""Results: what a request says of the messages it was handed (acks, fails, fail details, releases,
extensions), applied to the pull buffers of the groups that handed them out.

The rules of results, the same over Thrift and HTTP: a request carries at most
:data:`~ddmq.proxy.api.surface.MAX_RESULT_OFFSETS` offsets (acks and fails together), else it is
refused whole and nothing of it applied; a result that names no group is the request's group's; an
entry that can name no message (:func:`~ddmq.proxy.api.requests.valid_results`) is left out, logged and
counted (``invalid_results``), and a result for a group, topic or queue this proxy does not serve is
ignored (counted ``unknown_results``): neither costs the other entries of the request.

A topic with a breaker (:mod:`ddmq.proxy.engine.breaker`) is told how many of a result's acks
finished a message: its successes; its failures come from the engine's redelivery.

Each result goes to its group's buffer, found in the registry
(:meth:`~ddmq.proxy.groups.registry.GroupRegistry.results_buffer`), and from there down the engine:
the buffer finishes an acked job through its owner, :class:`~ddmq.proxy.engine.topic_jobs.TopicJobs`,
which releases its key and marks its offset; the commit that follows is the committer's
(:mod:`ddmq.proxy.cluster.commits`). Nothing of it comes back up to the consumer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Final

from ddmq.proxy.api.requests import too_many_offsets, valid_results
from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS
from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.core.types import QueueId, QueueResult
from ddmq.proxy.engine.verbs import apply_verbs, noted_fails_once
from ddmq.proxy.groups.registry import GroupRegistry

log = logging.getLogger(__name__)

__all__ = ["APPLY_SLICE_OFFSETS", "Results", "in_group", "result_offsets"]

#: Results with more offsets than this are applied in slices of it, letting other connections'
#: requests run in between (a slice takes a few milliseconds; bench/edges.py measures the effect).
APPLY_SLICE_OFFSETS: Final = 4096
#: Invalid entries are logged at most this often (a buggy client sends them with every pull); the
#: counter has them all.
INVALID_LOG_INTERVAL_S: Final = 10.0


def result_offsets(results: list[QueueResult]) -> int:
    """How many offsets ``results`` carry; raises BadRequestError over MAX_RESULT_OFFSETS."""
    total = sum(r.size for r in results)
    if total > MAX_RESULT_OFFSETS:
        raise too_many_offsets(total)
    return total


def in_group(results: list[QueueResult], group: str | None) -> list[QueueResult]:
    """``results`` with the request's ``group`` where a result names none."""
    if not group:
        return results
    return [r if r.group else r._replace(group=group) for r in results]


class Results:
    """Applies requests' results to the buffers of ``registry``'s groups; ``counters`` counts refused
    requests (``results_refused``), entries left out (``invalid_results``) and ignored offsets
    (``unknown_results``)."""

    def __init__(self, registry: GroupRegistry, counters: Counter[str]) -> None:
        self._registry = registry
        self._counters = counters
        self._invalid_logged_at = -INVALID_LOG_INTERVAL_S

    async def apply(self, results: list[QueueResult], group: str | None = None) -> None:
        """Apply ``results`` (those naming no group are ``group``'s): all of them, or none when they
        carry more than MAX_RESULT_OFFSETS offsets (BadRequestError)."""
        results = in_group(results, group)
        try:
            total = result_offsets(results)
        except BadRequestError:
            self._counters["results_refused"] += 1
            raise
        results, invalid, reason = valid_results(results)
        if invalid:
            self._left_out(invalid, reason)
        results = [noted_fails_once(r) if r.fail_details else r for r in results]
        if total <= APPLY_SLICE_OFFSETS:
            self._apply_now(results)
            return
        since_yield = 0
        for piece in _slices(results, APPLY_SLICE_OFFSETS):
            self._apply_now([piece])
            since_yield += piece.size
            if since_yield >= APPLY_SLICE_OFFSETS:
                since_yield = 0
                await asyncio.sleep(0)

    def _left_out(self, count: int, reason: str) -> None:
        self._counters["invalid_results"] += count
        now = time.monotonic()
        if now - self._invalid_logged_at >= INVALID_LOG_INTERVAL_S:
            self._invalid_logged_at = now
            log.warning("ignored %d result entr%s naming no message (%s); the request's other entries were applied "
                        "(invalid_results counts them all)", count, "y" if count == 1 else "ies", reason)

    def _apply_now(self, results: list[QueueResult]) -> None:
        registry = self._registry
        for result in results:
            try:
                qid = int(result.qid)
            except ValueError:
                qid = -1
            buffer = registry.results_buffer(result.group, result.topic, qid)
            if buffer is None:
                self._counters["unknown_results"] += result.size
                log.debug("ignoring results for unknown %s/%s#%s", result.group, result.topic, result.qid)
                continue
            queue = QueueId(result.topic, qid)
            if result.success:
                breakers = buffer.redelivery.breakers
                if breakers and result.topic in breakers:
                    # The acks that finished a delivered message are its breaker's successes; ignored ones are not.
                    stats = buffer.queue_stats[queue]
                    acked = stats.acked
                    buffer.ack(queue, result.success)
                    if stats.acked > acked:
                        breakers[result.topic].succeeded(stats.acked - acked)
                else:
                    buffer.ack(queue, result.success)
            if result.fail:
                buffer.fail(queue, result.fail)
            if result.fail_details or result.release or result.extend:
                apply_verbs(buffer, queue, result)


def _slices(results: list[QueueResult], size: int) -> list[QueueResult]:
    """``results`` cut into pieces of at most ``size`` offsets each, in order (a result's acks before its fails)."""
    pieces = []
    for r in results:
        pieces += [r._replace(success=r.success[i : i + size], fail=[], release=(), extend=(), fail_details=())
                   for i in range(0, len(r.success), size)]
        pieces += [r._replace(success=[], fail=r.fail[i : i + size], release=(), extend=(), fail_details=())
                   for i in range(0, len(r.fail), size)]
        if r.release or r.extend or r.fail_details:
            pieces.append(r._replace(success=[], fail=[]))  # the verbs, at most MAX_RESULT_OFFSETS together
    return pieces
