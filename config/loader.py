"""Load a proxy config file; every failure becomes a :class:`ConfigError` naming file and field."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ddmq.config.errors import ConfigError
from ddmq.config.schema import ProxyConfig


class _StrictLoader(yaml.SafeLoader):
    """YAML with two traps of YAML 1.1 closed: only true/false are booleans (``yes``, ``no``, ``on``,
    ``off`` stay strings, which a number or boolean field then refuses), and a key given twice in one
    mapping is an error instead of the last one silently winning."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
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

    def expand(value: str, where: str) -> str:
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

    def walk(node: Any, loc: tuple[int | str, ...]) -> Any:
        if isinstance(node, str):
            return expand(node, _path(loc))
        if isinstance(node, dict):
            return {key: walk(value, (*loc, key)) for key, value in node.items()}
        if isinstance(node, list):
            return [walk(value, (*loc, index)) for index, value in enumerate(node)]
        return node

    return walk(data, ())


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
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        raise ConfigError(f"{path}: the file is empty; a config needs at least its groups (see config/examples/)")
    return parse(expand_variables(data, os.environ, str(path)), str(path))
