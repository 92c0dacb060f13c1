"""Topics: their queues and what Redis keeps of them (retention)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from ddmq.config.schema.base import Model


class RetentionConfig(Model):
    """How much of a topic Redis keeps (docs/retention.md). The proxy holding a queue's lease trims it."""

    #: Trim each queue up to the lowest committed offset of every group registered for the topic
    #: (``ddmq groups list``): nothing a group has not finished is removed by this rule.
    consumed: bool = True
    #: Cap: entries produced longer ago than this go, consumed or not (counted as expired for each
    #: group that had not finished them). Unset: no age cap.
    max_age_s: Annotated[int, Field(ge=1)] | None = None
    #: Cap: at most this many entries per queue, consumed or not (counted as expired like ``max_age_s``).
    max_len: Annotated[int, Field(ge=1)] | None = None
    #: A group whose proxies have not heartbeaten for this topic in this long stops holding back the
    #: ``consumed`` trim (what is trimmed past it counts as expired for it when it comes back). Unset: a
    #: stopped group holds the trim back for ever.
    group_idle_after_s: Annotated[int, Field(ge=1)] | None = None
    #: How often the trimmer looks at each queue while something happens on it; a queue where nothing
    #: does is looked at less often, down to once every 8 intervals (docs/retention.md).
    interval_ms: Annotated[int, Field(ge=10, le=3_600_000)] = 1_000
    #: At most this many entries are removed by one Redis command, so a trim never stalls reads.
    step: Annotated[int, Field(ge=1, le=100_000)] = 1_000


class TopicConfig(Model):
    #: Queues (Redis streams) of the topic. Fixed once the topic exists: changing it would move keys to
    #: other queues and break their order, so a mismatch with Redis is an error.
    queues: Annotated[int, Field(ge=1, le=4096)] = 8
    #: What Redis keeps of the topic: trimmed up to what every group finished, plus optional caps.
    retention: RetentionConfig = RetentionConfig()
