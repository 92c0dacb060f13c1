"""The Json action's parse: the C scanner alone for a bare JSON value, json's own decode for anything
else, and the same value or the same error as ``json.loads`` either way."""

from __future__ import annotations

import json

import pytest

from ddmq.actions.json_action import _parse

TEXTS = [
    '{"k":"rider-7","seq":3,"ts":1764236400.5}',
    ' {"a":1}',  # whitespace around the value: decode()
    '{"a":1} \n',
    '[1,2]', '"x"', "1", "null", "NaN", "1e999",
    '{"a":1,"a":2}',  # the last of a repeated name
    '{"a":{"b":[1,2,{"c":null}]}}',
    "nul", '{"a":1}x', "", "  ", '{"a":', "[1,]", '"\\ud800"',
]


@pytest.mark.parametrize("text", TEXTS)
def test_parse_is_json_loads(text: str) -> None:
    try:
        expected: tuple[str, object] = ("value", json.loads(text))
    except ValueError as exc:
        expected = ("error", str(exc))
    try:
        got: tuple[str, object] = ("value", _parse(text))
    except ValueError as exc:
        got = ("error", str(exc))
    assert repr(got) == repr(expected)  # repr: NaN is not equal to itself
