"""The Filter expression language: what it means, and that bad text fails at config load with its path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ddmq.config import load
from ddmq.config.expression import ExpressionError, compile_expression
from ddmq.config.jsonpath import MISSING

BODY: dict[str, Any] = {
    "amount": 120,
    "city": "gz",
    "tags": ["a", "b"],
    "vip": True,
    "zero": 0,
    "none": None,
    "order": {"id": "x-1", "lines": [{"price": 3}, {"price": 9}]},
    "odd key": "yes",
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$.amount >= 100 and not $.city in ['bj', 'sh']", True),
        ("$.amount > 200 or $.city == 'gz'", True),
        ("$.amount > 200 or $.city == 'bj'", False),
        ("not ($.amount > 200 or $.city == 'bj')", True),
        ("$.amount == 120.0", True),
        ("$.amount != 120", False),
        ("-5 < $.amount", True),
        ("1.2e2 <= $.amount", True),
        ("$.city < 'h'", True),
        ("$.amount > '100'", False),  # a number and a string do not compare
        ("$.vip == true", True),
        ("$.vip == 1", False),  # JSON true is not the number 1
        ("$.zero == false", False),
        ("$.none == null", True),
        ("$.absent == null", False),  # missing is not null
        ("$.absent != 1", False),  # every comparison with a missing value is false
        ("not $.absent", True),
        ("$.vip", True),
        ("$.zero", False),
        ("'a' in $.tags", True),
        ("'c' not in $.tags", True),
        ("'x-' in $.order.id", True),
        ("'id' in $.order", True),
        ("$.order.lines[1].price > 5", True),
        ("$.order.lines[?(@.price > 5)].price == 9", True),
        ("$['odd key'] == \"yes\"", True),
        ('$.city in ["gz", "sz"] and ($.vip or $.amount < 10)', True),
        ("$.tags == ['a', 'b']", True),  # lists compare element by element
        ("$.tags == ['b', 'a']", False),
    ],
)
def test_meaning(text: str, expected: bool) -> None:
    assert compile_expression(text)(BODY) is expected


def test_no_body_means_every_path_is_missing() -> None:
    assert compile_expression("$.a == 1 or $.b")(MISSING) is False
    assert compile_expression("not $.a")(MISSING) is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("$.a ==", "at the end: expected a JSONPath"),
        ("$.a = 1", "column 5: unexpected character '='"),
        ("amount > 1", "unknown word 'amount'"),
        ("__import__('os').system('true')", "unknown word '__import__'"),
        ("$.a > 1 and", "at the end"),
        ("($.a > 1", "expected ')'"),
        ("$.a in [1, $.b]", "expected a literal in the list"),
        ("$[[[ > 1", "unclosed '['"),
        ("'abc", "unexpected character"),
        ("$.a == 1 2", "column 10: expected 'and', 'or' or the end"),
    ],
)
def test_invalid_expressions_say_where(text: str, message: str) -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression(text)
    assert message in str(info.value)


def test_a_bad_filter_fails_the_config_with_the_field_path(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text("groups: {g: {t: {actions: [Json, Filter, Order, PullServer], filter: {expression: '$.a = 1'}}}}")
    with pytest.raises(Exception) as info:
        load(path)
    assert "groups.g.t.filter.expression" in str(info.value)
    assert "column 5" in str(info.value)
