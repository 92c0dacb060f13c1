"""The README's first command keeps working: ``ddmq demo`` ends with a clean summary."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
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
    assert re.search(r"^  console: http://127\.0\.0\.1:\d+/ ", proc.stdout, re.M), proc.stdout


def test_demo_lingers_with_its_console_up_then_ends_by_itself(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddmq.client.cli", "demo", "--riders", "30", "--workers", "2", "--flaky-riders", "2",
         "--linger", "3", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    with proc, proc.stdout:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            lingering = re.match(r"console: (http://127\.0\.0\.1:\d+/) stays up for 3 s", line)
            if lingering:
                with urllib.request.urlopen(lingering.group(1), timeout=5) as response:
                    assert response.status == 200 and "ddmq-proxy console" in response.read().decode()
                with urllib.request.urlopen(lingering.group(1) + "admin/groups/cg_rides", timeout=5) as response:
                    assert json.load(response)["group"] == "cg_rides"
                break
        else:
            raise AssertionError("".join(lines))
        assert proc.wait(timeout=60) == 0
    assert time.monotonic() - started >= 3
