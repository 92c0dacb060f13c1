"""Load a proxy config file; every failure becomes a :class:`ConfigError` naming file and field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ddmq.config.schema import ProxyConfig
from ddmq.proxy.errors import ConfigError


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
    """Read and validate a YAML config file."""
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
    return parse(data, str(path))
