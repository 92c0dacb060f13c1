"""Load a proxy config file; every failure becomes a :class:`ConfigError` naming file and field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ddmq.config.schema import ProxyConfig
from ddmq.proxy.errors import ConfigError


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
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return parse(data, str(path))
