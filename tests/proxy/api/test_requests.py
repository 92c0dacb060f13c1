"""The request rules (ddmq.proxy.api.requests) as pure logic; tests/system/test_adapters.py runs them over the wire."""

from __future__ import annotations

import pytest

from ddmq.proxy.api.requests import DEFAULT_LINGER_MS, RequestRules, batch_size, per_key
from ddmq.proxy.api.results import in_group, result_offsets
from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS
from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.core.types import QueueResult


@pytest.mark.parametrize(
    ("asked", "bound", "expected"),
    [
        (None, 5000, DEFAULT_LINGER_MS),
        (None, 300, 300),  # the default stays within the server's bound
        (0, 5000, 0),
        (4999, 5000, 4999),
        (10**9, 5000, 5000),
    ],
)
def test_linger_default_and_bounds(asked: int | None, bound: int, expected: int) -> None:
    assert RequestRules(bound).linger(asked) == expected


@pytest.mark.parametrize(("asked", "expected"), [(None, 64), (0, 64), (1, 1), (63, 63), (64, 64), (10_000, 64)])
def test_batch_size(asked: int | None, expected: int) -> None:
    assert batch_size(asked, 64) == expected


@pytest.mark.parametrize(("asked", "expected"), [(None, 1), (0, 1), (1, 1), (5, 5)])
def test_per_key(asked: int | None, expected: int) -> None:
    assert per_key(asked) == expected


def test_negative_batch_per_key_and_linger_are_refused() -> None:
    with pytest.raises(BadRequestError, match="maxBatchSize"):
        batch_size(-1, 64)
    with pytest.raises(BadRequestError, match="maxPerKey"):
        per_key(-1)
    with pytest.raises(BadRequestError, match="maxLingerTime"):
        RequestRules(5000).linger(-5)


def test_result_offsets_limit() -> None:
    half = MAX_RESULT_OFFSETS // 2
    fits = [QueueResult("g", "t", "0", list(range(1, half + 1)), list(range(1, MAX_RESULT_OFFSETS - half + 1)))]
    assert result_offsets(fits) == MAX_RESULT_OFFSETS
    over = [*fits, QueueResult("g", "t", "1", [], [1])]
    with pytest.raises(BadRequestError, match=str(MAX_RESULT_OFFSETS + 1)):
        result_offsets(over)


def test_a_result_without_group_is_the_requests() -> None:
    results = [QueueResult("", "t", "0", [1], []), QueueResult("other", "t", "0", [2], [])]
    assert in_group(results, "g") == [QueueResult("g", "t", "0", [1], []), QueueResult("other", "t", "0", [2], [])]
    assert in_group(results, None) == results
