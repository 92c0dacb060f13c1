"""The client's public surface is deliberate: adding or removing a name must change this test."""

from __future__ import annotations

import ddmq.client


def test_public_names_are_pinned() -> None:
    assert sorted(ddmq.client.__all__) == [
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
    for name in ddmq.client.__all__:
        assert getattr(ddmq.client, name) is not None
