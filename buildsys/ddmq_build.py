"""Build backend: setuptools unchanged, plus what the compiled hot path needs in the build environment.

Whether a build compiles is :func:`ddmq_native.plan`'s answer (``DDMQ_COMPILE``, editable or not, a
working C compiler). A compiling build needs mypy (mypyc ships with it) and the runtime dependencies
(mypyc type-checks the code against them); pip installs those into its isolated build environment
because this backend asks for them, without running setup.py first (setup.py imports mypyc). Editable
installs stay pure: the editable hooks tell setup.py so, and refuse ``DDMQ_COMPILE=1``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from ddmq_native import EDITABLE_ENV, plan
from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (every other hook, unchanged)

_ROOT = Path(__file__).resolve().parents[1]
_PYPROJECT = _ROOT / "pyproject.toml"
#: Spark finds Python data sources by scanning sys.path for top-level ``pyspark_*`` modules
#: (pkgutil.iter_modules), which never asks setuptools' editable import hook.
_SPARK_ENTRY = "pyspark_ddmq.py"


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    if not plan(editable=False).compile:
        return list(_setuptools.get_requires_for_build_wheel(config_settings))
    project = tomllib.loads(_PYPROJECT.read_text())["project"]
    # types-PyYAML: config/loader.py subclasses yaml's SafeLoader, which mypy sees as Any without stubs
    return ["mypy>=1.10", "types-PyYAML>=6.0", *project["dependencies"]]


def _no_compiled_editable() -> None:
    plan(editable=True)  # raises for DDMQ_COMPILE=1
    os.environ[EDITABLE_ENV] = "1"  # setup.py runs in this process


def get_requires_for_build_editable(config_settings: dict[str, Any] | None = None) -> list[str]:
    _no_compiled_editable()
    return list(_setuptools.get_requires_for_build_editable(config_settings))


def build_editable(
    wheel_directory: str, config_settings: dict[str, Any] | None = None, metadata_directory: str | None = None
) -> str:
    _no_compiled_editable()
    name = str(_setuptools.build_editable(wheel_directory, config_settings, metadata_directory))
    _add_real_file(Path(wheel_directory) / name, _SPARK_ENTRY, (_ROOT / _SPARK_ENTRY).read_bytes())
    return name


def _add_real_file(wheel: Path, arcname: str, data: bytes) -> None:
    """Put ``arcname`` into the wheel as a file of its own (listed in RECORD, so pip uninstalls it).

    An editable install maps the project's modules through an import hook; ``pyspark_ddmq`` must also
    sit in site-packages as a file for Spark's scan to see it. It only re-exports ``ddmq.client.spark``,
    so a copy never goes stale.
    """
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rebuilt = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_DEFLATED) as target:
        for item in source.infolist():
            content = source.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                content += f"{arcname},sha256={digest},{len(data)}\n".encode()
                target.writestr(arcname, data)
            target.writestr(item, content)
    rebuilt.replace(wheel)
