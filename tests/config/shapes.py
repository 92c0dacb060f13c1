"""Config files of the shapes a check must read in bounded time, shared by tests/config and bench/edges.py:
the alias bomb, and files of ordinary content grown to just under the loader's size bound."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from ddmq.config.loader import MAX_FILE_BYTES

#: Just under the loader's MAX_FILE_BYTES, so every shape is read rather than refused unread.
NEAR_LIMIT = MAX_FILE_BYTES - 1024
ONE_LINE = "groups: {g: {t: {actions: [PullServer]}}}\n"


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs": ``a0`` is a string, each ``aN`` lists ``a(N-1)`` ``width`` times (9**9 leaves)."""
    lines = ["lol:", "  - &a0 lol"]
    for level in range(1, levels + 1):
        lines.append(f"  - &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n" + ONE_LINE


def _grow(parts: Callable[[int], Iterator[str]], head: str, limit: int) -> str:
    chunks, size = [head], len(head)
    for chunk in parts(0):
        if size + len(chunk) > limit:
            break
        chunks.append(chunk)
        size += len(chunk)
    return "".join(chunks)


def _group_entries(start: int) -> Iterator[str]:
    index = start
    while True:
        yield (
            f"  g{index}:\n"
            f"    rides:\n"
            f"      actions: [Json, Order, PullServer]\n"
            f"      order_key: $.order.id\n"
            f"      timeout_ms: {5000 + index % 100}\n"
            f"      retry_intervals_ms: [100, 1000]\n"
            f"      tags: [a, b{index % 7}]\n"
            f"    payments:\n"
            f"      actions: [PullServer]\n"
            f"      max_retry: {index % 9}\n"
        )
        index += 1


def many_groups_yaml(limit: int = NEAR_LIMIT) -> str:
    """Thousands of groups of two topics each, block style: a big ordinary config."""
    return _grow(_group_entries, "topics: {rides: {queues: 16}, payments: {queues: 8}}\ngroups:\n", limit)


def many_groups_json(limit: int = NEAR_LIMIT) -> str:
    """The groups of :func:`many_groups_yaml` as one JSON object (one group a line), up to ``limit`` bytes."""
    lines = []
    size = 64
    index = 0
    while True:
        group: dict[str, Any] = {
            "rides": {"actions": ["Json", "Order", "PullServer"], "order_key": "$.order.id",
                      "timeout_ms": 5000 + index % 100, "retry_intervals_ms": [100, 1000],
                      "tags": ["a", f"b{index % 7}"]},
            "payments": {"actions": ["PullServer"], "max_retry": index % 9},
        }
        line = f"{json.dumps(f'g{index}')}: {json.dumps(group)}"
        if size + len(line) + 2 > limit:
            break
        lines.append(line)
        size += len(line) + 2
        index += 1
    return '{"topics": {"rides": {"queues": 16}}, "groups": {\n' + ",\n".join(lines) + "\n}}\n"


def _filter_entries(start: int, clauses: int, bracketed: bool) -> Iterator[str]:
    index = start
    while True:
        terms = []
        for clause in range(clauses):
            path = f"$.items[{clause}].price" if bracketed else f"$.f{clause}"
            terms.append(f"{path} >= {index}" if clause % 2 else f"{path} != 'c{index}-{clause}'")
        yield (
            f"  g{index}:\n"
            f"    t:\n"
            f"      actions: [Json, Filter, PullServer]\n"
            f"      filter:\n"
            f"        expression: \"{' and '.join(terms)}\"\n"
        )
        index += 1


def many_filters(limit: int = NEAR_LIMIT, clauses: int = 20, bracketed: bool = False) -> str:
    """Groups whose Filter expressions (``clauses`` comparisons each) all differ: no expression repeats.
    ``bracketed``: the paths index into lists (``$.items[3].price``), parsed by jsonpath-ng."""
    return _grow(lambda start: _filter_entries(start, clauses, bracketed), "groups:\n", limit)


def distinct_paths(limit: int = NEAR_LIMIT, plain: bool = False) -> str:
    """Groups whose order keys are all different JSONPaths, none repeated: with a filter each
    (``$.items[?(@.n == 7)].id``, parsed by jsonpath-ng), or ``plain`` (``$.items[7].id``)."""
    def entries(start: int) -> Iterator[str]:
        index = start
        while True:
            path = f"$.items[{index}].id" if plain else f"$.items[?(@.n == {index})].id"
            yield f"  g{index}: {{t: {{actions: [Json, Order, PullServer], order_key: '{path}'}}}}\n"
            index += 1

    return _grow(entries, "groups:\n", limit)


#: Every shape by name, as bench/edges.py's ``check`` mode lists them.
SHAPES: dict[str, Callable[[], str]] = {
    "one-line": lambda: ONE_LINE,
    "alias-bomb-9^9": alias_bomb,
    "groups-yaml": many_groups_yaml,
    "groups-json": many_groups_json,
    "filters": many_filters,
    "filters-indexed": lambda: many_filters(bracketed=True),
    "paths-indexed": lambda: distinct_paths(plain=True),
    "paths-filtered": distinct_paths,
}
