"""Load a proxy config file; every failure becomes a :class:`ConfigError` naming file and field."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml
from pydantic import ValidationError

from ddmq.config.errors import ConfigError
from ddmq.config.schema import ProxyConfig

#: A config is a few KiB; past this a file is refused unread (a mistaken path, a device, a log).
MAX_FILE_BYTES: Final = 1024 * 1024
#: The most a file may hold with its aliases and merges expanded, counting one per value (key, scalar,
#: mapping, list) plus the characters of each string. Aliases share one object in memory, so ten lines
#: of "billion laughs" aliases load at once, but validation walks every occurrence: without this bound
#: it would take hours. Characters count because a long string can cost more than many values (a
#: Filter expression is compiled at each occurrence). Written out, each value and character takes a
#: byte or more, so this is about what a file of MAX_FILE_BYTES can hold: aliases cannot make a file
#: cost more than the largest file written out by hand.
MAX_EXPANDED: Final = 1_000_000

_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


def _too_large(source: str, where: str) -> ConfigError:
    return ConfigError(
        f"{source}: {where}: with its aliases expanded the file holds over {MAX_EXPANDED:,} values and characters "
        "(a YAML alias bomb?); refused"
    )


class _StrictLoader(yaml.SafeLoader):
    """YAML with two traps of YAML 1.1 closed: only true/false are booleans (``yes``, ``no``, ``on``,
    ``off`` stay strings, which a number or boolean field then refuses), and a key given twice in one
    mapping is an error instead of the last one silently winning. Merges (``<<: *defaults``) are
    bounded by :data:`MAX_EXPANDED`."""

    def __init__(self, stream: str, source: str) -> None:
        super().__init__(stream)
        self._source = source
        self._merged = 0  # entries copied by merges so far
        self._flattening: set[int] = set()  # ids of the mapping nodes whose merges are being flattened

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue  # `<<`: no key of its own; flatten_mapping (called by super) merges its mappings
            key = self.construct_object(key_node, deep=deep)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: construct_mapping below reports it
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # SafeLoader copies each merged mapping's entries into this node, before any value is built:
        # thousands of mappings merging one of thousands of keys make millions of entries (and a
        # PyYAML that keeps duplicate keys grows merges of merges exponentially). Count the copies
        # before super() makes them; merged mappings are flattened first, so their size is final.
        if id(node) in self._flattening:
            raise yaml.constructor.ConstructorError(None, None, "a mapping merges itself", node.start_mark)
        self._flattening.add(id(node))
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE_TAG:
                continue
            merged = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for mapping in merged:
                if isinstance(mapping, yaml.MappingNode):  # anything else: super() reports it
                    self.flatten_mapping(mapping)
                    self._merged += len(mapping.value)
            if self._merged > MAX_EXPANDED:
                raise _too_large(self._source, f"line {key_node.start_mark.line + 1}")
        self._flattening.discard(id(node))
        super().flatten_mapping(node)


_BOOL_TAG = "tag:yaml.org,2002:bool"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


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

    def expand(self, value: str, where: str) -> str:
        source, environ = self.source, self.environ

        def one(match: re.Match[str]) -> str:
            if match.group(0) == "$${":
                return "${"
            name = match.group(1)
            if name is None:
                raise ConfigError(
                    f"{source}: {where}: '${{' must start ${{NAME}} or ${{NAME:-default}} (write $${{ for a literal)"
                )
            found = environ.get(name)
            if found is not None:
                return found
            if match.group(2) is not None:
                return match.group(2)
            raise ConfigError(
                f"{source}: {where}: environment variable {name} is not set (and ${{{name}}} has no :-default)"
            )

        return _VARIABLE.sub(one, value)

    def walk(self, node: Any, loc: tuple[int | str, ...]) -> tuple[Any, int]:
        if not isinstance(node, str | dict | list):
            return node, 1
        known = self.done.get(id(node))
        if known is not None:
            return known
        if id(node) in self.entered:
            raise ConfigError(f"{self.source}: {_path(loc)}: an alias refers to a mapping or list containing it "
                              "(a loop)")
        result: Any
        if isinstance(node, str):
            result = self.expand(node, _path(loc))
            size = _weight(result)
        else:
            self.entered.add(id(node))
            result, size = self._walk_mapping(node, loc) if isinstance(node, dict) else self._walk_list(node, loc)
            self.entered.discard(id(node))
        if size > MAX_EXPANDED:
            raise _too_large(self.source, _path(loc))
        self.done[id(node)] = (result, size)
        return result, size

    def _walk_mapping(self, node: dict[Any, Any], loc: tuple[int | str, ...]) -> tuple[dict[Any, Any], int]:
        result: dict[Any, Any] = {}
        size = 1
        for key, value in node.items():
            result[key], value_size = self.walk(value, (*loc, key))
            size += _weight(key) + value_size
            if size > MAX_EXPANDED:
                raise _too_large(self.source, _path(loc))
        return result, size

    def _walk_list(self, node: list[Any], loc: tuple[int | str, ...]) -> tuple[list[Any], int]:
        result: list[Any] = []
        size = 1
        for index, value in enumerate(node):
            expanded, value_size = self.walk(value, (*loc, index))
            result.append(expanded)
            size += value_size
            if size > MAX_EXPANDED:
                raise _too_large(self.source, _path(loc))
        return result, size


def _weight(value: Any) -> int:
    return 1 + len(value) if isinstance(value, str) else 1


def _path(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<top level>"


def parse(data: Any, source: str = "<config>") -> ProxyConfig:
    """Validate already-parsed YAML/JSON data."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, not {type(data).__name__}")
    try:
        return ProxyConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{_path(err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"{source}: {problems}") from exc


def load(path: str | Path) -> ProxyConfig:
    """Read a YAML config file, expand ``${VAR}`` in its values (:func:`expand_variables`), validate it."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)  # no more: the path may name a device or a huge file
            size = os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(raw) > MAX_FILE_BYTES:
        actual = f"{size:,} bytes" if size > MAX_FILE_BYTES else f"over {MAX_FILE_BYTES:,} bytes"
        raise ConfigError(f"{path}: the file is {actual}; a config file may be at most {MAX_FILE_BYTES:,} (1 MiB)")
    try:
        text = raw.decode("utf-8")  # YAML reads \r\n and \r as line breaks: no newline translation needed
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    loader = _StrictLoader(text, str(path))  # a SafeLoader: no arbitrary objects
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    except RecursionError as exc:  # the YAML composer recurses once per level of nesting
        raise ConfigError(f"{path}: nested too deeply for a config (hundreds of levels)") from exc
    finally:
        loader.dispose()
    if data is None:
        raise ConfigError(f"{path}: the file is empty; a config needs at least its groups (see config/examples/)")
    return parse(expand_variables(data, os.environ, str(path)), str(path))
