"""IdleWatcher over real Redis: many idle streams watched by a few blocking reads, waking exactly the
waiters whose streams got an entry after their id, newcomers and leavers taken into account at once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.store.idle_watch import IdleWatcher

#: Longer than any test may take: a waiter that is only seen once a call's block ends fails the test.
LONG_BLOCK_MS = 600_000


@pytest.fixture
async def watcher(redis_client: aioredis.Redis) -> AsyncIterator[IdleWatcher]:
    watcher = IdleWatcher(redis_client, block_ms=LONG_BLOCK_MS, chunk=16)
    try:
        yield watcher
    finally:
        await watcher.close()


def stream(n: int) -> str:
    return f"ddmq:{{w:{n}}}:q"


async def until_blocked(redis: aioredis.Redis, clients: int) -> None:
    """Until Redis counts ``clients`` clients blocked (in a watching XREAD); the test's timeout says if never."""
    while int((await redis.info("clients"))["blocked_clients"]) != clients:  # noqa: ASYNC110 (Redis's state)
        await asyncio.sleep(0.005)


async def until(condition: Callable[[], bool]) -> None:
    """Until ``condition()``; the test's timeout says if it never is."""
    while not condition():  # noqa: ASYNC110 (the watcher's state, no event to wait on)
        await asyncio.sleep(0.005)


async def test_many_idle_streams_share_a_few_reads_and_only_the_ones_written_wake(
    redis_client: aioredis.Redis, watcher: IdleWatcher
) -> None:
    for n in range(100):
        await redis_client.xadd(stream(n), {"v": "old"}, id="0-1")
    waits = {n: asyncio.create_task(watcher.wait(stream(n), 1)) for n in range(100)}
    await until(lambda: watcher.streams == 100)
    # 100 streams in chunks of 16: 7 blocking reads, not 100.
    assert watcher.connections == 7
    await until_blocked(redis_client, 7)
    written = set(random.Random(7).sample(range(100), 23))
    for n in sorted(written):
        await redis_client.xadd(stream(n), {"v": "new"}, id="0-2")
    await asyncio.wait([waits[n] for n in written])
    await asyncio.sleep(0.05)  # a stream woken by mistake would be done by now too
    assert {n for n, task in waits.items() if task.done()} == written
    assert all(waits[n].result() is None for n in written)
    assert watcher.streams == 100 - 23
    for task in waits.values():
        task.cancel()
    await asyncio.gather(*waits.values(), return_exceptions=True)
    # every waiter left: the calls are ended at once (their block is ten minutes), the connections freed
    await until(lambda: watcher.connections == 0)
    await until_blocked(redis_client, 0)


async def test_an_entry_written_before_the_wait_began_is_not_missed(
    redis_client: aioredis.Redis, watcher: IdleWatcher
) -> None:
    # The reader read up to 0-3 and found nothing more; 0-4 arrives before it waits: the id, not "$".
    await redis_client.xadd(stream(1), {"v": "x"}, id="0-3")
    await redis_client.xadd(stream(1), {"v": "y"}, id="0-4")
    await watcher.wait(stream(1), 3)


async def test_a_stream_that_starts_waiting_while_a_read_is_in_flight_is_watched_at_once(
    redis_client: aioredis.Redis, watcher: IdleWatcher
) -> None:
    first = asyncio.create_task(watcher.wait(stream(1), 0))
    await until_blocked(redis_client, 1)
    calls = watcher.calls
    # Same chunk, a call already blocking for ten minutes: the newcomer must interrupt it.
    second = asyncio.create_task(watcher.wait(stream(2), 0))
    await until(lambda: watcher.calls > calls)
    await redis_client.xadd(stream(2), {"v": "x"}, id="0-1")
    await second
    assert not first.done()
    # A second waiter on the first one's stream, further on (another group's reader): the call in flight
    # already covers it (it names the lower id), and an entry past both wakes both.
    calls = watcher.calls
    ahead = asyncio.create_task(watcher.wait(stream(1), 4))
    await asyncio.sleep(0)
    assert watcher.calls == calls
    await redis_client.xadd(stream(1), {"v": "x"}, id="0-5")
    await asyncio.gather(first, ahead)


async def test_two_waiters_of_one_stream_wake_together_and_a_cancelled_one_leaves_quietly(
    redis_client: aioredis.Redis, watcher: IdleWatcher
) -> None:
    a = asyncio.create_task(watcher.wait(stream(1), 0))
    b = asyncio.create_task(watcher.wait(stream(1), 0))
    c = asyncio.create_task(watcher.wait(stream(1), 0))
    await until_blocked(redis_client, 1)
    c.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c
    assert watcher.streams == 1
    await redis_client.xadd(stream(1), {"v": "x"}, id="0-1")
    await asyncio.gather(a, b)
    assert watcher.streams == 0


async def test_a_lost_connection_fails_the_waiters_and_the_next_wait_watches_again(
    redis_client: aioredis.Redis, watcher: IdleWatcher
) -> None:
    waits = [asyncio.create_task(watcher.wait(stream(n), 0)) for n in range(3)]
    await until_blocked(redis_client, 1)
    # The watcher's connection is the one blocked in XREAD: kill it as a Redis restart would.
    clients = await redis_client.client_list()
    killed = [c["id"] for c in clients if c.get("cmd") == "xread"]
    assert len(killed) == 1
    await redis_client.client_kill_filter(_id=killed[0])
    for task in waits:
        with pytest.raises(BrokerError):
            await task
    assert watcher.streams == 0 and watcher.connections == 0
    again = asyncio.create_task(watcher.wait(stream(0), 0))
    await until_blocked(redis_client, 1)
    await redis_client.xadd(stream(0), {"v": "x"}, id="0-1")
    await again


async def test_closing_fails_the_waiters_left(redis_client: aioredis.Redis) -> None:
    watcher = IdleWatcher(redis_client, block_ms=LONG_BLOCK_MS)
    waiting = asyncio.create_task(watcher.wait(stream(1), 0))
    await until_blocked(redis_client, 1)
    await watcher.close()
    with pytest.raises(BrokerError):
        await waiting
    with pytest.raises(BrokerError):
        await watcher.wait(stream(1), 0)
    await until_blocked(redis_client, 0)


def test_nonsense_settings_are_refused(redis_client: aioredis.Redis) -> None:
    with pytest.raises(ValueError, match="positive"):
        IdleWatcher(redis_client, chunk=0)
