"""Config files load in bounded time: alias and merge bombs, loops, huge or deep files are refused
with a clear error, and ordinary anchors, aliases and merges load as the same file written out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddmq.config import load
from ddmq.config.loader import MAX_EXPANDED, MAX_FILE_BYTES
from ddmq.proxy.core.errors import ConfigError

MINIMAL = "groups: {g: {t: {actions: [PullServer]}}}\n"


def _bomb(indent: str, leaf: str, levels: int = 9, width: int = 9) -> str:
    """The "billion laughs": ``a0`` is ``leaf``, each ``aN`` lists ``a(N-1)`` ``width`` times (9**9 leaves)."""
    lines = [f"{indent}- &a0 {leaf}"]
    for level in range(1, levels + 1):
        lines.append(f"{indent}- &a{level} [" + ", ".join([f"*a{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


BOMBS = {
    "unknown key": "lol:\n" + _bomb("  ", "lol") + MINIMAL,
    "known key": "groups:\n  g:\n    t:\n      actions: [PullServer]\n      tags:\n" + _bomb("        ", "lol"),
    "variables": "lol:\n" + _bomb("  ", '"${DDMQ_TEST_BOMB}-${DDMQ_TEST_UNSET:-x}"') + MINIMAL,
}


@pytest.mark.parametrize("text", BOMBS.values(), ids=BOMBS.keys())
def test_check_refuses_an_alias_bomb_at_once(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    # Before the fix this ran for tens of minutes: the timeout is what fails then.
    proc = subprocess.run(
        [sys.executable, "-m", "ddmq.proxy", "--check", "--config", str(path)],
        capture_output=True, text=True, timeout=20, env={**os.environ, "DDMQ_TEST_BOMB": "boom"},
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{path}: " in proc.stderr
    assert f"over {MAX_EXPANDED:,} values and characters (a YAML alias bomb?)" in proc.stderr


def test_a_long_string_aliased_many_times_is_refused(tmp_path: Path) -> None:
    # Few values, but each occurrence is validated (a Filter expression compiled) on its own.
    path = tmp_path / "long.yaml"
    path.write_text(f"{MINIMAL}lol: [&s '{'x' * 10_000}'" + ", *s" * 200 + "]\n")
    with pytest.raises(ConfigError, match=r"long\.yaml: lol: .*alias bomb"):
        load(path)


def test_a_merge_bomb_is_refused(tmp_path: Path) -> None:
    # Each merge copies the merged mapping's entries into the node: 600 x 2,000 of them.
    keys = ", ".join(f"k{i}: {i}" for i in range(2_000))
    merges = "".join(f"  m{i}: {{<<: *d}}\n" for i in range(600))
    path = tmp_path / "merges.yaml"
    path.write_text(f"{MINIMAL}lol:\n  d: &d {{{keys}}}\n{merges}")
    with pytest.raises(ConfigError, match=r"merges\.yaml: line \d+: .*alias bomb"):
        load(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lol: &a [1, *a]\n", "lol.1: an alias refers to a mapping or list containing it (a loop)"),
        ("lol: &a {b: {c: *a}}\n", "lol.b.c: an alias refers to a mapping or list containing it (a loop)"),
        ("lol: &a {<<: *a}\n", "not valid YAML: a mapping merges itself"),
        ("lol: " + "[" * 5_000 + "]" * 5_000 + "\n", "nested too deeply"),
    ],
    ids=["list loop", "mapping loop", "merge loop", "deep"],
)
def test_loops_and_deep_nesting_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "odd.yaml"
    path.write_text(MINIMAL + text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert f"{path}: " in str(info.value) and expected in str(info.value)


def test_a_file_over_the_size_bound_is_refused_unparsed(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text(MINIMAL + "#" * MAX_FILE_BYTES + "\n")
    size = path.stat().st_size
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(info.value) == (
        f"{path}: the file is {size:,} bytes; a config file may be at most 262,144 bytes (256 KiB)"
    )


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(MINIMAL.encode() + b"instance_id: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8 text"):
        load(path)


SHARED = """
instance_id: proxy-1
groups:
  cg_rides:
    rides: &defaults
      actions: [Json, Order, PullServer]
      order_key: "${DDMQ_TEST_ORDER_KEY}"
      timeout_ms: 5000
      retry_intervals_ms: &retries [100, 1000]
      tags: [a, "${DDMQ_TEST_TAG:-b}"]
    payments:
      <<: *defaults
      timeout_ms: 7000
  cg_audit:
    rides: {<<: *defaults, max_retry: 9, tags: [c]}
    payments: *defaults
    refunds: {actions: [PullServer], retry_intervals_ms: *retries}
"""

WRITTEN_OUT = """
instance_id: proxy-1
groups:
  cg_rides:
    rides:
      actions: [Json, Order, PullServer]
      order_key: "${DDMQ_TEST_ORDER_KEY}"
      timeout_ms: 5000
      retry_intervals_ms: [100, 1000]
      tags: [a, "${DDMQ_TEST_TAG:-b}"]
    payments:
      actions: [Json, Order, PullServer]
      order_key: "${DDMQ_TEST_ORDER_KEY}"
      timeout_ms: 7000
      retry_intervals_ms: [100, 1000]
      tags: [a, "${DDMQ_TEST_TAG:-b}"]
  cg_audit:
    rides:
      actions: [Json, Order, PullServer]
      order_key: "${DDMQ_TEST_ORDER_KEY}"
      timeout_ms: 5000
      retry_intervals_ms: [100, 1000]
      tags: [c]
      max_retry: 9
    payments:
      actions: [Json, Order, PullServer]
      order_key: "${DDMQ_TEST_ORDER_KEY}"
      timeout_ms: 5000
      retry_intervals_ms: [100, 1000]
      tags: [a, "${DDMQ_TEST_TAG:-b}"]
    refunds: {actions: [PullServer], retry_intervals_ms: [100, 1000]}
"""


def test_anchors_aliases_and_merges_load_as_the_file_written_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DDMQ_TEST_ORDER_KEY", "$.rider_id")
    monkeypatch.delenv("DDMQ_TEST_TAG", raising=False)
    shared, written_out = tmp_path / "shared.yaml", tmp_path / "written_out.yaml"
    shared.write_text(SHARED)
    written_out.write_text(WRITTEN_OUT)
    config = load(shared)
    assert config == load(written_out)
    rides, payments = config.groups["cg_rides"]["rides"], config.groups["cg_rides"]["payments"]
    assert (rides.order_key, rides.tags, rides.timeout_ms) == ("$.rider_id", ["a", "b"], 5000)
    assert (payments.order_key, payments.timeout_ms) == ("$.rider_id", 7000)
    assert config.groups["cg_audit"]["rides"].tags == ["c"]
    assert config.groups["cg_audit"]["refunds"].retry_intervals_ms == [100, 1000]
