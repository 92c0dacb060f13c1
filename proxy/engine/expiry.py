"""Entries a group never saw: a queue read past offsets that are no longer in its stream.

Offsets are dense (the producer script numbers a queue's entries 1, 2, 3...), so when a read that
continues after offset ``n`` returns first an entry past ``n + 1``, the entries between were removed
before this group read them: a retention cap (``max_len``, ``max_age_s``), a group that was idle past
``group_idle_after_s``, or a producer's ``maxlen``. That is data loss for the group and is never
silent: it is logged at ERROR level with the offsets, counted in the consumer's ``expired`` counter
(``ddmq_messages_expired_total``) and recorded in Redis for ``ddmq status`` and the console
(:func:`ddmq.proxy.store.trim.record_expired`, which counts each offset once even when the queue's
next owner reads the same gap again).
"""

from __future__ import annotations

import logging
from collections import Counter

from ddmq.protocol.redis.connection import AsyncRedis
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.store.trim import record_expired

log = logging.getLogger(__name__)


async def count_expired(
    redis: AsyncRedis, group: str, topic: str, qid: int, first: int, last: int, counts: Counter[int]
) -> None:
    """Offsets ``first..last`` of ``topic#qid`` are gone before ``group`` read them."""
    log.error(
        "group %s lost offsets %d..%d of %s#%d (%d message(s)): they were trimmed from Redis before the "
        "group read them (retention cap, idle group, or a producer's maxlen)",
        group, first, last, topic, qid, last - first + 1,
    )
    try:
        counts[qid] += await record_expired(redis, group, topic, qid, first, last)
    except DdmqError as exc:
        counts[qid] += last - first + 1
        log.warning("%s/%s#%d: could not record the expired offsets in Redis: %s", group, topic, qid, exc)
