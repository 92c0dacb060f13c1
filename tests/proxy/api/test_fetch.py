"""The low-level fetch/ack API end to end: a real proxy, real Redis, the real Thrift client.

Read a queue from an offset in pages, ack, restart the proxy, continue from the acked offset; every
produced message is read exactly once, in offset order per queue. Bad requests get clear errors.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from ddmq.client.thrift_client import AsyncProxyClient, RemoteApplicationError
from ddmq.protocol.produce.producer import AsyncProducer, OutgoingMessage
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.pauses import pause_async, resume_async
from ddmq.protocol.redis.stream_entry import REPLAY_GROUP
from ddmq.protocol.wire import AckResult, ConsumeStatsRequest, FetchRequest, FetchResponse
from ddmq.proxy.api.fetch import MAX_FETCH_BYTES
from ddmq.proxy.core.types import QueueResult

from ...support import until
from ..conftest import running_proxy

QUEUES = 4


async def produce(redis_url: str, count: int, start: int = 0) -> dict[int, list[bytes]]:
    """``count`` keyed messages; returns the values per qid in produce order."""
    async with AsyncProducer(redis_url) as producer:
        await producer.ensure_topic("t", QUEUES)
        results = await producer.send_batch(
            "t", [OutgoingMessage(f"m{i}", key=f"k{i % 50}") for i in range(start, start + count)]
        )
    by_qid: dict[int, list[bytes]] = {}
    for i, result in zip(range(start, start + count), results, strict=True):
        by_qid.setdefault(result.qid, []).append(f"m{i}".encode())
    return by_qid


def request(offsets: dict[str, dict[str, int]] | None, batch: int | None = 10, linger_ms: int = 0) -> FetchRequest:
    return FetchRequest(
        consumerId="c1", groupId="g", cluster="local", fetchOffset=offsets, maxBatchSize=batch, maxLingerTime=linger_ms
    )


async def drain(client: AsyncProxyClient, positions: dict[str, int], seen: dict[int, list[tuple[int, bytes]]]) -> int:
    """Fetch pages from ``positions`` (qid -> offset, advanced in place) until every queue is empty."""
    pages = 0
    while True:
        response: FetchResponse = await client.fetch(request({"t": dict(positions)}))
        assert response.code == 0
        got = 0
        for page in response.results:
            assert page.topic == "t"
            offsets = [m.offset for m in page.messages]
            assert offsets == list(range(positions[page.qid], positions[page.qid] + len(offsets)))
            assert len(offsets) <= 10
            seen.setdefault(int(page.qid), []).extend((m.offset, m.value) for m in page.messages)
            positions[page.qid] = page.nextRequestOffset
            got += len(offsets)
        if not got:
            return pages
        pages += 1


async def page_through(port: int) -> tuple[list[bytes], int]:
    """Queue 0 of ``t`` in pages of 2 from offset 1 until a page moves no further: the values, and the
    offset it stopped at."""
    values: list[bytes] = []
    position = 1
    async with AsyncProxyClient("127.0.0.1", port) as proxy:
        for _ in range(10):
            response = await proxy.fetch(request({"t": {"0": position}}, batch=2))
            (page,) = response.results
            values += [m.value for m in page.messages]
            if page.nextRequestOffset == position:
                break
            position = page.nextRequestOffset
    return values, position


async def test_fetch_in_pages_ack_restart_and_continue(redis_url: str) -> None:
    produced = await produce(redis_url, 300)
    seen: dict[int, list[tuple[int, bytes]]] = {}
    async with running_proxy(redis_url, queues=QUEUES) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            # Nothing stored yet: -1 means "from the stored position", which defaults to the first offset.
            first = await client.fetch(request(None, batch=0))
            assert sorted((p.topic, p.qid, p.nextRequestOffset, len(p.messages)) for p in first.results) == [
                ("t", str(q), 1, 0) for q in range(QUEUES)
            ]
            # Read the first 20 of every queue (two pages), then ack where we stopped.
            positions = {str(q): 1 for q in range(QUEUES)}
            for _ in range(2):
                response = await client.fetch(request({"t": dict(positions)}))
                for page in response.results:
                    seen.setdefault(int(page.qid), []).extend((m.offset, m.value) for m in page.messages)
                    positions[page.qid] = page.nextRequestOffset
            assert all(offset == 21 for offset in positions.values())
            assert await client.ack(AckResult(consumerId="c1", groupId="g", cluster="local", offsets={"t": positions}))
    # A new proxy process state: the stored positions survive in Redis.
    more = await produce(redis_url, 100, start=300)
    async with running_proxy(redis_url, queues=QUEUES, instance_id="another") as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            stored = await client.fetch(request({"t": {str(q): -1 for q in range(QUEUES)}}, batch=0))
            positions = {p.qid: p.nextRequestOffset for p in stored.results}
            assert positions == {str(q): 21 for q in range(QUEUES)}
            assert await drain(client, positions, seen) > 0
            # Long poll: a fetch past the end waits for the next message instead of spinning.
            waiting = asyncio.create_task(client.fetch(request({"t": dict(positions)}, linger_ms=10_000)))
            await asyncio.sleep(0.1)
            late = await produce(redis_url, 1, start=400)
            response = await waiting
            [(qid, [value])] = late.items()
            [page] = [p for p in response.results if p.messages]
            assert (int(page.qid), [m.value for m in page.messages]) == (qid, [value])
    for qid in range(QUEUES):
        expected = produced.get(qid, []) + more.get(qid, [])
        offsets = [offset for offset, _ in seen[qid]]
        assert offsets == list(range(1, len(expected) + 1)), f"queue {qid}: gaps or repeats"
        assert [value for _, value in seen[qid]] == expected, f"queue {qid}: not the produced messages in order"


async def test_fetch_does_not_disturb_the_ordered_pull_path(redis_url: str) -> None:
    await produce(redis_url, 40)
    async with running_proxy(redis_url, queues=QUEUES) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            await client.fetch(request(None, batch=100))
            await client.ack(AckResult(consumerId="c", groupId="g", cluster="x", offsets={"t": {"0": 5}}))
        delivered: list[bytes] = []
        results: list[QueueResult] = []
        while len(delivered) < 40:
            batch = await service.api.pull("g", "t", 64, 2000, results)
            assert batch.queue is not None, "the pull path lost messages after fetch/ack"
            delivered += [m.value for m in batch.messages]
            results = [QueueResult("g", "t", str(batch.queue.qid), [m.offset for m in batch.messages], [])]
        await service.api.submit(results)
        assert sorted(delivered) == sorted(f"m{i}".encode() for i in range(40))


@pytest.mark.parametrize(
    ("fetch_offsets", "batch", "code", "words"),
    [
        ({"nope": {"0": 1}}, 10, 1002, "does not consume topic 'nope'"),
        ({"t": {"9": 1}}, 10, 1003, "qid 9 is outside 0..3"),
        ({"t": {"x": 1}}, 10, 1003, "qid 'x' is not a number"),
        ({"t": {"0": -5}}, 10, 1003, "offset -5 must be >= -1"),
        ({"t": {}}, 10, 1003, "names no queue"),
        ({"t": {"0": 1}}, -1, 1003, "maxBatchSize must be within"),
        ({"t": {"0": 1}}, 10_001, 1003, "maxBatchSize must be within"),
    ],
)
async def test_bad_fetches_get_clear_errors_and_the_proxy_keeps_going(
    redis_url: str, fetch_offsets: dict[str, dict[str, int]], batch: int, code: int, words: str
) -> None:
    await produce(redis_url, 8)
    async with running_proxy(redis_url, queues=QUEUES) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            with pytest.raises(RemoteApplicationError) as error:
                await client.fetch(request(fetch_offsets, batch=batch))
            assert error.value.code == code
            assert words in error.value.message
            with pytest.raises(RemoteApplicationError) as error:
                await client.fetch(FetchRequest(consumerId="c", groupId="nobody", cluster="x"))
            assert error.value.code == 1001
            with pytest.raises(RemoteApplicationError) as error:
                await client.ack(AckResult(consumerId="c", groupId="g", cluster="x", offsets={"t": {"0": -1}}))
            assert error.value.code == 1003
            # The same connection still serves good requests.
            response = await client.fetch(request(None, batch=100))
            assert sum(len(p.messages) for p in response.results) == 8


async def test_a_page_stops_at_the_byte_budget_and_continues_where_it_stopped(redis_url: str) -> None:
    big = b"x" * (MAX_FETCH_BYTES // 2)
    async with AsyncProducer(redis_url) as producer:
        await producer.ensure_topic("t", QUEUES)
        for i in range(3):
            await producer.send("t", big + str(i).encode(), qid=1)
    async with running_proxy(redis_url, queues=QUEUES) as service:
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            first = await client.fetch(request({"t": {"1": 1}}))
            [page] = first.results
            assert [m.offset for m in page.messages] == [1, 2] and page.nextRequestOffset == 3
            second = await client.fetch(request({"t": {"1": page.nextRequestOffset}}))
            assert [m.value[-1:] for m in second.results[0].messages] == [b"2"]


async def test_consume_stats_name_each_queue_owner_and_lease(redis_url: str) -> None:
    await produce(redis_url, 20)
    async with running_proxy(redis_url, queues=QUEUES, instance_id="proxy-a") as service:
        consumer = service.groups["g"].consumers["t"]
        async with asyncio.timeout(10):
            while len(consumer.held) < QUEUES:  # noqa: ASYNC110 (test-side wait for the lease loop)
                await asyncio.sleep(0.02)
        assert service.thrift_port is not None
        async with AsyncProxyClient("127.0.0.1", service.thrift_port) as client:
            [stats] = await client.get_consume_stats(ConsumeStatsRequest(group="g"))
        qids = {str(q) for q in range(QUEUES)}
        assert stats.owners == dict.fromkeys(qids, "proxy-a")
        assert stats.leaseTerms == {str(q): lease.term for q, lease in consumer.held.items()}
        assert set(stats.leaseTtlMs) == qids
        assert all(0 < ttl <= service.config.leases.ttl_ms for ttl in stats.leaseTtlMs.values())
        assert sum(stats.produceOffsets.values()) == 20 + QUEUES  # next offsets; each queue starts at 1


async def test_fetch_leaves_foreign_entries_out_and_moves_past_them(redis_url: str) -> None:
    """Entries written around the producer (next id without its fields, a gap, an automatic id) are
    not returned, and ``nextRequestOffset`` moves past them: a fetch never sticks on one."""
    async with running_proxy(redis_url, queues=1) as service:
        assert service.thrift_port is not None
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [OutgoingMessage(f"a{i}", qid=0) for i in range(3)])
            client = aioredis.Redis.from_url(redis_url)
            await client.xadd(keys.stream("t", 0), {"x": "next id"}, id="0-4")
            await client.xadd(keys.stream("t", 0), {"x": "gap"}, id="0-9")
            await client.xadd(keys.stream("t", 0), {"x": "auto id"})
            await client.aclose()
            await producer.send_batch("t", [OutgoingMessage(f"b{i}", qid=0) for i in range(3)])
        values, position = await page_through(service.thrift_port)
        assert values == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
        assert position == 14  # after 0-10, the renumbered automatic id, and b0..b2 at 0-11..0-13


async def test_fetch_leaves_other_groups_replays_out_and_moves_past_them(redis_url: str) -> None:
    """A dead letter replayed for another group is not this group's: never returned, and pages continue
    past it, also when a whole page holds nothing else."""
    for_other, for_g = {REPLAY_GROUP: "other"}, {REPLAY_GROUP: "g"}
    sent = [("a0", None), ("x0", for_other), ("x1", for_other), ("x2", for_other), ("a1", for_g), ("x3", for_other),
            ("a2", {"traceparent": "00-1-2-01"}), ("x4", for_other)]
    async with running_proxy(redis_url, queues=1) as service:
        assert service.thrift_port is not None
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [OutgoingMessage(v, qid=0, properties=p) for v, p in sent])
        values, position = await page_through(service.thrift_port)
        assert values == [b"a0", b"a1", b"a2"]
        assert position == len(sent) + 1


async def test_a_paused_topic_answers_no_messages_and_keeps_its_positions(redis_url: str) -> None:
    """An operator's pause holds the low-level fetch as it holds pulls; the resume serves from where it was."""
    await produce(redis_url, 40)
    async with running_proxy(redis_url, queues=QUEUES, leases={"claim_interval_ms": 50}) as service:
        assert service.thrift_port is not None
        watch = service.groups["g"].pause_watch
        client = aioredis.Redis.from_url(redis_url)
        try:
            await pause_async(client, "g", "t", "alice")
            await until("the proxy follows the pause", lambda: bool(watch.pauses), 30)
            async with AsyncProxyClient("127.0.0.1", service.thrift_port) as proxy:
                positions = {str(q): 1 for q in range(QUEUES)}
                loop = asyncio.get_running_loop()
                started = loop.time()
                held = await proxy.fetch(request({"t": positions}, linger_ms=200))
                assert loop.time() - started >= 0.2  # it lingered, as a pull of a paused topic does
                assert sorted((p.qid, p.nextRequestOffset, len(p.messages)) for p in held.results) == [
                    (str(q), 1, 0) for q in range(QUEUES)]
                await resume_async(client, "g", "t")
                await until("the proxy follows the resume", lambda: watch.pauses == [], 30)
                seen: dict[int, list[tuple[int, bytes]]] = {}
                await drain(proxy, positions, seen)
        finally:
            await client.aclose()
    assert sum(map(len, seen.values())) == 40
