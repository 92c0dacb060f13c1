"""The package list, found from the folders, and the compiled hot path.

Every folder below the five product folders installs as ``ddmq.<folder>.<sub>...``: subpackages and
data folders (the console's static files, the IDL, the config examples) alike, so adding a subpackage
needs no edit here or in pyproject.toml (which maps the five folders to ``ddmq.*``).

A regular install (``pip install .``) compiles the modules listed in ``protocol/native.py`` (``COMPILED``)
with mypyc when a C compiler works here, and installs pure Python otherwise; ``DDMQ_COMPILE=0`` forces
pure, ``DDMQ_COMPILE=1`` requires compiling, editable installs are pure (``buildsys/ddmq_native.py``
decides, and the build prints one line saying which). The .py files are installed next to the
extensions, which take precedence. Same behaviour, less CPU per message (bench/README.md).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import setup

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


def _compiled_modules() -> list[str]:
    """``COMPILED`` of protocol/native.py as source paths, read without importing the package."""
    spec = importlib.util.spec_from_file_location("_ddmq_native_list", HERE / "protocol" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [name.removeprefix("ddmq.").replace(".", "/") + ".py" for name in module.COMPILED]


def _say(line: str) -> None:
    print(f"ddmq-proxy: {line}", file=sys.stderr, flush=True)


def _compiled() -> dict[str, Any]:
    # Only the wheel builds compile; metadata hooks run this file too and need no extensions.
    if not {"bdist_wheel", "build_ext", "build"} & set(sys.argv[1:]):
        return {}
    sys.path.insert(0, str(HERE / "buildsys"))
    from ddmq_native import plan

    decided = plan()
    if decided.compile:
        try:
            from mypyc.build import mypycify
        except ImportError:
            if os.environ.get("DDMQ_COMPILE", "").strip() == "1":
                raise
            decided = decided._replace(compile=False, reason="mypyc (mypy) is not installed in the build environment")
    if not decided.compile:
        _say(f"installing the pure-Python hot path: {decided.reason}")
        return {}
    compiled = _compiled_modules()
    # Extensions of an earlier build here whose modules are no longer compiled would be packaged with
    # this one's (build_py copies all of build/lib), and import a shim the shared runtime lacks.
    for stale in BUILD.glob("lib.*"):
        shutil.rmtree(stale)
    _say(f"compiling the hot path with mypyc ({len(compiled)} modules; DDMQ_COMPILE=0 installs pure Python)")

    # The sources live in proxy/, client/, ... but import as ddmq.*: mypyc names modules after their
    # paths, so give it that layout through symlinks (as .ci/run does for mypy).
    root = BUILD / "src"
    (root / "ddmq").mkdir(parents=True, exist_ok=True)
    # A regular package here, not a namespace: mypy takes an installed copy (typed, py.typed) over a
    # namespace package's modules, so over an older install the build would type-check this code
    # against the installed modules that are not compiled, and fail on anything new in them.
    (root / "ddmq" / "__init__.py").touch()
    for part in FOLDERS:
        link = root / "ddmq" / part
        if link.is_symlink():
            link.unlink()  # the checkout may have moved since the last compiled build
        link.symlink_to(HERE / part)
    os.environ["MYPYPATH"] = str(root)
    paths = [os.path.relpath(root / "ddmq" / p, HERE) for p in compiled]
    options = ["--config-file", str(HERE / "pyproject.toml"), "--explicit-package-bases"]
    return {
        # group_name: the shared runtime installs as the top-level module ddmq_proxy__mypyc.
        "ext_modules": mypycify(
            [*options, *paths], target_dir=os.path.relpath(BUILD / "c", HERE), group_name="ddmq_proxy"
        ),
        "options": {"build": {"build_base": os.path.relpath(BUILD, HERE)}},
    }


setup(packages=_packages(), **_compiled())
