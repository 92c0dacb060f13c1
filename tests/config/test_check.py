"""``ddmq-proxy --check`` in its own process: it loads the config and nothing of the running proxy (no
aiohttp, thriftpy2, redis-py or uvloop), and every shape of file gets an answer: ok, or a clear error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ddmq.config.loader import MAX_FILE_BYTES
from tests.config import shapes

#: A config that validates a Redis URL, JSONPaths, a filter and both push actions' settings.
EVERYTHING = """
redis: redis://:secret@127.0.0.1:6379/0
topics: {rides: {queues: 4}}
groups:
  g:
    rides: {actions: [Json, Order, PullServer], order_key: "$.items[?(@.n > 1)].id"}
    filtered:
      actions: [Json, Filter, PullServer]
      filter: {expression: "$.amount >= 100 and not $.city in ['bj']"}
    pushed:
      actions: [Json, AsyncHttp]
      async_http: {urls: ["http://127.0.0.1:1/x"], query_params: {id: "$.id"}}
    written:
      actions: [Json, Redis]
      redis_action: {url: "redis://127.0.0.1:1/0", commands: [{command: set, key: "k:{$.id}", value: "$.v"}]}
"""

HEAVY = ("aiohttp", "thriftpy2", "redis", "uvloop", "ddmq.proxy.service", "ddmq.proxy.servers", "ddmq.actions")

PROBE = """
import json, sys
from ddmq.proxy.cli import main
status = main(sys.argv[1:])
print(json.dumps({"status": status, "modules": sorted(sys.modules)}))
"""


def _check(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddmq.proxy", "--check", "--config", str(path), *extra],
                          capture_output=True, text=True, timeout=120)


def test_check_imports_nothing_of_the_running_proxy(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(EVERYTHING)
    proc = subprocess.run([sys.executable, "-c", PROBE, "--check", "--config", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, last = proc.stdout.strip().splitlines()[0], proc.stdout.strip().splitlines()[-1]
    assert first == f"{path}: ok (1 groups, 1 topics)"
    result = json.loads(last)
    assert result["status"] == 0
    loaded = [name for name in result["modules"] if name.split(".")[0] in HEAVY or name.startswith(HEAVY)]
    assert loaded == []
    assert "ddmq.config.loader" in result["modules"]


@pytest.mark.parametrize(
    ("name", "status", "answer"),
    [
        ("one-line", 0, "ok (1 groups, 0 topics)"),
        ("alias-bomb-9^9", 2, "values and characters (a YAML alias bomb?); refused"),
        ("groups-json", 0, "groups, 1 topics)"),
        ("paths-filtered", 2, "distinct JSONPaths beyond names and list indexes"),
    ],
)
def test_check_answers_every_shape(tmp_path: Path, name: str, status: int, answer: str) -> None:
    path = tmp_path / (f"{name}.json" if "json" in name else f"{name}.yaml")
    path.write_text(shapes.SHAPES[name]())
    proc = _check(path)
    assert proc.returncode == status, proc.stderr
    out = proc.stdout if status == 0 else proc.stderr
    assert out.startswith(f"{path}: " if status == 0 else f"ddmq-proxy: {path}: ")
    assert answer in out
    assert "Traceback" not in proc.stderr


def test_check_refuses_a_file_over_the_bound_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(shapes.many_groups_yaml(MAX_FILE_BYTES + 1_000))
    proc = _check(path)
    assert proc.returncode == 2
    assert f"a config file may be at most {MAX_FILE_BYTES:,} bytes ({MAX_FILE_BYTES // 1024} KiB)" in proc.stderr
