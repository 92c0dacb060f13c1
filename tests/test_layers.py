"""Which product package may import which: the wire contract and what both sides share live in
``protocol/``, so the proxy never needs the client SDK and the client never needs the server.

    protocol/           imports none of client, proxy, actions
    proxy/ actions/ config/   import protocol, never client
    client/             imports protocol, never proxy or actions

Every module is read with ``ast`` (imports inside functions and ``TYPE_CHECKING`` blocks count too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: folder -> the ddmq packages its modules must not import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "protocol": ("ddmq.client", "ddmq.proxy", "ddmq.actions"),
    "proxy": ("ddmq.client",),
    "actions": ("ddmq.client",),
    "config": ("ddmq.client",),
    "client": ("ddmq.proxy", "ddmq.actions"),
}


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import in ``source``; ``package`` resolves relative imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # `from ddmq import client` imports ddmq.client
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def violations(source: str, package: str, forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"line {line}: {module}"
        for line, module in imported_modules(source, package)
        if any(module == name or module.startswith(name + ".") for name in forbidden)
    ]


def _modules() -> list[tuple[str, Path]]:
    return [(folder, path) for folder in FORBIDDEN for path in sorted((ROOT / folder).rglob("*.py"))]


def test_every_product_folder_has_modules() -> None:
    assert {folder for folder, _ in _modules()} == set(FORBIDDEN)


def _module_id(value: object) -> str:
    return str(value.relative_to(ROOT)) if isinstance(value, Path) else str(value)


@pytest.mark.parametrize(("folder", "path"), _modules(), ids=_module_id)
def test_module_keeps_to_its_layer(folder: str, path: Path) -> None:
    package = "ddmq." + ".".join(path.relative_to(ROOT).parent.parts)  # a module's or an __init__'s package
    found = violations(path.read_text(), package, FORBIDDEN[folder])
    assert not found, f"{path.relative_to(ROOT)} imports what its layer must not: {found}"


@pytest.mark.parametrize(
    ("source", "package", "folder"),
    [
        ("from ddmq.client import keys\n", "ddmq.proxy", "proxy"),
        ("import ddmq.client.wire\n", "ddmq.config", "config"),
        ("from ddmq import client\n", "ddmq.actions", "actions"),
        ("def later():\n    from ddmq.proxy.demo import main\n", "ddmq.client", "client"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ddmq.actions.base import Action\n",
         "ddmq.client", "client"),
        ("from ..client import producer\n", "ddmq.protocol", "protocol"),
    ],
)
def test_the_check_catches_a_violation(source: str, package: str, folder: str) -> None:
    assert violations(source, package, FORBIDDEN[folder])


def test_the_check_lets_allowed_imports_through() -> None:
    source = "from ddmq.protocol import keys\nimport ddmq.config.schema\nfrom ddmq.clientele import x\n"
    assert violations(source, "ddmq.proxy", FORBIDDEN["proxy"]) == []
