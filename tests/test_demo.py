"""The README's first command keeps working: ``ddmq demo`` ends with a clean summary."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


def test_demo_runs_and_reports_no_violations_and_no_loss(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddmq.client.cli", "demo", "--riders", "400", "--workers", "4",
         "--flaky-riders", "20", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = re.search(r"^summary: (.*)$", proc.stdout, re.M)
    assert summary is not None, proc.stdout
    fields = dict(part.split("=") for part in summary.group(1).split())
    assert fields["messages"] == "1200" and fields["acked"] == str(1200 - 2)
    assert fields["order_violations"] == "0" and fields["lost"] == "0"
    assert fields["dead_letters"] == "2" and int(fields["retries"]) >= 20
