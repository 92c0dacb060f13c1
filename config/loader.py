"""Load a proxy config file; every failure becomes a :class:`ConfigError` naming file and field."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from ddmq.config.documents import MAX_EXPANDED, NOT_JSON, read_json, read_yaml, shown, too_large
from ddmq.config.errors import ConfigError
from ddmq.config.jsonpath import PARSED_PATHS
from ddmq.config.schema import ProxyConfig

__all__ = ["MAX_EXPANDED", "MAX_FILE_BYTES", "expand_variables", "load", "parse"]

#: A config is a few KiB; past this a file is refused unread (a mistaken path, a device, a log). The
#: bound is what ``ddmq-proxy --check`` reads in under a second whatever the file holds (thousands of
#: groups, distinct filters; bench/edges.py --check): PyYAML builds its objects in Python, at about a
#: second per MiB even over libyaml's parser.
MAX_FILE_BYTES: Final = 256 * 1024
#: The most problems one error message lists (a file of ten thousand bad groups has ten thousand), and
#: the most characters it gives them.
MAX_PROBLEMS: Final = 20
MAX_MESSAGE_CHARACTERS: Final = 4000

#: ``${NAME}``, ``${NAME:-default}``, and ``$${`` for a literal ``${``.
_VARIABLE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{")


def expand_variables(data: Any, environ: Mapping[str, str], source: str = "<config>") -> Any:
    """``data`` with ``${NAME}`` and ``${NAME:-default}`` in every string value replaced from ``environ``.

    Secrets such as ``http.admin_token`` or a Redis password can then live in the environment (a
    container's, a secret store's) instead of the file. Only values are expanded, never keys, and an
    expanded value is not expanded again. An unset variable without a default is a ConfigError naming
    the variable and the field; the variable's value never appears in an error.
    """
    return _Expansion(environ, source).walk(data, ())[0]


class _Expansion:
    """One :func:`expand_variables` walk.

    An alias is the very object of its anchor: each object is expanded once and its result reused,
    and the size validation will see (each occurrence counted) is summed on the way, bounded by
    MAX_EXPANDED. Walking copies instead would take 9**9 steps for a 9 x 9 alias bomb."""

    def __init__(self, environ: Mapping[str, str], source: str) -> None:
        self.environ, self.source = environ, source
        self.done: dict[int, tuple[Any, int]] = {}  # id of a str, dict or list -> (expanded, expanded size)
        self.entered: set[int] = set()  # the dicts and lists being walked: met again inside, they contain themselves

    def expand(self, value: str, loc: tuple[int | str, ...]) -> str:
        source, environ = self.source, self.environ

        def one(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return "${"
            name = match.group(1)
            if name is None:
                where = _path(loc)
                raise ConfigError(
                    f"{source}: {where}: '${{' must start ${{NAME}} or ${{NAME:-default}} (write $${{ for a literal)"
                )
            found = environ.get(name)
            if found is not None:
                return found
            if match.group(2) is not None:
                return match.group(2)
            raise ConfigError(
                f"{source}: {_path(loc)}: environment variable {name} is not set (and ${{{name}}} has no :-default)"
            )

        return _VARIABLE.sub(one, value)

    def walk(self, node: Any, loc: tuple[int | str, ...]) -> tuple[Any, int]:
        if not isinstance(node, str | dict | list):
            return node, 1
        if isinstance(node, str) and "$" not in node:
            return node, 1 + len(node)  # nothing to expand, and a string contains nothing: no memo needed
        known = self.done.get(id(node))
        if known is not None:
            return known
        if id(node) in self.entered:
            raise ConfigError(f"{self.source}: {_path(loc)}: an alias refers to a mapping or list containing it "
                              "(a loop)")
        result: Any
        if isinstance(node, str):
            result = self.expand(node, loc)
            size = _weight(result)
        else:
            self.entered.add(id(node))
            result, size = self._walk_mapping(node, loc) if isinstance(node, dict) else self._walk_list(node, loc)
            self.entered.discard(id(node))
        if size > MAX_EXPANDED:
            raise too_large(self.source, _path(loc))
        self.done[id(node)] = (result, size)
        return result, size

    def _walk_mapping(self, node: dict[Any, Any], loc: tuple[int | str, ...]) -> tuple[dict[Any, Any], int]:
        result: dict[Any, Any] = {}
        size = 1
        for key, value in node.items():
            result[key], value_size = self.walk(value, (*loc, key))
            size += _weight(key) + value_size
            if size > MAX_EXPANDED:
                raise too_large(self.source, _path(loc))
        return result, size

    def _walk_list(self, node: list[Any], loc: tuple[int | str, ...]) -> tuple[list[Any], int]:
        result: list[Any] = []
        size = 1
        for index, value in enumerate(node):
            expanded, value_size = self.walk(value, (*loc, index))
            result.append(expanded)
            size += value_size
            if size > MAX_EXPANDED:
                raise too_large(self.source, _path(loc))
        return result, size


def _weight(value: Any) -> int:
    return 1 + len(value) if isinstance(value, str) else 1


def _path(loc: tuple[int | str, ...]) -> str:
    # A key is the file's to choose, however long: a message shows the start of each.
    return ".".join(shown(str(part)) for part in loc) or "<top level>"


def parse(data: Any, source: str = "<config>") -> ProxyConfig:
    """Validate already-parsed YAML/JSON data."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, not {type(data).__name__}")
    seen = PARSED_PATHS.set(set())  # JSONPaths counted per file, whatever earlier loads left cached
    try:
        return ProxyConfig.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        problems = "; ".join(f"{_path(err['loc'])}: {err['msg']}" for err in errors[:MAX_PROBLEMS])
        if len(problems) > MAX_MESSAGE_CHARACTERS:  # a message quotes the file's text (a JSONPath, an expression)
            problems = problems[:MAX_MESSAGE_CHARACTERS] + "..."
        if len(errors) > MAX_PROBLEMS:
            problems += f"; and {len(errors) - MAX_PROBLEMS:,} more problems"
        raise ConfigError(f"{source}: {problems}") from exc
    finally:
        PARSED_PATHS.reset(seen)


def load(path: str | Path) -> ProxyConfig:
    """Read a YAML (or JSON) config file, expand ``${VAR}`` in its values (:func:`expand_variables`), validate it."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)  # no more: the path may name a device or a huge file
            size = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        actual = f"{size:,} bytes" if size > MAX_FILE_BYTES else f"over {MAX_FILE_BYTES:,} bytes"
        raise ConfigError(f"{path}: the file is {actual}; a config file may be at most {MAX_FILE_BYTES:,} bytes "
                          f"({MAX_FILE_BYTES // 1024} KiB)")
    try:
        text = raw.decode("utf-8")  # YAML reads \r\n and \r as line breaks: no newline translation needed
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    # JSON is YAML too, but json reads it many times faster; what is not JSON goes to the YAML parser.
    data = read_json(text, str(path)) if text.lstrip().startswith("{") else NOT_JSON
    if data is NOT_JSON:
        data = read_yaml(text, str(path))
    if data is None:
        raise ConfigError(f"{path}: the file is empty; a config needs at least its groups (see config/examples/)")
    try:
        return parse(expand_variables(data, os.environ, str(path)), str(path))
    except RecursionError as exc:  # both walk once per level: deeper than the parser's bound (libyaml: 1,000)
        raise ConfigError(f"{path}: nested too deeply for a config (hundreds of levels)") from exc
