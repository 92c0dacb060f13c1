"""The ``metrics`` section: what ``/metrics`` exports."""

from __future__ import annotations

from ddmq.config.schema.base import Model


class MetricsConfig(Model):
    #: Export every family with its finest labels: the queue-level series (``ddmq_messages_*``,
    #: ``ddmq_lag_*``, ``ddmq_queue_owned``, ...) per queue, with ``group``, ``topic`` and ``qid``, plus
    #: ``ddmq_consume_offset`` / ``ddmq_produce_offset``, the others per (group, topic), the pull
    #: durations per group. Off: lag, lag in time, in flight and the delivered / acked / failed /
    #: dead-lettered counts per (group, topic), summed over the queues this proxy holds; the other
    #: families per group, or per proxy (histograms, ignored client verbs), so a scrape's size follows
    #: the (group, topic) pairs times a handful, not the queues. Changes on reload.
    per_queue: bool = False
