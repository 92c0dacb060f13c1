"""JSONPath checks that skip jsonpath-ng for plain paths, agree with it, and keep a config's parsed
paths (and its expressions) to a bound counted per file, whatever earlier loads left cached."""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonpath_ng.ext.parser import ExtendedJsonPathLexer
from jsonpath_ng.ext.parser import parse as reference_parse

from ddmq.config import load
from ddmq.config.errors import ConfigError
from ddmq.config.expression import compile_expression
from ddmq.config.jsonpath import _RESERVED, MAX_PARSED_PATHS, check_jsonpath, compile_jsonpath, parse_jsonpath
from ddmq.config.loader import MAX_PROBLEMS
from tests.config import shapes


def test_the_reserved_names_are_jsonpath_ngs_keywords() -> None:
    assert set(ExtendedJsonPathLexer.reserved_words) == _RESERVED


PATHS = [
    "$.a", "$.order.id", "$.items[0].sku", "$[0]", "$.a[0][12].b", "$.where", "$.a.wherenot", "$.a[0].where",
    "$.true", "$.null", "$.in", "$.a_b.C9", "$.a-b", "$.a[", "$.a[?(@.b > 1)].c", "$..x", "$.a[*]", "$.a[1:3]",
    "$.a.", "$a", "$.a[-1]",
]


@pytest.mark.parametrize("path", PATHS)
def test_the_checks_verdict_is_jsonpath_ngs(path: str) -> None:
    try:
        reference_parse(path)
        valid = True
    except Exception:
        valid = False
    try:
        check_jsonpath(path)
        checked = True
    except ValueError:
        checked = False
    assert checked == valid


def test_a_parsed_path_is_parsed_once_and_finds_what_jsonpath_ng_finds() -> None:
    path = "$.items[?(@.n == 2)].sku"
    assert parse_jsonpath(path) is parse_jsonpath(path)
    body = {"items": [{"n": 1, "sku": "a"}, {"n": 2, "sku": "b"}]}
    assert compile_jsonpath(path)(body) == "b" == reference_parse(path).find(body)[0].value
    with pytest.raises(ValueError, match="invalid JSONPath"):
        check_jsonpath("$.items[")
    assert compile_jsonpath("$.items[1].sku")(body) == "b"  # the parser still works after an error


def _filtered_paths(tmp_path: Path, count: int, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    lines = ["groups:"]
    for index in range(count):
        key = f"$.a[?(@.n == {index})].id"
        lines.append(f"  g{index}: {{t: {{actions: [Json, Order, PullServer], order_key: '{key}'}}}}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_config_may_hold_a_bounded_number_of_parsed_paths(tmp_path: Path) -> None:
    at_bound = _filtered_paths(tmp_path, MAX_PARSED_PATHS, "at")
    assert len(load(at_bound).groups) == MAX_PARSED_PATHS
    over = _filtered_paths(tmp_path, MAX_PARSED_PATHS + 1, "over")
    for _ in range(2):  # the second time every path is cached: the verdict is the file's, not the cache's
        with pytest.raises(ConfigError) as info:
            load(over)
        message = str(info.value)
        assert f"groups.g{MAX_PARSED_PATHS}.t.order_key" in message
        assert f"a config may hold at most {MAX_PARSED_PATHS} distinct JSONPaths beyond names and list" in message
    assert len(load(at_bound).groups) == MAX_PARSED_PATHS  # and the bound is per file


def test_a_cached_expression_still_counts_its_paths(tmp_path: Path) -> None:
    expression = " or ".join(f"$.a[?(@.n == {index})].b == 1" for index in range(MAX_PARSED_PATHS + 1))
    compile_expression(expression)  # cached outside any config: no bound
    path = tmp_path / "filter.yaml"
    topic = f"{{actions: [Json, Filter, PullServer], filter: {{expression: '{expression}'}}}}"
    path.write_text(f"groups: {{g: {{t: {topic}}}}}\n")
    with pytest.raises(ConfigError, match=r"groups\.g\.t\.filter\.expression: .*one JSONPath too many"):
        load(path)


def test_an_error_lists_a_bounded_number_of_problems(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("groups:\n" + "".join(f"  g{i}: {{t: {{timeout_ms: 0}}}}\n" for i in range(2_000)))
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert message.count("timeout_ms") == MAX_PROBLEMS
    assert message.endswith(f"; and {2_000 - MAX_PROBLEMS:,} more problems")
    assert len(message) < 4_000


@pytest.mark.parametrize("name", [name for name in shapes.SHAPES if name != "alias-bomb-9^9"])
def test_every_shape_near_the_size_bound_loads_or_is_refused_clearly(tmp_path: Path, name: str) -> None:
    path = tmp_path / (f"{name}.json" if "json" in name else f"{name}.yaml")
    path.write_text(shapes.SHAPES[name]())
    if name == "paths-filtered":  # thousands of distinct filtered paths: over the bound
        with pytest.raises(ConfigError, match=f"at most {MAX_PARSED_PATHS} distinct JSONPaths"):
            load(path)
        return
    assert load(path).groups


def test_an_error_quoting_long_expressions_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    expression = "$.a == 1 and $.b[" + "x" * 60_000  # unclosed: the message quotes the rest of the text
    topic = f"{{actions: [Json, Filter, PullServer], filter: {{expression: '{expression}'}}}}"
    path.write_text("groups:\n" + "".join(f"  g{i}: {{t: {topic}}}\n" for i in range(3)))
    with pytest.raises(ConfigError, match="unclosed") as info:
        load(path)
    assert len(str(info.value)) < 4_000 + 200
