"""QueueReader on its own consumer (no service) over real Redis: it reads its queue in offset order,
never past its consumer's room, and reads nothing once its lease is no longer confirmed."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from ddmq.config.schema import TopicGroupConfig
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.cluster.audit import ReadAudit
from ddmq.proxy.core.supervise import RESTARTS
from ddmq.proxy.engine.reader import READ_BLOCK_MS, QueueReader

from ...support import OrderChecker
from ..consumers import Proxy, consume_all, deliver, produce


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[ReadAudit]:
    """The read audit: one line per read batch (its first and last offsets, the reader's lease term)."""
    audit = ReadAudit(tmp_path / "reads.jsonl", "test")
    try:
        yield audit
    finally:
        audit.close()


def reads(audit: ReadAudit) -> list[dict[str, int]]:
    audit.close()
    return [json.loads(line) for line in audit.path.read_text().splitlines()]


async def test_a_reader_reads_its_queue_in_offset_order_within_the_consumers_room(
    redis_url: str, redis_client: aioredis.Redis, audit: ReadAudit
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i % 6}" for i in range(120)], qid=0)
    checker = OrderChecker()
    # Reads of at most 3, at most 5 unfinished: the queue takes dozens of reads, each sized to the room.
    async with Proxy(redis_client, "p1", TopicGroupConfig(concurrency=5, read_batch_size=3), audit) as proxy:
        await consume_all([(proxy, 0)], checker, produced, concurrency=5)
        assert proxy.consumer.counters["read"] == 120
    batches = reads(audit)
    assert len(batches) >= 120 // 3
    assert all(r["last"] - r["first"] < 3 for r in batches)
    # Contiguous and in order: every read starts right after the previous one, from offset 1 to 120.
    assert [r["first"] for r in batches] == [1] + [r["last"] + 1 for r in batches[:-1]]
    assert batches[-1]["last"] == 120
    assert checker.violations == [] and checker.missing(produced) == {}


async def test_a_reader_reads_nothing_after_its_lease_lapses(
    redis_url: str, redis_client: aioredis.Redis, audit: ReadAudit
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i % 5}" for i in range(40)], qid=0)
    checker = OrderChecker()
    # "p2" is the first owner; "p1" sorts first, so it keeps the queue once both are members again.
    async with Proxy(redis_client, "p2", TopicGroupConfig(read_batch_size=10), audit) as old:
        await old.wait_held({0})
        acked = 0
        while acked < 10:
            batch = await old.pull(2)
            if not batch.messages:
                await asyncio.sleep(0.01)  # the reader is still reading
                continue
            deliver(old, batch, checker, epoch=0)
            acked += len(batch.messages)
        await old.consumer.commits.flush()
        old_term = old.consumer.held[0].term
        # Its lease loop stalls: no renewal, so the lease lapses while the reader and the clients go on.
        old.membership.stall()
        async with asyncio.timeout(20):
            while old.consumer.jobs.may_serve(0):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        read_at_lapse = old.consumer.counters["read"]
        assert (await old.pull()).messages == []  # what it read but did not hand out stays with it
        await produce(redis_url, produced, [f"k{i % 5}" for i in range(40)], qid=0)
        async with Proxy(redis_client, "p1", audit=audit) as new:
            await new.wait_held({0})
            assert new.consumer.held[0].term > old_term
            await consume_all([(old, 0), (new, 1)], checker, produced)
            # The old reader saw the new messages in Redis but read none of them: not confirmed, it waits.
            assert old.consumer.counters["read"] == read_at_lapse
            assert (await old.pull()).messages == []
            assert old.consumer.unfinished == read_at_lapse - acked
            # Its lease loop wakes: the renewal is refused, it drops the queue and commits nothing more.
            old.membership.resume()
            async with asyncio.timeout(20):
                while old.consumer.held or old.consumer.owned.readers():  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
            assert old.consumer.unfinished == 0
            await new.consumer.commits.flush()
            await old.consumer.commits.flush()
            assert await new.broker.committed_offset("g", "t", 0) == 81
    terms = [r["term"] for r in reads(audit)]
    assert terms == sorted(terms) and set(terms) == {old_term, old_term + 1}  # one reader per term, in turn
    assert checker.violations == [] and checker.missing(produced) == {}


async def blocked_clients(redis: aioredis.Redis) -> int:
    return int((await redis.info("clients"))["blocked_clients"])


async def until_idle(proxy: Proxy, queues: int) -> None:
    """Until ``queues`` readers of ``proxy`` wait in its broker's idle watcher (after a whole empty block)."""
    watcher = proxy.broker.idle
    assert watcher is not None
    async with asyncio.timeout(20):
        while watcher.streams != queues:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


async def test_idle_queues_wait_in_one_read_and_messages_to_any_of_them_arrive_in_order(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    queues = 48
    await ensure_topic(redis_client, "t", queues)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    rng = random.Random(27)
    async with Proxy(redis_client, "p1", TopicGroupConfig(read_batch_size=4)) as proxy:
        await proxy.wait_held(set(range(queues)))
        for _ in range(3):
            await until_idle(proxy, queues)
            # 48 idle queues: one blocking read between them, none of their own (Redis may count another
            # proxy-wide blocking read or two, never one per queue).
            assert proxy.broker.idle is not None and proxy.broker.idle.connections == 1
            assert max([await blocked_clients(redis_client) for _ in range(20)]) < queues // 8
            for qid in rng.sample(range(queues), 11):
                await produce(redis_url, produced, [f"q{qid}-k{i % 3}" for i in range(9)], qid=qid)
            await consume_all([(proxy, 0)], checker, produced)
        await until_idle(proxy, queues)
    # Stopped while every reader waited in the watcher: they left it, and its read ended.
    assert proxy.broker.idle.streams == 0 and proxy.broker.idle.connections == 0
    async with asyncio.timeout(20):
        while await blocked_clients(redis_client):  # noqa: ASYNC110 (Redis frees a closed connection on its next turn)
            await asyncio.sleep(0.01)
    assert checker.violations == [] and checker.missing(produced) == {} and checker.duplicates == 0


async def test_a_queue_handed_off_while_idle_delivers_everything_once_in_order(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    queues = 8
    await ensure_topic(redis_client, "t", queues)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    keys = [f"k{i % 12}" for i in range(60)]
    async with Proxy(redis_client, "p2") as old:
        await old.wait_held(set(range(queues)))
        await produce(redis_url, produced, keys)
        await consume_all([(old, 0)], checker, produced)
        await old.consumer.commits.flush()
        await until_idle(old, queues)
        # "p1" sorts first: it takes queues 0-3 from "p2", whose readers of them are waiting idle.
        async with Proxy(redis_client, "p1") as new:
            await new.wait_held({0, 1, 2, 3})
            await old.wait_held({4, 5, 6, 7})
            await until_idle(old, 4)
            await produce(redis_url, produced, keys)
            await consume_all([(old, 0), (new, 0)], checker, produced)
    assert checker.violations == [] and checker.missing(produced) == {} and checker.duplicates == 0


async def test_idle_readers_whose_watch_fails_read_on_their_own_and_lose_nothing(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    queues = 6
    await ensure_topic(redis_client, "t", queues)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    keys = [f"k{i % 5}" for i in range(40)]
    async with Proxy(redis_client, "p1") as proxy:
        await proxy.wait_held(set(range(queues)))
        await until_idle(proxy, queues)
        # Kill the blocked reads (the idle watcher's, the key-command bell's) as a Redis restart would:
        # every reader's wait fails, and it checks its stream and blocks on it alone before going idle again.
        killed = [c["id"] for c in await redis_client.client_list() if c.get("cmd") == "xread"]
        assert killed
        for client_id in killed:
            await redis_client.client_kill_filter(_id=client_id)
        await produce(redis_url, produced, keys)
        await consume_all([(proxy, 0)], checker, produced)
        await until_idle(proxy, queues)
        await produce(redis_url, produced, keys)
        await consume_all([(proxy, 0)], checker, produced)
    assert checker.violations == [] and checker.missing(produced) == {} and checker.duplicates == 0


async def test_busy_readers_read_on_their_own_connection_and_a_killed_one_loses_nothing(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    queues = 4
    await ensure_topic(redis_client, "t", queues)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    keys = [f"k{i % 7}" for i in range(240)]
    config = TopicGroupConfig(concurrency=8, read_batch_size=4)  # many small reads per queue
    async with Proxy(redis_client, "p1", config) as proxy:
        await proxy.wait_held(set(range(queues)))
        await produce(redis_url, produced, keys)
        # The readers that read first fill the consumer's room; which ones, the race decides.
        async with asyncio.timeout(10):
            while not (linked := [r for r in proxy.consumer.owned.readers() if r._link.connection]):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        # Kill the readers' own connections mid-backlog (as a network fault would): each read on one fails,
        # the reader backs off, reads again on a new connection (checking its stream first) and goes on.
        for reader in linked:
            connection = reader._link.connection
            assert connection is not None and connection._writer is not None
            host, port = connection._writer.get_extra_info("sockname")[:2]
            assert await redis_client.client_kill_filter(addr=f"{host}:{port}", skipme=True) == 1
        await consume_all([(proxy, 0)], checker, produced, concurrency=8)
        # Idle again: the readers wait in the watcher and hold no connection of their own.
        await until_idle(proxy, queues)
        assert [reader._link.connection for reader in proxy.consumer.owned.readers()] == [None] * queues
    assert checker.violations == [] and checker.missing(produced) == {} and checker.duplicates == 0


async def test_readers_of_a_full_consumer_give_their_connection_back_after_a_block(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    queues = 3
    await ensure_topic(redis_client, "t", queues)
    produced: dict[str, int] = {}
    checker = OrderChecker()
    await produce(redis_url, produced, [f"k{i % 5}" for i in range(90)])
    async with Proxy(redis_client, "p1", TopicGroupConfig(concurrency=6, read_batch_size=2)) as proxy:
        await proxy.wait_held(set(range(queues)))
        async with asyncio.timeout(10):
            while proxy.consumer.unfinished < 6:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        # Nobody pulls: the readers wait for room, and after a whole block without it hold no connection.
        await asyncio.sleep(READ_BLOCK_MS / 1000 + 0.5)
        assert [reader._link.connection for reader in proxy.consumer.owned.readers()] == [None] * queues
        await consume_all([(proxy, 0)], checker, produced, concurrency=6)
    assert checker.violations == [] and checker.missing(produced) == {} and checker.duplicates == 0


def test_the_audit_notes_a_read_at_the_time_it_was_taken_under_the_lease(audit: ReadAudit) -> None:
    # The reader takes the time before it checks its lease, so a pause after the check (a SIGSTOP)
    # cannot date the read after the pause, under a term another proxy may hold by then.
    audit.record("g", "t", 0, 3, 1, 10, at=(1_700_000_000.25, 1_700_000_000.5))
    audit.record("g", "t", 0, 3, 11, 20)
    first, second = reads(audit)
    assert first["t"] == 1_700_000_000.25 and first["term"] == 3 and (first["first"], first["last"]) == (1, 10)
    assert first["rt"] == 1_700_000_000.5  # Redis's clock, as the proxy knows it
    assert second["t"] > first["t"]


async def test_a_reader_that_fails_unexpectedly_is_restarted_and_its_queue_delivered_in_order(
    redis_url: str, redis_client: aioredis.Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not Redis's failure (a bug, an error nobody mapped): the reader is restarted where its tracker
    stands, said once as a WARNING naming the queue, and counted; nothing is lost or reordered."""
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i % 7}" for i in range(200)], qid=0)
    restarts = RESTARTS["reader"]
    read = QueueReader._read
    calls = 0

    async def flaky(self: QueueReader, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls in (3, 4):  # twice in a row: the second restart waits longer
            raise ValueError("not a Redis error")
        return await read(self, *args)

    # The reader's own method (the broker's may be compiled, whose methods cannot be replaced).
    monkeypatch.setattr(QueueReader, "_read", flaky)
    checker = OrderChecker()
    async with Proxy(redis_client, "p1", TopicGroupConfig(concurrency=20, read_batch_size=10)) as proxy:
        await consume_all([(proxy, 0)], checker, produced)
    assert checker.violations == [] and checker.missing(produced) == {}
    assert RESTARTS["reader"] - restarts == 2
    said = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert len(said) == 2 and all(r.levelname == "WARNING" for r in said)
    assert "reader g/t#0" in said[0].getMessage() and "restarting" in said[0].getMessage()
