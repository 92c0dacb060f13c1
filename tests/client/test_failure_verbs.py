"""The SDK's failure verbs against a real proxy process: ``raise Retry(after_ms)`` sets the next
delivery's delay, an exception's text is the reason kept with the dead letter, a handler running three
times ``timeout_ms`` is extended and not redelivered meanwhile, and what a consumer pulled but did not handle
when it stopped is released (no attempt counted, delivered again at once), from the threads' consumer
and from the asyncio one cancelled mid-handler."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddmq.client import AsyncPullConsumer, ConsumedMessage, PullConsumer, Retry
from ddmq.client.cli.admin import AdminClient
from ddmq.protocol.clitools import CliError
from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import Producer

from ..support import ProxyProcess

GROUP = "g"
#: t: the group's retry interval is long (10 s) so that a 1.5 s Retry is told apart from it;
#: slow: a 1 s timeout_ms for the extension test.
TOPICS = {
    "t": {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 1, "retry_intervals_ms": [10_000],
          "timeout_ms": 30_000},
    "slow": {"actions": ["Order", "PullServer"], "order_key": "KEY", "max_retry": 3, "timeout_ms": 1000},
}


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    http = {"enabled": True, "host": "127.0.0.1", "port": free_port()}
    process = ProxyProcess(tmp_path, redis_url, {GROUP: TOPICS}, {"t": {"queues": 2}, "slow": {"queues": 1}},
                           http=http).start()
    process.admin = AdminClient(f"http://127.0.0.1:{http['port']}")  # type: ignore[attr-defined]
    wait_for(lambda: _answers(process))  # the Thrift port listens first; the HTTP one follows
    try:
        yield process
    finally:
        process.stop()


def _answers(proxy: ProxyProcess) -> bool:
    try:
        admin(proxy, "/admin/groups")
    except CliError:
        return False
    return True


def admin(proxy: ProxyProcess, path: str, **query: Any) -> dict[str, Any]:
    answer: dict[str, Any] = proxy.admin.call("GET", path, query)  # type: ignore[attr-defined]
    return answer


def heads(proxy: ProxyProcess) -> dict[str, tuple[str, int]]:
    """Each key of topic t the proxy holds unfinished: its state and its head's attempts."""
    answer = admin(proxy, "/admin/groups/g/blocked-keys", topic="t", limit=100)
    return {key["order_key"]: (key["state"], key["head"]["attempts"]) for key in answer["keys"]}


def wait_for(condition: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_retry_after_ms_sets_the_delay_and_an_exception_text_is_the_reason(proxy: ProxyProcess,
                                                                           redis_url: str) -> None:
    with Producer(redis_url) as producer:
        producer.send("t", "pay 12.50", key="r1")
    seen: list[float] = []

    def process(message: ConsumedMessage) -> bool:
        seen.append(time.monotonic())
        if len(seen) == 1:
            raise Retry(1500, "the payment API asked us to slow down")
        raise ValueError("card declined for rider r1")

    with PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, process, topic="t", threads=1, linger_ms=500):
        wait_for(lambda: admin(proxy, "/admin/groups/g/topics/t/dead-letters")["total"] == 1)
    # The group's interval is 10 s; the client asked for 1.5 s (within ±20 %).
    assert len(seen) == 2 and 1.2 <= seen[1] - seen[0] <= 1.8, seen
    letter = admin(proxy, "/admin/groups/g/topics/t/dead-letters")["entries"][0]
    assert letter["key"] == "r1" and "ValueError: card declined for rider r1" in letter["error"], letter


def test_a_handler_running_three_timeouts_is_extended_not_redelivered(proxy: ProxyProcess, redis_url: str) -> None:
    with Producer(redis_url) as producer:
        producer.send("slow", "long job", key="job-1")
    deliveries: list[tuple[str, int]] = []
    lock = threading.Lock()

    def process(message: ConsumedMessage) -> bool:
        with lock:
            deliveries.append((threading.current_thread().name, message.offset))
            first = len(deliveries) == 1
        if first:
            time.sleep(3.0)  # three times the group's timeout_ms
        return True

    # Two pullers: a redelivery, had the deadline passed, would go to the idle one meanwhile.
    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, process, topic="slow", threads=2, linger_ms=300,
                            group_timeout_ms=1000)
    with consumer:
        wait_for(lambda: consumer.stats.acked == 1)
        time.sleep(1.5)  # room for a late redelivery to show up
    assert len(deliveries) == 1, deliveries
    assert consumer.stats.extended >= 4, consumer.stats  # every ~0.5 s of the 3 s
    wait_for(lambda: admin(proxy, "/admin/groups/g")["queues"][0]["lag"] == 0)


def test_messages_pulled_but_not_handled_are_released_when_a_consumer_stops(
    proxy: ProxyProcess, redis_url: str
) -> None:
    with Producer(redis_url) as producer:
        producer.send_batch("t", [{"key": f"r{i}", "value": f"call {i}", "qid": 0} for i in range(20)])
    handled: list[int] = []
    consumer: PullConsumer

    handled_values: list[str] = []

    def process_one(message: ConsumedMessage) -> bool:
        handled.append(message.offset)
        handled_values.append(message.value.decode())
        consumer.stop()  # the other messages of this batch are not handled
        return True

    consumer = PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, process_one, topic="t", threads=1, batch_size=20)
    consumer.run()
    assert len(handled) == 1 and consumer.stats.released >= 1, consumer.stats
    # Given back at once, no attempt counted (the group's timeout_ms is 30 s, its retry interval 10 s).
    assert heads(proxy) == {f"r{i}": ("waiting", 0) for i in range(20) if f"call {i}" not in handled_values}

    # The asyncio consumer, cancelled by close(grace_s) in the middle of a handler, gives its batch back too.
    started = asyncio.Event()

    async def process_slowly(message: ConsumedMessage) -> bool:
        started.set()
        await asyncio.sleep(60)
        return True

    async def cancel_mid_handler() -> AsyncPullConsumer:
        async_consumer = AsyncPullConsumer(f"127.0.0.1:{proxy.port}", GROUP, process_slowly, topic="t",
                                           concurrency=1, batch_size=20)
        await async_consumer.start()
        await asyncio.wait_for(started.wait(), 20)
        await async_consumer.close(grace_s=0.2)
        return async_consumer

    async_consumer = asyncio.run(cancel_mid_handler())
    assert async_consumer.stats.released >= 1, async_consumer.stats
    assert heads(proxy) == {f"r{i}": ("waiting", 0) for i in range(20) if f"call {i}" not in handled_values}

    # And a next consumer gets every one of them at once, in far less than timeout_ms.
    drained: list[int] = []
    with PullConsumer(f"127.0.0.1:{proxy.port}", GROUP, lambda m: drained.append(m.offset) is None, topic="t"):
        wait_for(lambda: len(drained) >= 19, timeout_s=10)
    assert sorted(drained + handled) == sorted(set(drained + handled)) and len(set(drained + handled)) == 20
