"""ddmq client SDK: produce to a topic, consume through the proxy, and the wire contract.

>>> from ddmq.client import Producer, PullConsumer
>>> with Producer("redis://127.0.0.1:6379/0") as producer:
...     producer.send("rides", '{"rider_id": "r1", "event": "call"}', key="r1")
>>> consumer = PullConsumer("127.0.0.1:9713", "cg_rides", lambda message: True, threads=4)
>>> consumer.run()  # until consumer.stop() or a fatal error (raised)
"""

from ddmq.client.consumer import AsyncPullConsumer, ConsumedMessage, NotProcessed, PullConsumer, Retry
from ddmq.client.thrift_client import AsyncProxyClient, ProxyClient, ProxyClientError, PullError
from ddmq.protocol.produce.producer import (
    AsyncProducer,
    DeliveryError,
    OutgoingMessage,
    Producer,
    RedisFullError,
    SendResult,
)
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.queues import ProduceError

__all__ = [
    "AsyncProducer",
    "AsyncProxyClient",
    "AsyncPullConsumer",
    "ConsumedMessage",
    "DeliveryError",
    "NotProcessed",
    "OutgoingMessage",
    "ProduceError",
    "Producer",
    "ProxyClient",
    "ProxyClientError",
    "PullConsumer",
    "PullError",
    "RedisFullError",
    "Retry",
    "SendResult",
    "queue_for_key",
]
