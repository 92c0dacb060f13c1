"""The Json action's parse: orjson where it gives json's value, the C scanner alone for a bare JSON
value, json's own decode for anything else; the same value or the same error as ``json.loads`` in
every case."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from ddmq.actions.json_action import FAST_LOADS, _parse, load_body

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


BODIES = [text.encode() for text in TEXTS] + [
    b'{"id":18446744073709551616}',  # past 64 bits: orjson would give a float, json an int
    b'{"id":-9223372036854775809,"k":"x"}',
    b'[[1,2],{"a":[123456789012345678901234567890]}]',  # nested
    b'{"id":18446744073709551615,"neg":-9223372036854775808}',  # the largest orjson keeps as ints
    b'{"big":1e19,"k":"x"}',  # a float that large is parsed again: the same value either way
    b'{"a":1.7976931348623157e308}', b'1e400', b'-Infinity',
    b'\xef\xbb\xbf{"a":1}',  # a UTF-8 BOM: json reads it, orjson does not
    '{"a":"é"}'.encode("utf-16"),  # json detects UTF-16
    b'"\xed\xa0\x80"', b'"\xff"', b'"a\x01b"', b'{"a":"\\ud83d\\ude00"}',
    b'[' * 900 + b']' * 900,
    b'[' * 1010 + b']' * 1010,  # orjson reads it, json does not: json's answer
    b'{"a":' * 200 + b"1" + b"}" * 200,
]


def _outcome(load: Callable[[], object]) -> tuple[str, object]:
    try:
        return ("value", load())
    except RecursionError:
        return ("error", "nested too deeply")
    except ValueError as exc:
        return ("error", str(exc))


@pytest.mark.parametrize("fast", [FAST_LOADS, None], ids=["orjson", "json"])
@pytest.mark.parametrize("body", BODIES)
def test_load_body_is_json_loads(body: bytes, fast: Callable[[bytes], object] | None) -> None:
    """With orjson or without, the Json action reads what json.loads reads, with the same types
    (an integer stays an int however large), and refuses what it refuses with its message."""
    expected = _outcome(lambda: json.loads(body))
    got = _outcome(lambda: load_body(body, fast))
    assert got == expected or repr(got) == repr(expected)  # repr: NaN is not equal to itself
    if got[0] == "value":
        assert _types(got[1]) == _types(expected[1])


def _types(value: object) -> list[str]:
    """The type of every value inside ``value``, depth first (``==`` takes 1 for 1.0 and True)."""
    seen, pending = [], [value]
    while pending:
        item = pending.pop()
        seen.append(type(item).__name__)
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return seen


def test_orjson_is_what_runs_where_it_is_installed() -> None:
    """The project depends on orjson wherever its wheel installs, and the Json action uses it."""
    import orjson

    assert FAST_LOADS is orjson.loads
