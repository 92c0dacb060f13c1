"""What every ``ddmq`` command shares, through the real executable: ``--version``, the usage error
style, and a quiet end on a closed stdout (``ddmq-proxy``'s side: tests/proxy/test_cli_basics.py)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from ddmq.client.producer import Producer

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]


def test_version() -> None:
    result = subprocess.run([*DDMQ, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.strip() == f"ddmq {metadata.version('ddmq-proxy')}"


@pytest.mark.parametrize(("args", "prefix"), [
    (["status", "--group", "g"], "ddmq status: the following arguments are required: --redis"),
    (["consume", "--servers", "h:1", "--group", "g", "--count", "0"], "ddmq consume: --count must be positive"),
    (["consume", "--servers", "h:99999", "--group", "g"], "ddmq consume: bad port in server address"),
    (["dead-letters", "list", "--http", "ftp://x", "--group", "g", "--topic", "t"], "ddmq dead-letters list: --http"),
    (["nosuch"], "ddmq: argument COMMAND: invalid choice: 'nosuch'"),
])
def test_usage_errors_exit_2_in_one_style(args: list[str], prefix: str) -> None:
    env = {"PATH": "/usr/bin:/bin"}  # no DDMQ_* defaults from the caller's environment
    result = subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and result.stderr.startswith(prefix), result.stderr
    assert result.stderr.count("\n") == 1


def test_a_closed_stdout_ends_the_command_quietly(redis_url: str) -> None:
    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 2)
    command = [*DDMQ, "offsets", "reset", "--redis", redis_url, "--group", "g", "--topic", "t", "--to-latest"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the command prints
        assert proc.wait(timeout=60) == 1
        assert proc.stderr.read() == b""
