"""Whether this build compiles the hot path: ``DDMQ_COMPILE``, the kind of install, and a C compiler.

``DDMQ_COMPILE`` unset (or ``auto``): compile when a C compiler and the Python headers work, else build
pure Python. ``0``: pure. ``1``: compile, and fail when it cannot. Editable installs are always pure
(compiled modules next to the sources would shadow later edits; with ``1`` they are refused). The
build backend (``ddmq_build.py``) and setup.py both ask :func:`plan`: the backend to fetch mypy into
the build environment, setup.py to compile.

The compiler is probed the way setuptools will use it: the same compiler object, ``$CC`` and
``$LDSHARED`` honoured, a file that includes ``Python.h`` compiled and linked as a shared object. So
``CC=false pip install .`` builds the pure package.
"""

from __future__ import annotations

import os
import sysconfig
import tempfile
from pathlib import Path
from typing import NamedTuple

import setuptools  # noqa: F401  (puts setuptools' own distutils in place of the standard library's)

#: Set by the build backend for the editable hooks (setuptools runs setup.py in the same process).
EDITABLE_ENV = "DDMQ_BUILD_EDITABLE"
_MODES = {"": "auto", "auto": "auto", "0": "pure", "1": "compiled"}


class Plan(NamedTuple):
    compile: bool
    reason: str  # why pure (empty when compiling)


def mode() -> str:
    """``auto``, ``pure`` or ``compiled`` from ``DDMQ_COMPILE``; ValueError for anything else."""
    value = os.environ.get("DDMQ_COMPILE", "").strip()
    if value not in _MODES:
        raise ValueError(f"DDMQ_COMPILE={value!r}: use 1 (compile), 0 (pure Python) or leave it unset (auto)")
    return _MODES[value]


def compiler_problem() -> str | None:
    """None when a C extension can be compiled and linked here, else what stops it (one line)."""
    from distutils.ccompiler import new_compiler
    from distutils.errors import CCompilerError, DistutilsError
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    program = (getattr(compiler, "compiler_so", None) or ["cc"])[0]
    with tempfile.TemporaryDirectory(prefix="ddmq-cc-probe-") as tmp:
        source = Path(tmp, "probe.c")
        source.write_text("#include <Python.h>\nint ddmq_probe(void) { return Py_IsInitialized(); }\n")
        try:
            objects = compiler.compile([str(source)], output_dir=tmp, include_dirs=[sysconfig.get_path("include")])
            compiler.link_shared_object(objects, str(Path(tmp, "probe.so")))
        except (CCompilerError, DistutilsError, OSError):
            return f"no working C compiler with the Python headers ({program!r} could not build a test extension)"
    return None


def plan(editable: bool | None = None) -> Plan:
    """What this build does; RuntimeError when ``DDMQ_COMPILE=1`` asks for what cannot be done."""
    wanted = mode()
    if editable is None:
        editable = os.environ.get(EDITABLE_ENV) == "1"
    if wanted == "pure":
        return Plan(False, "DDMQ_COMPILE=0")
    if editable:
        if wanted == "compiled":
            raise RuntimeError("DDMQ_COMPILE=1 needs a regular install (pip install .), not an editable one")
        return Plan(False, "an editable install (compiled modules next to the sources would shadow edits)")
    problem = compiler_problem()
    if problem is not None:
        if wanted == "compiled":
            raise RuntimeError(f"DDMQ_COMPILE=1, but {problem}")
        return Plan(False, problem)
    return Plan(True, "")
