"""A small, safe boolean expression language over a JSON body (used by ``Filter`` and ``Redis``'s ``when``).

Nothing is evaluated as code: the text is tokenized and parsed here into closures over JSONPath getters.

Grammar (keywords are lower case)::

    expr     := and_expr ("or" and_expr)*
    and_expr := not_expr ("and" not_expr)*
    not_expr := "not" not_expr | compare
    compare  := operand [("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not" "in") operand]
    operand  := JSONPATH | NUMBER | STRING | "true" | "false" | "null" | list | "(" expr ")"
    list     := "[" [literal ("," literal)*] "]"

Meaning, chosen so that a message never makes the filter raise:

- a JSONPath that finds nothing is *missing*: it equals nothing (not even ``null``), and every
  comparison with it is false; alone, a path is true when it finds a value other than
  ``false``/``null``/``0``/``""``/``[]``/``{}``;
- ``==``/``!=`` compare JSON values (``1 == 1.0``; ``true`` is not ``1``);
- ``<``, ``<=``, ``>``, ``>=`` compare two numbers or two strings; other pairs are false;
- ``a in b``: ``b`` a list (element equal to ``a``), a string (``a`` a substring) or an object
  (``a`` a key); otherwise false.

>>> compile_expression("$.amount >= 100 and not $.city in ['bj', 'sh']")({"amount": 120, "city": "gz"})
True
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ddmq.config.jsonpath import MISSING, check_jsonpath, compile_jsonpath
from ddmq.protocol.errors import DdmqError

Predicate = Callable[[Any], bool]
_Getter = Callable[[Any], Any]


class ExpressionError(DdmqError, ValueError):
    """The expression text is invalid; the message gives the column and what was expected. Not
    retriable, as the config's errors."""

    retriable = False


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<number>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    """,
    re.VERBOSE,
)
_KEYWORDS = frozenset({"and", "or", "not", "in", "true", "false", "null"})
_PATH_NAME = re.compile(r"[\w\-*@]*")


class _Token:
    __slots__ = ("column", "kind", "text", "value")

    def __init__(self, kind: str, text: str, column: int, value: Any = None) -> None:
        self.kind = kind
        self.text = text
        self.column = column
        self.value = value


def _scan_path(text: str, start: int) -> int:
    """End of the JSONPath starting at ``text[start] == '$'``: names, dots, bracketed parts."""
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == ".":
            i += 1
            if i < len(text) and text[i] == ".":
                i += 1
            i = _PATH_NAME.match(text, i).end()  # type: ignore[union-attr]  # matches the empty string
        elif char == "[":
            depth, quote = 0, ""
            while i < len(text):
                char = text[i]
                if quote:
                    if char == "\\":
                        i += 1
                    elif char == quote:
                        quote = ""
                elif char in "'\"":
                    quote = char
                elif char == "[":
                    depth += 1
                elif char == "]":
                    depth -= 1
                    if depth == 0:
                        break
                i += 1
            if i >= len(text):
                raise ExpressionError(f"at column {start + 1}: unclosed '[' in JSONPath {text[start:]!r}")
            i += 1
        else:
            break
    return i


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "$":
            end = _scan_path(text, pos)
            path = text[pos:end]
            try:
                check_jsonpath(path)
            except ValueError as exc:
                raise ExpressionError(f"at column {pos + 1}: {exc}") from None
            tokens.append(_Token("path", path, pos + 1, compile_jsonpath(path)))
            pos = end
            continue
        match = _TOKEN.match(text, pos)
        if match is None:
            raise ExpressionError(f"at column {pos + 1}: unexpected character {text[pos]!r}")
        kind = match.lastgroup
        assert kind is not None
        word = match.group()
        if kind == "number":
            number = float(word)
            tokens.append(
                _Token(
                    "literal",
                    word,
                    pos + 1,
                    int(word) if number.is_integer() and "." not in word and "e" not in word.lower() else number,
                )
            )
        elif kind == "string":
            tokens.append(_Token("literal", word, pos + 1, _unquote(word, pos)))
        elif kind == "word":
            if word not in _KEYWORDS:
                raise ExpressionError(
                    f"at column {pos + 1}: unknown word {word!r} (JSONPaths start with '$', strings are quoted)"
                )
            if word in ("true", "false", "null"):
                tokens.append(_Token("literal", word, pos + 1, {"true": True, "false": False, "null": None}[word]))
            else:
                tokens.append(_Token("keyword", word, pos + 1))
        elif kind == "op":
            tokens.append(_Token("op", word, pos + 1))
        pos = match.end()
    return tokens


def _unquote(word: str, pos: int) -> str:
    body = word[1:-1]
    if word[0] == "'":  # single-quoted: turn into a JSON string
        body = body.replace("\\'", "'").replace('"', '\\"')
    try:
        value = json.loads(f'"{body}"')
    except ValueError as exc:
        raise ExpressionError(f"at column {pos + 1}: bad string {word}: {exc}") from None
    assert isinstance(value, str)
    return value


# semantics -------------------------------------------------------------------------------------


def _truthy(value: Any) -> bool:
    return value is not MISSING and bool(value)


def _equal(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return False
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _orderable(a: Any, b: Any) -> bool:
    return (_is_number(a) and _is_number(b)) or (isinstance(a, str) and isinstance(b, str))


def _contains(a: Any, b: Any) -> bool:
    if a is MISSING:
        return False
    if isinstance(b, list):
        return any(_equal(a, item) for item in b)
    if isinstance(b, str):
        return isinstance(a, str) and a in b
    if isinstance(b, dict):
        return isinstance(a, str) and a in b
    return False


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "==": _equal,
    "!=": lambda a, b: a is not MISSING and b is not MISSING and not _equal(a, b),
    "<": lambda a, b: _orderable(a, b) and a < b,
    "<=": lambda a, b: _orderable(a, b) and a <= b,
    ">": lambda a, b: _orderable(a, b) and a > b,
    ">=": lambda a, b: _orderable(a, b) and a >= b,
    "in": _contains,
    "not in": lambda a, b: a is not MISSING and not _contains(a, b),
}


# parser ----------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokenize(text)
        self.pos = 0

    def _peek(self, offset: int = 0) -> _Token | None:
        index = self.pos + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def _is(self, text: str, offset: int = 0) -> bool:
        token = self._peek(offset)
        return token is not None and token.kind in ("op", "keyword") and token.text == text

    def _fail(self, expected: str) -> ExpressionError:
        token = self._peek()
        if token is None:
            return ExpressionError(f"at the end: expected {expected}")
        return ExpressionError(f"at column {token.column}: expected {expected}, found {token.text!r}")

    def _expect(self, text: str) -> None:
        if not self._is(text):
            raise self._fail(repr(text))
        self.pos += 1

    def parse(self) -> Predicate:
        if not self.tokens:
            raise ExpressionError("the expression is empty")
        node = self._or()
        if self._peek() is not None:
            raise self._fail("'and', 'or' or the end")
        return node

    def _or(self) -> Predicate:
        parts = [self._and()]
        while self._is("or"):
            self.pos += 1
            parts.append(self._and())
        if len(parts) == 1:
            return parts[0]
        return lambda data: any(part(data) for part in parts)

    def _and(self) -> Predicate:
        parts = [self._not()]
        while self._is("and"):
            self.pos += 1
            parts.append(self._not())
        if len(parts) == 1:
            return parts[0]
        return lambda data: all(part(data) for part in parts)

    def _not(self) -> Predicate:
        if self._is("not"):
            self.pos += 1
            inner = self._not()
            return lambda data: not inner(data)
        return self._compare()

    def _compare(self) -> Predicate:
        if self._is("("):  # a parenthesised boolean, or a parenthesised operand of a comparison
            self.pos += 1
            inner = self._or()
            self._expect(")")
            return inner
        left = self._operand()
        op: str | None = None
        if self._is("not") and self._is("in", 1):
            op = "not in"
            self.pos += 2
        else:
            token = self._peek()
            if token is not None and token.text in _COMPARE and token.kind in ("op", "keyword"):
                op = token.text
                self.pos += 1
        if op is None:
            return lambda data: _truthy(left(data))
        right = self._operand()
        compare = _COMPARE[op]
        return lambda data: compare(left(data), right(data))

    def _operand(self) -> _Getter:
        token = self._peek()
        if token is None:
            raise self._fail("a JSONPath, a literal or a list")
        if token.kind == "path":
            self.pos += 1
            getter: _Getter = token.value
            return getter
        if token.kind == "literal":
            self.pos += 1
            value = token.value
            return lambda _data: value
        if self._is("["):
            self.pos += 1
            items: list[Any] = []
            while not self._is("]"):
                item = self._peek()
                if item is None or item.kind != "literal":
                    raise self._fail("a literal in the list")
                items.append(item.value)
                self.pos += 1
                if not self._is("]"):
                    self._expect(",")
            self.pos += 1
            return lambda _data: items
        raise self._fail("a JSONPath, a literal or a list")


#: Distinct expressions kept compiled: a config repeats its filters across groups, and the predicates
#: hold no state, so one serves every occurrence.
_CACHE_SIZE = 4096
_compiled: dict[str, tuple[Predicate, tuple[str, ...]]] = {}  # text -> its predicate, its JSONPaths


def compile_expression(text: str) -> Predicate:
    """Parse ``text`` into a predicate over a parsed JSON body; :class:`ExpressionError` if invalid.

    Pass :data:`~ddmq.config.jsonpath.MISSING` as the body when there is none (not JSON): every path
    then finds nothing.
    """
    found = _compiled.get(text)
    if found is not None:
        for path in found[1]:
            check_jsonpath(path)  # counted against the config's bound as if compiled again
        return found[0]
    parser = _Parser(text)
    predicate = parser.parse()
    if len(_compiled) >= _CACHE_SIZE:
        _compiled.clear()
    _compiled[text] = (predicate, tuple(token.text for token in parser.tokens if token.kind == "path"))
    return predicate
