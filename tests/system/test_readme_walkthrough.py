"""The README's walkthrough, run as a newcomer would: its shell blocks in order, word for word, in a
folder laid out like the repository (only the two ports are swapped for free ones, so the test never
meets a proxy a developer runs on 9713/9714)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ddmq.protocol.net import free_port

REPO = Path(__file__).resolve().parents[2]


def _walkthrough_blocks() -> list[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Walkthrough\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    start, commands = _walkthrough_blocks()
    thrift, http = free_port(), free_port()

    def ports(text: str) -> str:
        return text.replace("9713", str(thrift)).replace("9714", str(http))

    (tmp_path / "config" / "examples").mkdir(parents=True)
    config = (REPO / "config" / "examples" / "walkthrough.yaml").read_text()
    (tmp_path / "config" / "examples" / "walkthrough.yaml").write_text(ports(config))
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # the Quick start's venv

    proxy = subprocess.Popen(["bash", "-c", "exec " + start.strip()], cwd=tmp_path, stderr=subprocess.PIPE,
                             text=True)
    assert proxy.stderr is not None
    drain = threading.Thread(target=proxy.stderr.read, daemon=True)
    try:
        deadline = time.monotonic() + 60
        export = ""
        while time.monotonic() < deadline and not export:
            line = proxy.stderr.readline()
            assert line, "the proxy ended before it was ready"
            if line.startswith("export DDMQ_REDIS="):
                export = line
        assert f"DDMQ_SERVERS=127.0.0.1:{thrift}" in export and f"DDMQ_HTTP=http://127.0.0.1:{http}" in export
        # keep reading its log, so a full pipe never stalls it
        drain.start()

        shell = subprocess.run(["bash", "-euo", "pipefail", "-c", ports(commands)], cwd=tmp_path, capture_output=True,
                               text=True, timeout=240)
        assert shell.returncode == 0, shell.stderr
        out = shell.stdout
        assert "topic rides: 8 queue(s), 301 produced" in out, out
        consumed = [json.loads(line) for line in out.splitlines() if line.startswith('{"topic"')]
        assert len(consumed) == 5 and all(isinstance(m["qid"], int) and "rider_id" in m["value"] for m in consumed)
        assert "group cg_rides:" in out and "cg_rides" in out

        with urllib.request.urlopen(f"http://127.0.0.1:{http}/", timeout=10) as console:
            assert console.status == 200 and b"<html" in console.read().lower()
    finally:
        proxy.terminate()
        assert proxy.wait(timeout=60) == 0
        if drain.ident is not None:  # started
            drain.join(timeout=30)
        proxy.stderr.close()
