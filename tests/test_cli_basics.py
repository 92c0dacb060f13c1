"""What every command shares, through the real executables: ``--version``, the usage error style, and
a port already in use reported in one line."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from ddmq.client.producer import Producer

from .support import ProxyProcess

REPO = Path(__file__).resolve().parents[1]
DDMQ = [sys.executable, "-m", "ddmq.client.cli"]
PROXY = [sys.executable, "-m", "ddmq.proxy"]


@pytest.mark.parametrize(("command", "name"), [(DDMQ, "ddmq"), (PROXY, "ddmq-proxy")])
def test_version(command: list[str], name: str) -> None:
    result = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.strip() == f"{name} {metadata.version('ddmq-proxy')}"


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


def test_a_closed_stdout_ends_commands_quietly(redis_url: str) -> None:
    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 2)
    commands = [
        [*PROXY, "--config", str(REPO / "config/examples/proxy.yaml"), "--check"],
        [*DDMQ, "offsets", "reset", "--redis", redis_url, "--group", "g", "--topic", "t", "--to-latest"],
    ]
    for command in commands:
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()  # the reader is gone before the command prints
            assert proc.wait(timeout=60) == 1, command
            assert proc.stderr.read() == b"", command
