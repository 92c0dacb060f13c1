"""mkdocs hooks: the reference pages are generated from the code, so they cannot drift from it.

- ``reference/config.md`` from the config schema (``ddmq.config.schema``): every section and field with
  its type, default, bounds and the ``#:`` comment above it in the source.
- ``reference/cli.md`` from the parsers of ``ddmq`` and ``ddmq-proxy``: every command's ``--help``.

``mkdocs build`` calls :func:`on_files`; the page builders take no mkdocs object, so tests call them
directly (tests/test_docs.py).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
import types
import typing
from collections.abc import Iterator
from enum import Enum
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

CONFIG_PAGE = "reference/config.md"
CLI_PAGE = "reference/cli.md"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for path, build in ((CONFIG_PAGE, config_reference), (CLI_PAGE, cli_reference)):
        files.append(File.generated(config, path, content=build()))
    return files


# --- the config reference ---------------------------------------------------------------------------


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """field -> the ``#:`` comment lines right above it, over the model's classes (base classes first)."""
    comments: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls.__module__.startswith("pydantic"):
            continue
        lines, _ = inspect.getsourcelines(cls)
        (node,) = ast.parse(textwrap.dedent("".join(lines))).body
        assert isinstance(node, ast.ClassDef)
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                above: list[str] = []
                row = item.lineno - 2  # the line above, 0-based
                while row >= 0 and lines[row].strip().startswith("#:"):
                    above.insert(0, lines[row].strip()[2:].strip())
                    row -= 1
                if above:
                    comments[item.target.id] = " ".join(above).replace("``", "`")
    return comments


def _nested_models(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in typing.get_args(annotation):
        yield from _nested_models(arg)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in typing.get_args(annotation))
    if origin is not None:
        return f"{origin.__name__}[{', '.join(_type_name(arg) for arg in typing.get_args(annotation))}]"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(repr(member.value) for member in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "length >=", "max_length": "length <="}
    found = []
    for item in info.metadata:
        for name, word in words.items():
            value = getattr(item, name, None)
            if value is not None:
                found.append(f"{word} {value:,}" if isinstance(value, int) else f"{word} {value}")
    return ", ".join(found)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        return "computed"
    value = info.default
    if isinstance(value, BaseModel):
        return "its defaults"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"`{value:_}`"
    return f"`{value!r}`" if not isinstance(value, str) else f'`"{value}"`'


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_reference() -> str:
    from ddmq.config.schema import ProxyConfig

    out = [
        "# Configuration reference",
        "",
        "Generated from the config schema (`config/schema/`) when the docs are built. The file is YAML;",
        "unknown fields are errors, units are in the names, and `${VAR}` takes a value from the environment",
        "(see [Running the proxy](../running.md)). Sections are listed from the top of the file down.",
        "",
    ]
    seen: set[type[BaseModel]] = set()
    queue: list[type[BaseModel]] = [ProxyConfig]
    while queue:
        model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        comments = field_comments(model)
        out += [f"## {model.__name__}", ""]
        if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
            out += [inspect.cleandoc(model.__doc__), ""]
        out += ["| field | type | default | bounds | meaning |", "|---|---|---|---|---|"]
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if info.metadata:  # pydantic keeps Annotated's constraints apart from the type
                annotation = typing.Annotated[(annotation, *info.metadata)]
            out.append(
                f"| `{name}` | {_cell(_type_name(annotation))} | {_cell(_default(info))} | {_cell(_bounds(info))} "
                f"| {_cell(comments.get(name, ''))} |"
            )
            queue += [m for m in _nested_models(info.annotation) if m not in seen]
        out.append("")
    return "\n".join(out)


# --- the CLI reference ------------------------------------------------------------------------------


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[
    tuple[tuple[str, ...], argparse.ArgumentParser]
]:
    """Every (command path, parser) under ``parser``, the parser itself first."""
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from command_paths(child, (*prefix, name))


def cli_reference() -> str:
    from ddmq.client.cli.main import build_parser as ddmq_parser
    from ddmq.proxy.cli import build_parser as proxy_parser

    out = [
        "# Command-line reference",
        "",
        "Generated from the commands' own parsers when the docs are built: each section is what",
        "`--help` prints. Exit status: 0 success, 1 failure, 2 usage error, 130 after Ctrl-C.",
        "",
    ]
    for program, parser in (("ddmq-proxy", proxy_parser()), ("ddmq", ddmq_parser())):
        for path, command in command_paths(parser):
            out += [f"## `{' '.join((program, *path))}`", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(out)
