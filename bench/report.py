"""Rows of the results table, targets, and the JSON document they end up in."""

from __future__ import annotations

import multiprocessing
import operator
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bench.stack import LOOP_ENV
from ddmq.protocol.native import hot_path

__all__ = ["Row", "Target", "cpu_available", "format_table", "git_state", "load_average", "meta"]

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PRODUCT = ["proxy", "actions", "client", "config"]


@dataclass(frozen=True)
class Target:
    """``figure <op> value`` from the issue, e.g. ``Target(">=", 0.5)``."""

    op: str
    value: float
    unit: str = ""

    def met(self, figure: float) -> bool:
        compare: Callable[[float, float], bool] = {">=": operator.ge, "<=": operator.le}[self.op]
        return compare(figure, self.value)

    def __str__(self) -> str:
        return f"{self.op} {self.value:g}{self.unit}"


@dataclass
class Row:
    """One line of the table and one entry of the JSON (``data`` holds the JSON fields)."""

    id: str
    what: str
    proxy: str
    baseline: str
    ratio: float | None
    target: Target | None
    params: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    #: Overrides the PASS/MISS verdict (e.g. P5, whose target is on two figures; P6, skipped).
    verdict: str | None = None

    def judged(self) -> str:
        if self.verdict is not None:
            return self.verdict
        if self.target is None or self.ratio is None:
            return "-"
        return "PASS" if self.target.met(self.ratio) else "MISS"

    def as_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {}
        if self.ratio is not None:
            entry["ratio"] = round(self.ratio, 3)
        entry.update(self.data)
        entry["target"] = str(self.target) if self.target else None
        entry["verdict"] = self.judged()
        entry["params"] = self.params
        return entry


def _params_text(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def format_table(rows: list[Row]) -> str:
    header = ("id", "what", "proxy", "baseline", "ratio", "target", "", "params")
    lines = [
        (
            row.id,
            row.what,
            row.proxy,
            row.baseline,
            "-" if row.ratio is None else f"{row.ratio:.2f}",
            str(row.target) if row.target else "-",
            row.judged(),
            _params_text(row.params),
        )
        for row in rows
    ]
    widths = [max(len(str(cells[i])) for cells in [header, *lines]) for i in range(len(header) - 1)]
    out = []
    for cells in [header, *lines]:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=False)) + "  " + cells[-1])
    out.insert(1, "-" * min(160, len(out[0])))
    return "\n".join(line.rstrip() for line in out)


def _spin(seconds: float, out: multiprocessing.SimpleQueue[float]) -> None:
    began, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - began < seconds:
        pass
    out.put(time.process_time() - cpu)


def cpu_available(seconds: float = 0.5) -> float:
    """How many cores this machine gives right now: one spinner per core, CPU obtained / wall time."""
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.SimpleQueue[float] = context.SimpleQueue()
    spinners = [context.Process(target=_spin, args=(seconds, out)) for _ in range(os.cpu_count() or 1)]
    for spinner in spinners:
        spinner.start()
    obtained = sum(out.get() for _ in spinners)
    for spinner in spinners:
        spinner.join()
    return round(obtained / seconds, 2)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def git_state() -> dict[str, Any]:
    """The commit measured, and whether the product folders had uncommitted changes."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", *args], cwd=_REPO, capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD") or None,
            "product_dirty": bool(git("status", "--porcelain", "--", *_PRODUCT))}


def meta(quick: bool, elapsed_s: float, argv: list[str], machine: dict[str, Any]) -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "elapsed_s": round(elapsed_s, 1),
        "argv": argv,
        "git": git_state(),
        "machine": machine,
        # what the proxy ran: compiled or pure, and the event loop of the proxy and the client process
        "hot_path": hot_path().kind,
        "event_loop": os.environ.get(LOOP_ENV, "auto"),
    }
