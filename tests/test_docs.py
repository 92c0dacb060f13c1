"""The docs site's generated references cover the code they are generated from (docs/hooks.py; CI also
runs `mkdocs build --strict`, which fails on a broken link or anchor)."""

from __future__ import annotations

import importlib.util
import re
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
