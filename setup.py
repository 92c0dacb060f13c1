"""The package list, found from the folders, and the opt-in compiled build.

Every folder below the five product folders installs as ``ddmq.<folder>.<sub>...``: subpackages and
data folders (the console's static files, the IDL, the config examples) alike, so adding a subpackage
needs no edit here or in pyproject.toml (which maps the five folders to ``ddmq.*``).

``DDMQ_COMPILE=1 pip install .`` compiles the per-message modules with mypyc. Without it the package
installs as pure Python. With it, the modules below become C extensions (mypyc ships with mypy; a C
compiler and the Python headers are needed); the .py files are installed next to them, the extensions
take precedence. Same behaviour, less CPU per message (bench/README.md, "What is slow").
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from setuptools import setup

# The per-message path: reading, the chain, the key gate, the buffer, acks, the pull reply.
COMPILED = [
    "proxy/store/broker.py",
    "proxy/api/fetch.py",
    "proxy/groups/group.py",
    "proxy/engine/job.py",
    "proxy/engine/offsets.py",
    "proxy/engine/ordering.py",
    "proxy/cluster/ownership.py",
    "proxy/engine/holds.py",
    "proxy/engine/pull_buffer.py",
    "proxy/engine/runs.py",
    "proxy/engine/redelivery.py",
    "proxy/core/types.py",
    "actions/order.py",
    "actions/pull_server.py",
    "protocol/pull_codec.py",
]

HERE = Path(__file__).resolve().parent
FOLDERS = ("proxy", "client", "config", "actions", "protocol")
# Compiled builds keep to their own folder: a later pure build must not pick up an extension from build/lib.
BUILD = HERE / "build" / "mypyc"


def _packages() -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted([HERE / folder, *(HERE / folder).rglob("*")]):
            if path.is_dir() and path.name != "__pycache__" and not path.name.endswith(".egg-info"):
                found.append(".".join(("ddmq", *path.relative_to(HERE).parts)))
    return found


def _compiled() -> dict[str, Any]:
    if os.environ.get("DDMQ_COMPILE", "") != "1":
        return {}
    from mypyc.build import mypycify

    # The sources live in proxy/, client/, ... but import as ddmq.*: mypyc names modules after their
    # paths, so give it that layout through symlinks (as .ci/run does for mypy).
    root = BUILD / "src"
    (root / "ddmq").mkdir(parents=True, exist_ok=True)
    for part in FOLDERS:
        link = root / "ddmq" / part
        if link.is_symlink():
            link.unlink()  # the checkout may have moved since the last compiled build
        link.symlink_to(HERE / part)
    os.environ["MYPYPATH"] = str(root)
    paths = [os.path.relpath(root / "ddmq" / p, HERE) for p in COMPILED]
    options = ["--config-file", str(HERE / "pyproject.toml"), "--explicit-package-bases"]
    return {
        # group_name: the shared runtime installs as the top-level module ddmq_proxy__mypyc.
        "ext_modules": mypycify(
            [*options, *paths], target_dir=os.path.relpath(BUILD / "c", HERE), group_name="ddmq_proxy"
        ),
        "options": {"build": {"build_base": os.path.relpath(BUILD, HERE)}},
    }


setup(packages=_packages(), **_compiled())
