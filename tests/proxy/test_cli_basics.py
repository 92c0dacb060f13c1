"""What ``ddmq-proxy`` shares with every ``ddmq`` command (tests/client/test_cli_basics.py), through the
real executable: ``--version``, a port already in use reported in one line, and a quiet end on a
closed stdout."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml

from ddmq.protocol.native import describe

from ..support import ProxyProcess

REPO = Path(__file__).resolve().parents[2]
PROXY = [sys.executable, "-m", "ddmq.proxy"]


def test_version_says_the_hot_path_and_the_event_loop() -> None:
    result = subprocess.run([*PROXY, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    # auto: uvloop, a dependency wherever it installs; the hot path of this very install (pure when editable)
    assert result.stdout.strip() == f"ddmq-proxy {metadata.version('ddmq-proxy')}; {describe('uvloop')}"
    assert re.fullmatch(r"hot path: (compiled|pure \(.+\)); event loop: uvloop", describe("uvloop"))
    chosen = subprocess.run([*PROXY, "--loop", "asyncio", "--version"], capture_output=True, text=True, timeout=60)
    assert chosen.stdout.strip().endswith("; event loop: asyncio"), chosen.stdout


def test_a_port_in_use_is_one_line(tmp_path: Path, redis_url: str) -> None:
    first = ProxyProcess(tmp_path, redis_url, {"g": {"t": {}}}, {"t": {"queues": 2}}).start()
    try:
        config = yaml.safe_load(first.config_path.read_text())
        config["instance_id"] = "second"
        second = tmp_path / "second.yaml"
        second.write_text(yaml.safe_dump(config))
        result = subprocess.run([*PROXY, "--config", str(second), "--log-level", "WARNING"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        expected = rf"ddmq-proxy: cannot listen on 127\.0\.0\.1:{first.port} \(thrift\): .*address already in use\n"
        assert re.fullmatch(expected, result.stderr, re.IGNORECASE), result.stderr
    finally:
        first.stop()


def test_a_closed_stdout_ends_the_command_quietly() -> None:
    command = [*PROXY, "--config", str(REPO / "config/examples/proxy.yaml"), "--check"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the command prints
        assert proc.wait(timeout=60) == 1
        assert proc.stderr.read() == b""
