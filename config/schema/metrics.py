"""The ``metrics`` section: what ``/metrics`` exports."""

from __future__ import annotations

from ddmq.config.schema.base import Model


class MetricsConfig(Model):
    #: Export the queue-level series (``ddmq_messages_*``, ``ddmq_lag_*``, ``ddmq_queue_owned``, ...) per
    #: queue, with a ``qid`` label, plus ``ddmq_consume_offset`` / ``ddmq_produce_offset``, and the
    #: action durations per topic. Off: one series per (group, topic), summed over the queues this proxy
    #: holds (``ddmq_lag_seconds``: their max), action durations per (group, action), so a scrape's size
    #: follows the number of topics, not of queues. Changes on reload.
    per_queue: bool = False
