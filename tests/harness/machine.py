"""What a run records about the machine it ran on (cores it got, load, the commit measured) and its
progress line, shared by the benchmarks (``bench/``) and the soak (``tests/soak.py``)."""

from __future__ import annotations

import multiprocessing
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["cpu_available", "git_state", "load_average", "log", "meta"]

_REPO = Path(__file__).resolve().parents[2]
_PRODUCT = ["proxy", "actions", "client", "config", "protocol"]


def log(message: str) -> None:
    """Progress on stderr, so stdout holds only the table."""
    print(f"  {message}", file=sys.stderr, flush=True)


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
    }
