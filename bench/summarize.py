"""Medians of repeated ``bench/run.py`` runs, per row and per build, against the targets.

``python bench/summarize.py RUN.json [RUN.json ...] [--brief] [--markdown] [--json PATH]``

One run's figures drift with the shared machine, so a comparison of two builds is made of several
runs of each, alternated, and judged by medians. The runs are grouped by size (quick or full) and by
the hot path the proxy ran (``meta.hot_path``: ``compiled`` or ``pure``); each figure is printed as
its group's median with the range and the number of runs, and judged against its target
where it has one (``TARGETS``). A second table lists every run with the cores it had before and after
(``meta.machine``) and its load average.

The figures: for each throughput row the ratio, proxy and baseline msg/s, the proxy's and the
clients' CPU µs per message, Redis's, the messages per reply, and the cores kept busy during the
proxy's drain (its CPU seconds over the drain's wall time: the proxy's alone, and the proxy's, Redis's
and the clients' together, out of the machine's cores); for P1 also the clients' floor (the same
clients against ``bench/replay.py``'s stand-in server, no engine, no Redis); for P3 the ratio, the
client's own floor (``floor_ratio``: the same work fed from memory) and the ratio divided by it, what
per-key order alone costs the data (``ordered_ideal_ratio``, computed), the
same client's floor against a stand-in server keeping per-key order (``ordered_floor_ratio``) and the
ratio divided by that, the ratio over the floor with the group's default ``concurrency`` (the figure's
drain holds the whole backlog), and the proxy's CPU µs per message and the cores the proxy and the clients kept
busy; for P4 the p50 and
p99 ratios and latencies, and the same for P4s (each side in a client process of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))

from bench.report import Target

THROUGHPUT_ROWS = ("P1", "P1-runs", "P1j", "P1q", "P1q-runs", "P1h", "P1h-runs", "P1c")


@dataclass(frozen=True)
class Figure:
    """One number read from every run's JSON (``None`` when the run lacks it)."""

    name: str
    get: Callable[[dict[str, Any]], float | None]
    digits: int
    target: Target | None = None


def _field(row: str, *path: str) -> Callable[[dict[str, Any]], float | None]:
    def get(document: dict[str, Any]) -> float | None:
        value: Any = document.get(row)
        for key in path:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return float(value) if isinstance(value, int | float) else None

    return get


def _cores(row: str, *sides: str) -> Callable[[dict[str, Any]], float | None]:
    """CPU seconds of ``sides`` during the proxy's drain divided by that drain's wall time: how many
    cores they kept busy (1.0 for the proxy: its one process was never idle)."""

    def get(document: dict[str, Any]) -> float | None:
        wall = _field(row, "proxy_committed_s")(document)
        spent = [_field(row, "cpu_s", "proxy_run", side)(document) for side in sides]
        return sum(s for s in spent if s is not None) / wall if wall and None not in spent else None

    return get


def _redis_cpu(row: str) -> Callable[[dict[str, Any]], float | None]:
    def get(document: dict[str, Any]) -> float | None:
        cpu = _field(row, "cpu_s", "proxy_run", "redis")(document)
        messages = _field(row, "params", "messages")(document)
        return cpu / messages * 1e6 if cpu is not None and messages else None

    return get


def _p3_over_floor(document: dict[str, Any]) -> float | None:
    ratio, floor = _field("P3", "ratio")(document), _field("P3", "floor_ratio")(document)
    return ratio / floor if ratio is not None and floor else None


def _p3_proxy_cpu(document: dict[str, Any]) -> float | None:
    cpu, messages = _field("P3", "cpu_s", "proxy")(document), _field("P3", "params", "messages")(document)
    return cpu / messages * 1e6 if cpu is not None and messages else None


def _p3_busy(side: str) -> Callable[[dict[str, Any]], float | None]:
    def get(document: dict[str, Any]) -> float | None:
        cpu, wall = _field("P3", "cpu_s", side)(document), _field("P3", "wall_s")(document)
        return cpu / wall if cpu is not None and wall else None

    return get


#: The targets of the medians, stricter than the per-run targets ``run.py`` prints (bench/scenarios/).
TARGETS = {
    "P1 ratio": Target(">=", 0.5),
    "P1j ratio": Target(">=", 0.45),
    "P1q-runs ratio": Target(">=", 0.45),
    "P1h-runs ratio": Target(">=", 0.45),
    "P1 clients' floor ratio": Target(">=", 0.8),
    "P3 ratio / floor_ratio": Target("<=", 1.15),
    "P4 p50 ratio": Target("<=", 1.5),
}


def _figures() -> list[Figure]:
    figures: list[Figure] = []
    for row in THROUGHPUT_ROWS:
        figures += [
            Figure(f"{row} ratio", _field(row, "ratio"), 3),
            Figure(f"{row} proxy msg/s", _field(row, "proxy_msgs_per_s"), 0),
            Figure(f"{row} baseline msg/s", _field(row, "baseline_msgs_per_s"), 0),
            Figure(f"{row} proxy CPU µs/msg", _field(row, "cpu_us_per_msg", "proxy"), 2),
            Figure(f"{row} clients CPU µs/msg", _field(row, "cpu_us_per_msg", "clients"), 2),
            Figure(f"{row} Redis CPU µs/msg", _redis_cpu(row), 2),
            Figure(f"{row} messages per reply", _field(row, "messages_per_pull"), 1),
            Figure(f"{row} proxy cores busy", _cores(row, "proxy"), 2),
            Figure(f"{row} all cores busy", _cores(row, "proxy", "redis", "clients"), 2),
        ]
        if row == "P1":
            figures += [
                Figure("P1 clients' floor ratio", _field(row, "client_floor_ratio"), 3),
                Figure("P1 clients' floor msg/s", _field(row, "client_floor_msgs_per_s"), 0),
                Figure("P1 clients' floor CPU µs/msg", _field(row, "client_floor_cpu_us_per_msg"), 2),
            ]
    figures += [
        Figure("P3 ratio", _field("P3", "ratio"), 3),
        Figure("P3 floor_ratio", _field("P3", "floor_ratio"), 3),
        Figure("P3 ratio / floor_ratio", _p3_over_floor, 3),
        Figure("P3 ordered ideal_ratio", _field("P3", "ordered_ideal_ratio"), 3),
        Figure("P3 ordered floor_ratio", _field("P3", "ordered_floor_ratio"), 3),
        Figure("P3 ratio / ordered floor", _field("P3", "ratio_over_ordered_floor"), 3),
        Figure("P3 default concurrency ratio / floor", _field("P3", "default_concurrency", "ratio_over_floor"), 3),
        Figure("P3 proxy CPU µs/msg", _p3_proxy_cpu, 1),
        Figure("P3 proxy cores busy", _p3_busy("proxy"), 2),
        Figure("P3 clients cores busy", _p3_busy("clients"), 2),
        Figure("P4 p50 ratio", _field("P4", "ratio_p50"), 3),
        Figure("P4 p99 ratio", _field("P4", "ratio_p99"), 3),
        Figure("P4 proxy p50 ms", _field("P4", "proxy_ms", "p50_ms"), 2),
        Figure("P4 proxy p99 ms", _field("P4", "proxy_ms", "p99_ms"), 2),
        Figure("P4 baseline p50 ms", _field("P4", "baseline_ms", "p50_ms"), 2),
        Figure("P4 baseline p99 ms", _field("P4", "baseline_ms", "p99_ms"), 2),
        # each side in a client process of its own (neither side's messages wait behind the other's)
        Figure("P4s p50 ratio", _field("P4s", "ratio_p50"), 3),
        Figure("P4s p99 ratio", _field("P4s", "ratio_p99"), 3),
        Figure("P4s proxy p50 ms", _field("P4s", "proxy_ms", "p50_ms"), 2),
        Figure("P4s baseline p50 ms", _field("P4s", "baseline_ms", "p50_ms"), 2),
    ]
    return [f if f.name not in TARGETS else Figure(f.name, f.get, f.digits, TARGETS[f.name]) for f in figures]


FIGURES = _figures()


def group_of(document: dict[str, Any]) -> str:
    """``full compiled``, ``quick pure``, ...: the run's size and the proxy's hot path."""
    meta = document.get("meta", {})
    return f"{'quick' if meta.get('quick') else 'full'} {meta.get('hot_path', 'unknown')}"


def summarize(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The medians per group and figure, and each run's machine state, as one JSON-ready dict."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for document in documents.values():
        groups.setdefault(group_of(document), []).append(document)
    medians: dict[str, dict[str, Any]] = {}
    for group, runs in sorted(groups.items()):
        medians[group] = {}
        for figure in FIGURES:
            values = [v for v in (figure.get(run) for run in runs) if v is not None]
            if not values:
                continue
            median = statistics.median(values)
            entry: dict[str, Any] = {"median": round(median, 4), "values": [round(v, 4) for v in values]}
            if figure.target is not None:
                entry["target"] = str(figure.target)
                entry["verdict"] = "PASS" if figure.target.met(median) else "MISS"
            medians[group][figure.name] = entry
    runs_table = []
    for path, document in sorted(documents.items(), key=lambda item: str(item[1].get("meta", {}).get("date"))):
        meta = document.get("meta", {})
        machine = meta.get("machine", {})
        runs_table.append(
            {
                "file": path,
                "group": group_of(document),
                "date": meta.get("date"),
                "commit": (meta.get("git") or {}).get("commit"),
                "event_loop": meta.get("event_loop"),
                "cores_available_before": machine.get("cores_available_before"),
                "cores_available_after": machine.get("cores_available_after"),
                "load_before": machine.get("load_before"),
                "load_after": machine.get("load_after"),
            }
        )
    return {"medians": medians, "runs": runs_table}


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def _cell(entry: dict[str, Any] | None, digits: int) -> str:
    if entry is None:
        return "-"
    values = entry["values"]
    spread = f" ({_number(min(values), digits)}-{_number(max(values), digits)}, n={len(values)})"
    verdict = f" {entry['verdict']}" if "verdict" in entry else ""
    return f"{_number(entry['median'], digits)}{verdict}{spread}"


def _brief(figure: Figure) -> bool:
    """The figures that say what bounds a row: ratios, floors and the proxy's CPU per message."""
    return figure.name.endswith(("ratio", "proxy CPU µs/msg", "cores busy")) or "floor" in figure.name


def format_tables(summary: dict[str, Any], markdown: bool, brief: bool = False) -> str:
    groups = list(summary["medians"])
    header = ["figure", "target", *groups]
    lines = []
    for figure in FIGURES:
        if brief and not _brief(figure):
            continue
        cells = [_cell(summary["medians"][g].get(figure.name), figure.digits) for g in groups]
        if any(cell != "-" for cell in cells):
            lines.append([figure.name, str(figure.target) if figure.target else "", *cells])
    runs_header = ["file", "group", "date", "cores before / after", "load before / after (1 min)"]
    runs = [
        [
            Path(run["file"]).name,
            run["group"],
            run["date"] or "",
            f"{run['cores_available_before']} / {run['cores_available_after']}",
            f"{(run['load_before'] or ['?'])[0]} / {(run['load_after'] or ['?'])[0]}",
        ]
        for run in summary["runs"]
    ]
    return _table(header, lines, markdown) + "\n\n" + _table(runs_header, runs, markdown)


def _table(header: list[str], lines: list[list[str]], markdown: bool) -> str:
    if markdown:
        rows = [header, ["---"] * len(header), *lines]
        return "\n".join("| " + " | ".join(cells) + " |" for cells in rows)
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]
    text = ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip() for cells in [header, *lines]]
    text.insert(1, "-" * len(text[0]))
    return "\n".join(text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/summarize.py", description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files written by bench/run.py --json")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables (for bench/README.md)")
    parser.add_argument("--brief", action="store_true", help="only ratios, floors, CPU per message and cores busy")
    parser.add_argument("--json", type=Path, default=None, help="also write the medians and the runs here")
    args = parser.parse_args(argv)
    documents: dict[str, dict[str, Any]] = {}
    for path in args.runs:
        try:
            documents[str(path)] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"{path}: {exc}")
    summary = summarize(documents)
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    try:
        print(format_tables(summary, args.markdown, args.brief), flush=True)
    except BrokenPipeError:  # the reader (``| head``) had enough: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
