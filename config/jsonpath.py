"""JSONPath getters shared by the actions and the key templates built from them: parsed once at build time,
evaluated per message."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final

#: What a getter returns when the path finds nothing (``None`` is a JSON value: null).
MISSING: Final[Any] = object()

_SIMPLE_PATH: Final = re.compile(r"^\$(\.[A-Za-z_][A-Za-z0-9_]*)+$")
#: Names and list indexes only (``$.items[0].sku``): what jsonpath-ng accepts unless a name is one of
#: :data:`_RESERVED`, so a check needs no parse (tests/config/test_jsonpath.py holds both to jsonpath-ng).
_PLAIN_PATH: Final = re.compile(r"^\$(?:\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]{1,9}\])+$")
_NAME: Final = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)")
#: The names jsonpath-ng's lexer takes as keywords, not fields: a path through one is refused by its
#: parser, so it is neither simple nor plain.
_RESERVED: Final = frozenset({"where", "wherenot"})

#: Distinct paths parsed by jsonpath-ng kept for reuse: a config repeats its paths across groups and
#: filters, and each parse costs a few hundred microseconds (a big config has thousands).
_CACHE_SIZE: Final = 4096
_parsed: dict[str, Any] = {}

#: The most distinct JSONPaths beyond names and list indexes (filters, wildcards, slices, ``..``) one
#: config may hold: each costs jsonpath-ng's parser up to a few milliseconds, and a check must take under a
#: second (a config has a handful).
MAX_PARSED_PATHS: Final = 128
#: While a config loads (the loader sets it): the distinct such paths seen so far; unset at run time.
PARSED_PATHS: ContextVar[set[str] | None] = ContextVar("ddmq_parsed_paths", default=None)
_parser: list[Any] = []  # the one jsonpath-ng parser, built at first use: its tables cost more than a parse
_lock = threading.Lock()  # the parser keeps its state on itself; a reload may parse in a worker thread


def is_simple(path: str) -> bool:
    """Whether ``path`` is a plain dotted path (``$.order.id``), looked up without jsonpath-ng."""
    return _SIMPLE_PATH.match(path) is not None and _RESERVED.isdisjoint(path[2:].split("."))


def parse_jsonpath(path: str) -> Any:
    """jsonpath-ng's expression for ``path``, parsed once per distinct path; what it raises for a bad one."""
    with _lock:
        found = _parsed.get(path)
        if found is not None:
            return found
        if not _parser:
            from jsonpath_ng.ext.parser import ExtendedJsonPathParser  # only configs with JSONPaths load it

            _parser.append(ExtendedJsonPathParser())
        expression = _parser[0].parse(path)
        if len(_parsed) >= _CACHE_SIZE:
            _parsed.clear()
        _parsed[path] = expression
        return expression


def check_jsonpath(path: str) -> str:
    """Raise ``ValueError`` naming the problem when ``path`` is not a JSONPath starting with ``$``."""
    if not path.startswith("$"):
        raise ValueError(f"{path!r} is not a JSONPath (it must start with '$')")
    if _PLAIN_PATH.match(path) is not None and _RESERVED.isdisjoint(_NAME.findall(path)):
        return path
    seen = PARSED_PATHS.get()
    if seen is not None and path not in seen:
        if len(seen) >= MAX_PARSED_PATHS:
            raise ValueError(
                f"{path!r} is one JSONPath too many: a config may hold at most {MAX_PARSED_PATHS} distinct "
                "JSONPaths beyond names and list indexes (filters, wildcards, slices, '..')"
            )
        seen.add(path)
    try:
        parse_jsonpath(path)
    except Exception as exc:  # jsonpath-ng raises several unrelated types for bad input
        raise ValueError(f"invalid JSONPath {path!r}: {exc}") from exc
    return path


def compile_jsonpath(path: str) -> Callable[[Any], Any]:
    """A getter returning the first match of ``path`` in a parsed body, or :data:`MISSING`.

    Plain dotted paths (``$.order.id``) become chained dict lookups; anything else uses jsonpath-ng,
    parsed once here rather than per message.

    >>> compile_jsonpath("$.order.id")({"order": {"id": 7}})
    7
    """
    if _SIMPLE_PATH.match(path):
        names = path[2:].split(".")

        def get_simple(data: Any) -> Any:
            for name in names:
                if not isinstance(data, dict):
                    return MISSING
                data = data.get(name, MISSING)
                if data is MISSING:
                    return MISSING
            return data

        return get_simple

    expression = parse_jsonpath(path)

    def get_general(data: Any) -> Any:
        if data is MISSING:
            return MISSING
        matches = expression.find(data)
        return matches[0].value if matches else MISSING

    return get_general


_PLACEHOLDER: Final = re.compile(r"\{(\$[^}]*)\}")

#: One part of a key template: literal text, or a getter into the body.
_Part = str | Callable[[Any], Any]


def parse_key_template(template: str) -> list[_Part]:
    """Split ``template`` into literal text and JSONPath getters; ``ValueError`` for a bad path."""
    if not template:
        raise ValueError("the key must not be empty")
    parts: list[_Part] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(template):
        if match.start() > pos:
            parts.append(template[pos : match.start()])
        parts.append(compile_jsonpath(check_jsonpath(match.group(1))))
        pos = match.end()
    if pos < len(template):
        parts.append(template[pos:])
    return parts
