"""Profiles one proxy process of a benchmark (``--profile``): py-spy attached by pid, or pyinstrument
wrapping the proxy's command; a :class:`~tests.harness.stack.ProxyRun` takes a :class:`Profiler`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["ProfileReport", "Profiler", "top_self_time"]


@dataclass
class ProfileReport:
    """Where a profile went and, for py-spy, the functions with the most self time (samples)."""

    tool: str
    output: Path | None
    top_self: list[tuple[str, int]] = field(default_factory=list)
    samples: int = 0
    #: Samples with no Python frame at all (a thread in native code); not in ``samples``.
    unattributed: int = 0
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        total = max(self.samples, 1)
        return {
            "tool": self.tool,
            "output": str(self.output) if self.output else None,
            "samples": self.samples,
            "unattributed_samples": self.unattributed,
            "top_self": [
                {"function": name, "samples": count, "percent": round(100 * count / total, 1)}
                for name, count in self.top_self
            ],
            "note": self.note,
        }


class Profiler:
    """Profiles one proxy process: py-spy if installed, else pyinstrument, else nothing (says why).

    py-spy attaches to the running proxy by pid once it listens, so start-up imports stay out of the
    profile and the harness keeps the proxy's own pid (for SIGTERM, RSS and CPU readings). Two
    non-blocking samplers run side by side: one writes the flame graph, the other collapsed stacks from
    which the self time per function is counted. pyinstrument cannot attach, so it wraps the proxy's
    command (``python -m pyinstrument -r html -o FILE -m ddmq.proxy ...``), which keeps the pid too.
    """

    RATE_HZ = 200

    def __init__(self, out_dir: Path, stem: str) -> None:
        self.out_dir = out_dir
        self.stem = stem
        self.py_spy = shutil.which("py-spy") or _venv_tool("py-spy")
        self.pyinstrument = self.py_spy is None and _has_module("pyinstrument")
        self._samplers: list[subprocess.Popen[bytes]] = []
        self._raw: Path | None = None

    @property
    def tool(self) -> str | None:
        if self.py_spy:
            return "py-spy"
        return "pyinstrument" if self.pyinstrument else None

    def wrap(self, command: list[str]) -> list[str]:
        """The proxy's command, wrapped by pyinstrument when that is the profiler."""
        if self.tool != "pyinstrument":
            return command
        self.out_dir.mkdir(parents=True, exist_ok=True)
        output = self.out_dir / f"{self.stem}.html"
        assert command[1:3] == ["-m", "ddmq.proxy"]
        return [command[0], "-m", "pyinstrument", "-r", "html", "-o", str(output), *command[1:]]

    def attach(self, pid: int) -> None:
        if self.tool != "py-spy":
            return
        assert self.py_spy is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._raw = self.out_dir / f"{self.stem}.collapsed.txt"
        common = [self.py_spy, "record", "--pid", str(pid), "--rate", str(self.RATE_HZ), "--nonblocking"]
        for fmt, output in (("flamegraph", self.out_dir / f"{self.stem}.svg"), ("raw", self._raw)):
            self._samplers.append(subprocess.Popen(
                [*common, "--format", fmt, "-o", str(output)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))

    def finish(self) -> ProfileReport:
        """After the proxy exited: wait for the samplers to write, then read the collapsed stacks."""
        if self.tool is None:
            return ProfileReport(
                "none", None, note="no profiler found: pip install py-spy (or pyinstrument) into this venv"
            )
        if self.tool == "pyinstrument":
            return ProfileReport("pyinstrument", self.out_dir / f"{self.stem}.html", note="open the HTML report")
        for sampler in self._samplers:
            try:
                sampler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                sampler.send_signal(signal.SIGINT)
                sampler.wait(timeout=10)
        report = ProfileReport("py-spy", self.out_dir / f"{self.stem}.svg")
        if self._raw is not None and self._raw.exists():
            report.top_self, report.samples, report.unattributed = top_self_time(self._raw.read_text())
        else:
            report.note = "py-spy wrote no samples (is ptrace allowed here?)"
        return report


def top_self_time(collapsed: str, count: int = 5) -> tuple[list[tuple[str, int]], int, int]:
    """The ``count`` functions with the most self samples in py-spy's raw (collapsed) output, the
    samples with a Python stack, and those without one.

    Each line is ``frame;frame;...;leaf N``; a frame is ``function (file:line)``. Self time belongs to
    the leaf; line numbers are dropped so a function's lines add up.
    """
    selves: Counter[str] = Counter()
    total = unattributed = 0
    for line in collapsed.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not samples.isdigit():
            continue
        if not stack.strip():
            unattributed += int(samples)
            continue
        leaf = stack.rsplit(";", 1)[-1]
        name, _, where = leaf.partition(" (")
        file = where.rstrip(")").rsplit(":", 1)[0]
        selves[f"{name} ({_short_path(file)})"] += int(samples)
        total += int(samples)
    return selves.most_common(count), total, unattributed


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _venv_tool(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if os.access(candidate, os.X_OK) else None


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
