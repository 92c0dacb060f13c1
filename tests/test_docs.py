"""The docs site's generated references cover the code they are generated from (docs/hooks.py; CI also
runs `mkdocs build --strict`, which fails on a broken link or anchor), and DESIGN.md's layer table names
the modules on disk."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ddmq_docs_hooks", REPO / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _models(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    seen.add(model)
    hooks = _hooks()
    for info in model.model_fields.values():
        for nested in hooks._nested_models(info.annotation):
            if nested not in seen:
                _models(nested, seen)
    return seen


def test_the_config_reference_has_every_section_and_field_with_its_meaning() -> None:
    from ddmq.config.schema import ProxyConfig

    hooks = _hooks()
    page = hooks.config_reference()
    sections = re.split(r"^## ", page, flags=re.MULTILINE)
    by_name = {section.split("\n", 1)[0]: section for section in sections[1:]}
    models = _models(ProxyConfig, set())
    assert set(by_name) == {model.__name__ for model in models}
    undocumented = []
    for model in models:
        rows = {row.split("|")[1].strip(" `"): row for row in by_name[model.__name__].splitlines()
                if row.startswith("| `")}
        assert set(rows) == set(model.model_fields), model.__name__
        for name, row in rows.items():
            meaning = re.split(r"(?<!\\)\|", row.strip().strip("|"))[-1].strip()
            if not meaning:
                undocumented.append(f"{model.__name__}.{name}")
    # every field says what it is for: a `#:` comment above it in config/schema/
    assert not undocumented, undocumented


def test_the_cli_reference_has_every_command_of_both_programs() -> None:
    from ddmq.client.cli.main import build_parser

    hooks = _hooks()
    page = hooks.cli_reference()
    for path, _ in hooks.command_paths(build_parser()):
        assert f"## `{' '.join(('ddmq', *path))}`" in page, path
    assert "## `ddmq-proxy`" in page and "--config CONFIG" in page


def test_every_page_of_the_docs_folder_is_in_the_site_navigation() -> None:
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed: set[str] = set()

    def walk(items: list[object]) -> None:
        for item in items:
            for value in (item.values() if isinstance(item, dict) else [item]):
                if isinstance(value, list):
                    walk(value)
                else:
                    listed.add(str(value))

    walk(config["nav"])
    pages = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    generated = {_hooks().CONFIG_PAGE, _hooks().CLI_PAGE}
    assert listed == pages | generated


def test_no_file_holds_a_merge_conflict_marker() -> None:
    """A merge left unresolved still builds (Markdown renders the markers as text): look for them."""
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    tracked = (listed.stdout.split() if listed.returncode == 0 else  # not a checkout: the sources as they lie
               [str(p.relative_to(REPO)) for p in REPO.rglob("*") if not {".venv", ".git", "site"} & set(p.parts)])
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.MULTILINE)
    found = []
    for name in tracked:
        path = REPO / name
        if path.suffix not in {".md", ".py", ".yaml", ".yml", ".toml", ".thrift", ".cfg", ".txt"} or not path.is_file():
            continue
        if marker.search(path.read_text(errors="replace")):
            found.append(name)
    assert found == []


def _design_layer_table() -> list[tuple[str, list[str]]]:
    """(layer, modules) per row of DESIGN.md's layer table, in the table's order."""
    text = (REPO / "DESIGN.md").read_text()
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and re.fullmatch(r"`ddmq(\.\w+)*`", cells[0]):
            rows.append((cells[0].strip("`"), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def _modules_on_disk(layers: tuple[str, ...], layer_of: Callable[[str], int | None]) -> dict[str, list[str]]:
    """Per layer, its modules as the table names them: the path inside the layer's folder, no ``.py``."""
    found: dict[str, list[str]] = {layer: [] for layer in layers}
    for folder in ("protocol", "config", "actions", "proxy"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "__init__.py":
                continue
            index = layer_of("ddmq." + ".".join(path.relative_to(REPO).with_suffix("").parts))
            assert index is not None, path
            layer = layers[index]
            home = REPO.joinpath(*layer.split(".")[1:])
            found[layer].append(path.relative_to(home).with_suffix("").as_posix())
    return found


def test_the_design_layer_table_names_every_module_of_every_layer_and_nothing_else() -> None:
    from tests.test_layers import LAYERS, layer_of

    rows = _design_layer_table()
    assert [layer for layer, _ in rows] == list(LAYERS), "DESIGN.md's layers, bottom first, as tests/test_layers.py"
    on_disk = _modules_on_disk(LAYERS, layer_of)
    for layer, named in rows:
        assert len(named) == len(set(named)), f"{layer}: a module named twice in DESIGN.md"
        missing, gone = sorted(set(on_disk[layer]) - set(named)), sorted(set(named) - set(on_disk[layer]))
        assert not missing and not gone, f"DESIGN.md, layer {layer}: not named {missing}, not on disk {gone}"
