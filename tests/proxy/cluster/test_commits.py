"""OffsetCommitter (cluster/commits.py) over real Redis and a real consumer: what it writes, what it
loads back, and how a fenced-off commit and a rollback change the queue's state; and the board of
committers the service's committer flushes."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from ddmq.config.schema import TopicGroupConfig
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.cluster.commits import CommitBoard
from ddmq.proxy.core.errors import BrokerError

from ...support import OrderChecker
from ..consumers import Proxy, consume_all, produce


async def test_a_commit_writes_the_first_unfinished_offset_and_only_when_it_moved(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i % 5}" for i in range(30)])
    checker = OrderChecker()
    async with Proxy(redis_client, "p1", TopicGroupConfig(concurrency=64)) as proxy:
        await proxy.wait_held({0})
        await consume_all([(proxy, 0)], checker, produced)
        commits = proxy.consumer.commits
        await commits.commit(0)
        assert await proxy.broker.committed_offset("g", "t", 0) == 31
        await redis_client.set(keys.committed("g", "t", 0), 7)  # as if written elsewhere
        await commits.commit(0)  # nothing moved since: no write
        assert await proxy.broker.committed_offset("g", "t", 0) == 7
    assert checker.violations == [] and checker.missing(produced) == {}


async def test_load_starts_at_the_commit_point_and_skips_what_was_finished_past_it(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    await produce(redis_url, {}, [f"k{i}" for i in range(10)])
    await redis_client.set(keys.committed("g", "t", 0), 4)
    await redis_client.set(keys.finished("g", "t", 0), "6-7,9")
    proxy = Proxy(redis_client, "p1")
    tracker = await proxy.consumer.commits.load(0)
    assert tracker.committed == 4 and tracker.commit_point == 4
    assert [offset for offset in range(4, 11) if not tracker.track(offset)] == [4, 5, 8, 10]


async def test_a_fenced_off_commit_drops_the_queue(redis_url: str, redis_client: aioredis.Redis) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, ["a", "b", "c"])
    async with Proxy(redis_client, "p1") as proxy:
        await proxy.wait_held({0})
        await consume_all([(proxy, 0)], OrderChecker(), produced)
        tracker = proxy.consumer.commits.tracker(0)
        assert tracker is not None
        await redis_client.incr(keys.lease_term("g", "t", 0))  # another proxy took the queue over
        await redis_client.set(keys.lease("g", "t", 0), "p2 99", px=60_000)
        await proxy.consumer.commits.commit(0)
        assert tracker.dropped and proxy.consumer.commits.tracker(0) is None and 0 not in proxy.consumer.held
        assert await proxy.broker.committed_offset("g", "t", 0) in (None, 1)  # nothing written


async def test_a_rollback_counts_drops_and_leaves_a_gap_for_the_next_reader(
    redis_url: str, redis_client: aioredis.Redis
) -> None:
    await ensure_topic(redis_client, "t", 1)
    produced: dict[str, int] = {}
    await produce(redis_url, produced, [f"k{i}" for i in range(5)])
    async with Proxy(redis_client, "p1") as proxy:
        await proxy.wait_held({0})
        await consume_all([(proxy, 0)], OrderChecker(), produced)
        tracker = proxy.consumer.commits.tracker(0)
        assert tracker is not None
        proxy.membership.stall()  # no reclaim meanwhile, so the gap stays to be looked at
        await proxy.consumer.commits.rolled_back(0, tracker)
        assert tracker.dropped and proxy.consumer.rollbacks == {0: 1}
        assert proxy.consumer.owned.take_gap(0) == 5
        assert int(await redis_client.get(keys.sequence("t", 0))) >= 5
        await proxy.consumer.commits.rolled_back(0, tracker)  # handled once
        assert proxy.consumer.rollbacks == {0: 1}


class _Committer:
    """A topic's committer as the board sees it: its group, whether it moved, its flush."""

    def __init__(self, group: str, moved: bool = True, fails: int = 0) -> None:
        self.group, self._moved, self.fails, self.flushes = group, moved, fails, 0

    def moved(self) -> bool:
        return self._moved

    async def flush(self) -> None:
        if self.fails:
            self.fails -= 1
            raise BrokerError("redis away")
        self.flushes += 1


async def test_the_board_flushes_what_moved_of_the_committers_on_it_and_says_a_failing_group_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    board = CommitBoard()
    a, idle, failing, gone = _Committer("a"), _Committer("a", moved=False), _Committer("b", fails=2), _Committer("c")
    for committer in (a, idle, failing, gone):
        board.join(committer)  # type: ignore[arg-type]
    board.leave(gone)  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="ddmq.proxy.cluster.commits"):
        for _ in range(3):
            await board.flush()
    assert (a.flushes, idle.flushes, failing.flushes, gone.flushes) == (3, 0, 1, 0)
    said = [(r.levelname, r.getMessage().split(":")[0]) for r in caplog.records]
    assert said == [
        ("WARNING", "committing offsets of group b failed"),
        ("DEBUG", "committing offsets of group b failed"),
        ("INFO", "committing offsets of group b again"),
    ]
