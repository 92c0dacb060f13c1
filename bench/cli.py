"""``python bench/run.py``: run the scenarios, print the table, write the JSON.

Exit status: 0 whenever the harness worked, whether targets were met or not; 1 when a scenario's
harness broke (a process did not start, a load crashed), after writing what did run; 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import Row, format_table
from bench.scenarios import SCENARIOS, Settings
from bench.scenarios.throughput import PROFILED_ROWS
from tests.harness.machine import cpu_available, load_average, meta

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/run.py",
        description="Benchmark ddmq-proxy against raw Redis Streams clients, side by side (see bench/README.md).",
    )
    parser.add_argument("--quick", action="store_true", help="smaller runs (the whole run takes ~2 minutes)")
    parser.add_argument(
        "--json", type=Path, default=RESULTS_DIR / "latest.json",
        help="where to write the results (default %(default)s)",
    )
    parser.add_argument("--only", default="", help=f"comma-separated scenario ids ({','.join(SCENARIOS)}); default all")
    parser.add_argument(
        "--profile", nargs="?", const="P1", default=None, choices=PROFILED_ROWS, metavar="ROW",
        help=f"profile the proxy of one throughput row ({', '.join(PROFILED_ROWS)}; default P1): py-spy flame graph "
        "(else pyinstrument HTML) in the results folder, named after the row",
    )
    return parser


def _selected(parser: argparse.ArgumentParser, only: str) -> list[str]:
    if not only:
        return list(SCENARIOS)
    wanted = [part.strip().upper() for part in only.split(",") if part.strip()]
    unknown = [w for w in wanted if w not in {s.upper() for s in SCENARIOS}]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    return [s for s in SCENARIOS if s.upper() in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    ids = _selected(parser, args.only)
    results_dir = args.json.resolve().parent
    settings = Settings(quick=args.quick, profile=args.profile, results_dir=results_dir)
    began = time.monotonic()
    # Shared machines: what the run had to work with, before and after (see "machine" in the JSON).
    machine: dict[str, Any] = {"load_before": load_average(), "cores_available_before": cpu_available()}
    print(f"machine: load {machine['load_before']}, cores available {machine['cores_available_before']}",
          file=sys.stderr, flush=True)
    rows: list[Row] = []
    broken: list[str] = []
    for scenario_id in ids:
        scenario = SCENARIOS[scenario_id]
        print(f"{scenario_id}: {scenario.what}", file=sys.stderr, flush=True)
        started = time.monotonic()
        try:
            rows.extend(scenario.run(settings))
        except Exception:
            broken.append(scenario_id)
            print(f"{scenario_id}: the harness broke:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            rows.append(Row(scenario_id, scenario.what, "error", "-", None, None, {},
                            {"error": traceback.format_exc(limit=3)}, verdict="ERROR"))
        print(f"{scenario_id}: {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
    machine.update(load_after=load_average(), cores_available_after=cpu_available())
    document: dict[str, Any] = {row.id: row.as_json() for row in rows}
    argv_list = list(sys.argv[1:] if argv is None else argv)
    document["meta"] = meta(args.quick, time.monotonic() - began, argv_list, machine)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(format_table(rows))
    print(f"\nresults: {args.json}  ({document['meta']['elapsed_s']}s, quick={args.quick}; "
          f"cores available before/after: {machine['cores_available_before']}/{machine['cores_available_after']})")
    for row in rows:
        profile = row.data.get("profile")
        if profile:
            print(f"profile ({profile['tool']}): {profile['output']}  {profile['note']}".rstrip())
            for entry in profile["top_self"]:
                print(f"  {entry['percent']:5.1f}%  {entry['function']}")
    return 1 if broken else 0
