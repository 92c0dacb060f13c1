"""Produce messages into a topic's queues: the library lives in :mod:`ddmq.protocol.producer` (the proxy
uses it too); this module keeps the client's import path for it."""

from ddmq.protocol.producer import (
    AsyncProducer,
    DeliveryError,
    MessageTooLargeError,
    OutgoingMessage,
    Producer,
    SendResult,
)
from ddmq.protocol.queues import (
    ProduceError,
    TopicMismatchError,
    ensure_topic,
    repair_queue,
)

__all__ = [
    "AsyncProducer",
    "DeliveryError",
    "MessageTooLargeError",
    "OutgoingMessage",
    "ProduceError",
    "Producer",
    "SendResult",
    "TopicMismatchError",
    "ensure_topic",
    "repair_queue",
]
