"""The ``export`` line a proxy prints at start-up, and the walkthrough config: a real ``ddmq-proxy``
started from config/examples/walkthrough.yaml (on free ports), its printed line pasted into the
environment of the real ``ddmq`` commands run elsewhere."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ddmq.protocol.net import free_port
from ddmq.proxy.ops.exports import export_lines

REPO = Path(__file__).resolve().parents[3]
PROXY = [sys.executable, "-m", "ddmq.proxy"]
DDMQ = [sys.executable, "-m", "ddmq.client.cli"]


def test_export_lines_name_every_address_and_never_a_password() -> None:
    lines = export_lines("redis://127.0.0.1:6379/0", "0.0.0.0", 9713, "127.0.0.1", 9714)
    assert lines[-1] == ("export DDMQ_REDIS=redis://127.0.0.1:6379/0 DDMQ_SERVERS=127.0.0.1:9713 "
                         "DDMQ_HTTP=http://127.0.0.1:9714")
    secret = export_lines("redis://:s3cret@10.0.0.5:6379/0", "::", 9713, None, None)
    assert not any("s3cret" in line for line in secret)
    assert "export DDMQ_SERVERS='[::1]:9713'" in secret and "DDMQ_HTTP" not in "\n".join(secret)
    assert any("set DDMQ_REDIS to the Redis URL yourself" in line and ":***@10.0.0.5" in line for line in secret)


def test_the_walkthrough_config_prints_the_exports_the_commands_need(tmp_path: Path) -> None:
    config = yaml.safe_load((REPO / "config/examples/walkthrough.yaml").read_text())
    assert (config["redis"], config["thrift"]["port"], config["http"]["port"]) == ("embedded", 9713, 9714)
    assert config["topics"] == {"rides": {"queues": 8}}
    assert config["groups"]["cg_rides"]["rides"]["order_key"] == "$.rider_id"
    config["thrift"]["port"], config["http"]["port"] = free_port(), free_port()  # the suite runs in parallel
    proxy_dir, shell_dir = tmp_path / "proxy", tmp_path / "elsewhere"
    proxy_dir.mkdir()
    shell_dir.mkdir()
    (proxy_dir / "walkthrough.yaml").write_text(yaml.safe_dump(config))
    stderr_path = proxy_dir / "stderr.log"
    with stderr_path.open("wb") as stderr:
        proxy = subprocess.Popen([*PROXY, "--config", "walkthrough.yaml"], cwd=proxy_dir, stderr=stderr)
    try:
        deadline = time.monotonic() + 60
        while not (exports := [line for line in stderr_path.read_text().splitlines() if line.startswith("export ")]):
            assert proxy.poll() is None and time.monotonic() < deadline, stderr_path.read_text()
            time.sleep(0.1)
        env = {"PATH": os.environ["PATH"]}
        env.update(word.split("=", 1) for word in shlex.split(exports[0])[1:])
        assert env["DDMQ_REDIS"] == (proxy_dir / "ddmq-data" / "redis.url").read_text().strip()
        assert env["DDMQ_SERVERS"] == f"127.0.0.1:{config['thrift']['port']}"
        assert env["DDMQ_HTTP"] == f"http://127.0.0.1:{config['http']['port']}"

        def ddmq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*DDMQ, *args], input=stdin, capture_output=True, text=True, timeout=60,
                                  env=env, cwd=shell_dir)

        produced = ddmq("produce", "--topic", "rides", stdin='{"key": "r1", "value": {"rider_id": "r1"}}\n')
        assert produced.returncode == 0, produced.stderr
        consumed = ddmq("consume", "--group", "cg_rides", "--count", "1", "--timeout", "30", "--json-values")
        assert consumed.returncode == 0, consumed.stderr
        assert json.loads(consumed.stdout)["value"] == {"rider_id": "r1"}
        blocked = ddmq("blocked-keys", "--group", "cg_rides", "--all")
        assert blocked.returncode == 0 and "0 of 0" in blocked.stdout, blocked.stderr
        groups = ddmq("groups", "list")
        assert groups.returncode == 0 and "cg_rides" in groups.stdout, groups.stderr
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait(timeout=60)
