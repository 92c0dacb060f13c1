"""The distribution installs everything under the ``ddmq`` namespace, editable and as a wheel; without a C
compiler (``CC=false``) the wheel builds pure Python and says so, and ``DDMQ_COMPILE=1`` refuses to."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ddmq.proxy", "ddmq.client", "ddmq.config", "ddmq.actions")
FOLDERS = {"ddmq.proxy": "proxy", "ddmq.client": "client", "ddmq.config": "config", "ddmq.actions": "actions"}
GENERIC_NAMES = ("client", "config", "proxy", "actions")

# Prints where each package was found and whether a generic top-level name is importable.
_PROBE = f"""
import importlib, importlib.util, json
found = {{}}
for name in {PACKAGES!r}:
    module = importlib.import_module(name)
    found[name] = {{"file": module.__file__, "path": list(module.__path__)}}
generic = {{name: importlib.util.find_spec(name) is not None for name in {GENERIC_NAMES!r}}}
print(json.dumps({{"found": found, "generic": generic}}))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "DDMQ_COMPILE", "CC", "LDSHARED")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return {**env, **extra}


def _probe(args: list[str], cwd: Path) -> dict[str, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, dict[str, object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _under(path: str | None, root: Path) -> bool:
    return path is not None and Path(path).resolve().is_relative_to(root.resolve())


def test_editable_install_imports_from_the_repo(tmp_path: Path) -> None:
    # What Spark's data source lookup scans (pkgutil.iter_modules over sys.path), in a fresh interpreter.
    scan = "import pkgutil; print([m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')])"
    found = subprocess.run([sys.executable, "-c", scan], cwd=tmp_path, env=_clean_env(), capture_output=True,
                           text=True, timeout=60, check=True)
    assert "pyspark_ddmq" in found.stdout, found.stdout
    probe = _probe(["-c", _PROBE], cwd=tmp_path)
    for name, where in probe["found"].items():
        assert isinstance(where, dict)
        folder = REPO / FOLDERS[name]
        assert where["path"] and all(_under(p, folder) for p in where["path"]), (name, where)
        if where["file"] is not None:  # None for a namespace package (no __init__.py yet)
            assert _under(where["file"], folder), (name, where)
    assert probe["generic"] == dict.fromkeys(GENERIC_NAMES, False)


def _copy_sources(dest: Path) -> Path:
    """Build from a copy: an in-tree build/ keeps stale files and would race other builds."""
    shutil.copytree(
        REPO,
        dest,
        ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".venv", "ddmq-data", "tests"
        ),
    )
    return dest


def test_without_a_c_compiler_the_wheel_is_pure_python_says_so_and_installs(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path / "src")
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    # DDMQ_COMPILE unset: compile where a compiler works. CC=false is a compiler that always fails.
    built = subprocess.run(
        [*pip, "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(wheels), str(src)],
        cwd=tmp_path, env=_clean_env(CC="false"), capture_output=True, text=True, timeout=120, check=True,
    )
    lines = (built.stdout + built.stderr).splitlines()
    said = [line.strip() for line in lines if "ddmq-proxy: " in line and "hot path" in line]
    assert said == ["ddmq-proxy: installing the pure-Python hot path: no working C compiler with the Python "
                    "headers ('false' could not build a test extension)"], said
    (wheel,) = wheels.glob("ddmq_proxy-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name  # pure: one wheel for every platform

    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    files = [n for n in names if not n.startswith(dist_info + "/")]

    # One deliberate top-level module: Spark registers the DefaultSource of every ``pyspark_*`` module.
    assert "pyspark_ddmq.py" in files
    files.remove("pyspark_ddmq.py")
    assert files and all(n.startswith("ddmq/") for n in files), files
    assert "ddmq/client/spark/pull_mode.py" in files
    assert "ddmq/__init__.py" not in files  # ddmq stays a namespace others can share
    assert not [n for n in files if n.endswith((".so", ".pyd", ".c"))]
    assert not any(n.split("/")[0] in GENERIC_NAMES for n in names)
    assert "ddmq/proxy/__init__.py" in files
    assert "ddmq/proxy/servers/http/openapi.yaml" in files  # served at /openapi.json
    for name in ("index.html", "console.js", "console.css", "favicon.svg"):  # the console
        assert f"ddmq/proxy/servers/http/static/{name}" in files
    assert "ddmq/client/consumer.py" in files and "ddmq/client/py.typed" in files
    assert "ddmq/protocol/redis/keys.py" in files and "ddmq/protocol/py.typed" in files
    thrifts = sorted((REPO / "protocol" / "idl").glob("*.thrift"))
    assert thrifts
    for thrift in thrifts:
        assert f"ddmq/protocol/idl/{thrift.name}" in files
    for example in sorted((REPO / "config" / "examples").glob("*.yaml")):
        assert f"ddmq/config/examples/{example.name}" in files
    assert "ddmq-proxy = ddmq.proxy.cli:main" in entry_points
    assert "ddmq = ddmq.client.cli.main:main" in entry_points

    target = tmp_path / "target"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(wheel)],
        cwd=tmp_path, env=_clean_env(), capture_output=True, timeout=120, check=True,
    )
    # -S: skip site so the editable install's import hook stays out; dependencies come from
    # site-packages appended after the target folder, without running their .pth files.
    site_dirs = [*site.getsitepackages()]
    bootstrap = f"import sys; sys.path[:0] = [{str(target)!r}]; sys.path.extend({site_dirs!r})\n"
    neutral = tmp_path / "neutral"
    neutral.mkdir()
    probe = _probe(["-S", "-c", bootstrap + _PROBE], cwd=neutral)
    for name, where in probe["found"].items():
        assert isinstance(where, dict)
        assert where["path"] and all(_under(p, target) for p in where["path"]), (name, where)
        assert not any(_under(p, REPO) for p in where["path"])
        if where["file"] is not None:
            assert _under(where["file"], target), (name, where)
    assert probe["generic"] == dict.fromkeys(GENERIC_NAMES, False)
    # The installed copy runs its pure modules, and says why.
    says = subprocess.run(
        [sys.executable, "-S", "-c", bootstrap + "from ddmq.protocol.native import hot_path; print(hot_path())"],
        cwd=neutral, env=_clean_env(), capture_output=True, text=True, timeout=60, check=True,
    )
    assert says.stdout.strip() == (
        "HotPath(kind='pure', reason='no compiled modules in this install: built without a C compiler, "
        "or with DDMQ_COMPILE=0')"
    ), says
    # What Spark's data source lookup does: iterate top-level modules named pyspark_* (no import of pyspark here).
    probe_spark = "import pkgutil; print([m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')])"
    found = subprocess.run(
        [sys.executable, "-S", "-c", bootstrap + probe_spark],
        cwd=neutral, env=_clean_env(), capture_output=True, text=True, timeout=60, check=True,
    )
    assert "pyspark_ddmq" in found.stdout


def test_wheel_and_sdist_carry_the_license_and_type_markers_and_build_without_warnings(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path / "src")
    out = tmp_path / "out"
    pip = [sys.executable, "-m", "pip"]
    # -v shows what setuptools prints while building: deprecations and "absent from packages" warnings.
    # DDMQ_COMPILE=0: pure, the build of every machine without a compiler (and a quick one).
    built = subprocess.run(
        [*pip, "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(src)],
        cwd=tmp_path, env=_clean_env(DDMQ_COMPILE="0"), capture_output=True, text=True, timeout=180, check=True,
    )
    assert "ddmq-proxy: installing the pure-Python hot path: DDMQ_COMPILE=0" in built.stderr + built.stdout
    noise = [
        line for line in built.stdout.splitlines() + built.stderr.splitlines()
        if ("Warning" in line or "deprecated" in line.lower()) and "byte-compiling" not in line
    ]
    assert not noise, noise
    (wheel,) = out.glob("ddmq_proxy-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/RECORD"))
        metadata = archive.read(f"{dist_info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert f"{dist_info}/licenses/LICENSE" in names
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py") and n.count("/") == 2}
    assert packages == {"ddmq/" + folder for folder in (*FOLDERS.values(), "protocol")}
    for package in sorted(packages):  # PEP 561: every installed package says it is typed
        assert f"{package}/py.typed" in names, package

    subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta as b; b.build_sdist({str(out)!r})"],
        cwd=src, env=_clean_env(), capture_output=True, timeout=180, check=True,
    )
    (sdist,) = out.glob("ddmq_proxy-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = {m.name.split("/", 1)[1] for m in archive.getmembers() if "/" in m.name}
    assert "LICENSE" in members and "config/py.typed" in members


def test_compiling_on_demand_without_a_compiler_fails_clearly(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path / "src")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
         str(tmp_path / "wheels"), str(src)],
        cwd=tmp_path, env=_clean_env(CC="false", DDMQ_COMPILE="1"), capture_output=True, text=True, timeout=120,
    )
    assert built.returncode != 0
    assert "DDMQ_COMPILE=1, but no working C compiler with the Python headers" in built.stdout + built.stderr
    assert not list(tmp_path.glob("wheels/*.whl"))


def test_an_editable_install_refuses_to_compile(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path / "src")
    # the backend's editable hook, as pip calls it for ``pip install -e .``
    hook = "import sys; sys.path.insert(0, 'buildsys'); import ddmq_build; ddmq_build.get_requires_for_build_editable()"
    refused = subprocess.run(
        [sys.executable, "-c", hook], cwd=src, env=_clean_env(DDMQ_COMPILE="1"), capture_output=True, text=True,
        timeout=60,
    )
    assert refused.returncode != 0
    assert "DDMQ_COMPILE=1 needs a regular install (pip install .), not an editable one" in refused.stderr
    allowed = subprocess.run(
        [sys.executable, "-c", hook], cwd=src, env=_clean_env(), capture_output=True, text=True, timeout=60
    )
    assert allowed.returncode == 0, allowed.stderr
