"""The clients pulling, as the admin API and the console list them: real Thrift and HTTP clients of a
real proxy; what each holds goes down as it acks, and the version string comes from the wire."""

from __future__ import annotations

from typing import Any

from ddmq.client.thrift_client import AsyncProxyClient
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.wire import ConsumeResult, Context, PullRequest
from ddmq.proxy.core.types import PullBatch, QueueId, QueueResult, StoredMessage
from ddmq.proxy.servers.clients import MAX_CLIENTS, ClientTracker

from .test_http_api import http_proxy, pull


async def test_the_clients_pulling_with_version_peer_last_pull_and_in_flight(redis_url: str) -> None:
    async with http_proxy(redis_url, {"timeout_ms": 60_000}, queues=1) as (service, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"k{i}", "value": f"v{i}"} for i in range(6)])
        async with AsyncProxyClient("127.0.0.1", service.thrift_port or 0) as thrift:
            response = await thrift.pull(PullRequest(groupId="g", topic="t", maxBatchSize=4, maxLingerTime=5000,
                                                     version="carrera-java/2.3.1"))
            assert len(response.messages) == 4
            status, body = await api.call("GET", "/admin/groups/g/clients")
            assert status == 200 and body["total"] == 1
            (client,) = body["clients"]
            assert (client["protocol"], client["version"], client["pulls"], client["in_flight"]) == (
                "thrift", "carrera-java/2.3.1", 1, 4)
            assert client["peer"].startswith("127.0.0.1:") and client["last_pull_ms"] >= client["first_pull_ms"]

            # Two acked through submit: two left in flight.
            acked = [m.offset for m in response.messages[:2]]
            context = Context(groupId="g", topic="t", qid=response.context.qid)
            assert await thrift.submit(ConsumeResult(context=context, successOffsets=acked))
            body = (await api.call("GET", "/admin/groups/g/clients"))[1]
            assert body["clients"][0]["in_flight"] == 2

            # An HTTP client: the User-Agent names it.
            batch = await pull(api, max_batch=10)
            assert len(batch["messages"]) == 2
            body = (await api.call("GET", "/admin/groups/g/clients"))[1]
            by_protocol: dict[str, Any] = {c["protocol"]: c for c in body["clients"]}
            assert by_protocol["http"]["in_flight"] == 2 and "aiohttp" in (by_protocol["http"]["version"] or "")
            assert body["clients"][0]["protocol"] == "http"  # the latest pull first
            offsets = [m["offset"] for m in batch["messages"]]
            status, _ = await api.call("POST", "/v1/ack", json={"group": "g", "results": [
                {"topic": "t", "qid": batch["qid"], "success": offsets}]})
            assert status == 200
            body = (await api.call("GET", "/admin/groups/g/clients"))[1]
            assert {c["protocol"]: c["in_flight"] for c in body["clients"]} == {"thrift": 2, "http": 0}
        status, error = await api.call("GET", "/admin/groups/nope/clients")
        assert (status, error["code"]) == (404, 1001)


def test_the_tracker_forgets_past_deadlines_and_stays_bounded() -> None:
    now = [1_000_000]
    tracker = ClientTracker(lambda group, topic: 100, clock_ms=lambda: now[0])
    messages = [StoredMessage(offset, b"v", "k", "", {}, 0) for offset in (1, 2, 3)]
    tracker.pulled("thrift", "p:1", "g", "x" * 500, PullBatch(QueueId("t", 0), messages))
    (client,) = tracker.clients("g")
    assert client.in_flight == 3 and client.version == "x" * 100
    # Delivered again to another client after its deadline: the first one holds it no more.
    now[0] += 150
    tracker.pulled("thrift", "p:2", "g", None, PullBatch(QueueId("t", 0), messages[:1]))
    assert {c.peer: c.in_flight for c in tracker.clients("g")} == {"p:1": 0, "p:2": 1}
    tracker.answered([QueueResult("g", "t", "0", [1], [])])
    assert {c.peer: c.in_flight for c in tracker.clients("g")} == {"p:1": 0, "p:2": 0}
    for index in range(MAX_CLIENTS + 50):
        tracker.pulled("http", f"h:{index}", "g", None, PullBatch(None, []))
    assert len(tracker.clients("g")) == MAX_CLIENTS
    assert tracker.clients("other") == []


def test_a_forgotten_client_and_odd_results_leave_the_counts_right() -> None:
    now = [1_000_000]
    tracker = ClientTracker(lambda group, topic: 100, clock_ms=lambda: now[0])
    messages = [StoredMessage(offset, b"v", "k", "", {}, 0) for offset in (1, 2, 3)]
    tracker.pulled("thrift", "first", "g", None, PullBatch(QueueId("t", 0), messages))
    for index in range(MAX_CLIENTS):  # the first client is the longest idle: forgotten
        now[0] += 1
        tracker.pulled("http", f"h:{index}", "g", None, PullBatch(None, []))
    assert "first" not in {c.peer for c in tracker.clients("g")}
    # What it held goes to the client it is delivered to next, and results count against that one.
    tracker.pulled("thrift", "second", "g", None, PullBatch(QueueId("t", 0), messages[:2]))
    held = {c.peer: c.in_flight for c in tracker.clients("g") if c.in_flight}
    assert held == {"second": 2}
    # qids that are not plain ASCII digits (the superscript two is a digit to str.isdigit) are ignored
    tracker.answered([QueueResult("g", "t", "\u00b2", [1], []), QueueResult("g", "t", "0", [1, 9], [2])])
    assert {c.peer: c.in_flight for c in tracker.clients("g") if c.in_flight} == {}
    now[0] += 200  # offset 3, still with the forgotten client, falls due: nothing is left held
    assert sum(c.in_flight for c in tracker.clients("g")) == 0 and tracker._held == {}
