"""The one launcher of a proxy child process (client/cli/proxy_process.py), against a real proxy and Redis."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ddmq.client.cli.proxy_process import ProxyChild, ProxyProcessError, port_open, write_config
from ddmq.protocol.native import describe
from ddmq.protocol.net import free_port


def _config(tmp_path: Path, redis_url: str, port: int) -> Path:
    return write_config(tmp_path / "proxy.yaml", {
        "instance_id": "launcher-test",
        "redis": redis_url,
        "thrift": {"host": "127.0.0.1", "port": port},
        "topics": {"t": {"queues": 2}},
        "groups": {"g": {"t": {"actions": ["PullServer"]}}},
    })


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_start_waits_until_listening_and_stop_drains(tmp_path: Path, redis_url: str, loop: str) -> None:
    port = free_port()
    child = ProxyChild(_config(tmp_path, redis_url, port), port, tmp_path / "proxy.log", args=["--loop", loop])
    child.start(timeout_s=30)
    try:
        assert child.running() and port_open(port)
    finally:
        code = child.stop(timeout_s=30)
    assert code == 0, child.log_tail()
    assert not child.running() and not port_open(port)
    # its first line says which loop and hot path it ran: the hot path of this very install
    assert f"{describe(loop)}\n" in child.log_tail(), child.log_tail()


def test_a_proxy_that_exits_at_start_raises_with_its_log(tmp_path: Path) -> None:
    config = tmp_path / "proxy.yaml"
    config.write_text("groups: [this is not a mapping\n")
    child = ProxyChild(config, free_port(), tmp_path / "proxy.log")
    with pytest.raises(ProxyProcessError, match="exited with") as caught:
        child.start(timeout_s=30)
    assert "proxy.yaml" in str(caught.value) or "config" in str(caught.value).lower()
    assert not child.running()


def test_kill_ends_it_as_a_crash_would(tmp_path: Path, redis_url: str) -> None:
    port = free_port()
    child = ProxyChild(_config(tmp_path, redis_url, port), port, tmp_path / "proxy.log")
    child.start(timeout_s=30)
    child.kill()
    assert not child.running()
    assert child.stop() == -signal.SIGKILL


def test_a_proxy_not_listening_in_time_is_killed(tmp_path: Path, redis_url: str) -> None:
    port, other = free_port(), free_port()
    # it listens on `port`, but the launcher watches `other`
    child = ProxyChild(_config(tmp_path, redis_url, port), other, tmp_path / "proxy.log")
    with pytest.raises(ProxyProcessError, match="not listening within"):
        child.start(timeout_s=3)
    assert not child.running()
