"""ByteBudget: the cap on request bytes buffered at once across a server's connections."""

from __future__ import annotations

import asyncio

import pytest

from ddmq.proxy.servers.byte_budget import ByteBudget


async def _hold(budget: ByteBudget, size: int, order: list[int], release: asyncio.Event) -> None:
    async with budget.reserve(size):
        order.append(size)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_reservations_within_the_capacity_do_not_wait_and_give_their_bytes_back() -> None:
    budget = ByteBudget(100)
    async with budget.reserve(60), budget.reserve(40):
        assert budget.used == 100
    assert (budget.used, budget.waits) == (0, 0)


async def test_waiters_are_served_first_come_first_served() -> None:
    budget = ByteBudget(100)
    order: list[int] = []
    first, big, small = asyncio.Event(), asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(budget, 80, order, first))
    await _settle()
    waiting_big = asyncio.create_task(_hold(budget, 90, order, big))
    await _settle()
    # 10 bytes would fit next to the 80 held, but the 90-byte waiter came first
    waiting_small = asyncio.create_task(_hold(budget, 10, order, small))
    await _settle()
    assert order == [80] and budget.waits == 2
    first.set()
    await _settle()
    assert order == [80, 90, 10] and budget.used == 100
    big.set()
    small.set()
    await asyncio.gather(holder, waiting_big, waiting_small)
    assert budget.used == 0


@pytest.mark.both_loops
async def test_a_cancelled_waiter_lets_those_behind_it_in_and_leaks_nothing() -> None:
    budget = ByteBudget(100)
    order: list[int] = []
    held, small = asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_hold(budget, 50, order, held))
    await _settle()
    waiting_big = asyncio.create_task(_hold(budget, 100, order, asyncio.Event()))
    await _settle()
    waiting_small = asyncio.create_task(_hold(budget, 50, order, small))
    await _settle()
    assert order == [50]
    waiting_big.cancel()
    await _settle()
    assert order == [50, 50] and budget.used == 100
    with pytest.raises(asyncio.CancelledError):
        await waiting_big
    held.set()
    small.set()
    await asyncio.gather(holder, waiting_small)
    assert budget.used == 0


async def test_sizes_over_the_capacity_and_empty_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        ByteBudget(0)
    budget = ByteBudget(10)
    with pytest.raises(ValueError, match="exceed"):
        async with budget.reserve(11):
            pass
    assert budget.used == 0
