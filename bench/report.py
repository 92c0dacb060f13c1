"""Rows of the results table, targets, and the JSON document they end up in."""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Row", "Target", "format_table"]


@dataclass(frozen=True)
class Target:
    """A row's target, ``figure <op> value``, e.g. ``Target(">=", 0.5)``."""

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
