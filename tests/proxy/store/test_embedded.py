"""EmbeddedRedis: a real private redis-server that keeps its data across restarts and crashes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ddmq.proxy.store.embedded import EmbeddedRedis, EmbeddedRedisError, find_executable


def _client(server: EmbeddedRedis) -> redis.Redis:
    return redis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan that exited waits for its new parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_start_and_stop(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path / "data")
    with pytest.raises(EmbeddedRedisError, match="not been started"):
        _ = server.url
    server.start()
    try:
        assert server.running
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        with _client(server) as client:
            assert client.ping()
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("bind") == {"bind": "127.0.0.1"}
        with pytest.raises(EmbeddedRedisError, match="already started"):
            server.start()
    finally:
        server.stop()
    assert not server.running
    assert (tmp_path / "data" / "redis.log").exists()
    with _client(server) as client, pytest.raises(redis.ConnectionError):
        client.ping()
    server.stop()  # stopping again is harmless


def test_url_file(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server:
        assert (tmp_path / "redis.url").read_text().strip() == server.url
    assert not (tmp_path / "redis.url").exists()


def test_explicit_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with EmbeddedRedis(tmp_path, port=port) as server:
        assert server.url == f"redis://127.0.0.1:{port}/0"


def test_appendfsync_policy(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path / "default") as server, _client(server) as client:
        assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
    with EmbeddedRedis(tmp_path / "always", appendfsync="always") as server, _client(server) as client:
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
    with pytest.raises(ValueError, match="appendfsync"):
        EmbeddedRedis(tmp_path / "bad", appendfsync="sometimes")


def test_data_survives_a_clean_restart(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as server, _client(server) as client:
        client.set("k", "v")
        client.xadd("s", {"f": "1"}, id="0-1")
    with EmbeddedRedis(tmp_path) as again, _client(again) as client:
        assert client.get("k") == b"v"
        assert client.xrange("s") == [(b"0-1", {b"f": b"1"})]


def test_data_survives_a_kill(tmp_path: Path) -> None:
    server = EmbeddedRedis(tmp_path).start()
    with _client(server) as client:
        client.set("k", "before crash")
    time.sleep(1.2)  # appendfsync everysec
    server.kill()
    assert not server.running
    assert (tmp_path / "redis.url").exists()  # a crash leaves it behind
    with EmbeddedRedis(tmp_path) as again, _client(again) as client:
        assert client.get("k") == b"before crash"
        assert (tmp_path / "redis.url").read_text().strip() == again.url
    server.stop()  # after kill(): nothing left to do


def test_a_live_owner_keeps_the_data_dir(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path):
        with pytest.raises(EmbeddedRedisError, match="in use"):
            EmbeddedRedis(tmp_path).start()


def test_a_server_left_by_a_dead_owner_is_shut_down_first(tmp_path: Path) -> None:
    # the owner dies without stop(): its redis-server (own session) keeps running, orphaned
    script = (
        "import os, sys, redis\n"
        "from ddmq.proxy.store.embedded import EmbeddedRedis\n"
        "server = EmbeddedRedis(sys.argv[1]).start()\n"
        "redis.Redis.from_url(server.url).set('k', 'from the orphan')\n"
        "print(server.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, timeout=60, check=True)
    orphan_pid = int(out.stdout)
    try:
        with EmbeddedRedis(tmp_path) as server, _client(server) as client:
            assert client.get("k") == b"from the orphan"  # flushed by the orphan's clean SHUTDOWN
            assert not _running(orphan_pid)
    finally:
        try:
            os.kill(orphan_pid, 9)
        except ProcessLookupError:
            pass


def test_missing_executable_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddedRedisError, match=r"no-such-redis-server.*not found"):
        EmbeddedRedis(tmp_path, executable=tmp_path / "no-such-redis-server").start()


def test_executable_that_dies_shows_its_log(tmp_path: Path) -> None:
    fake = tmp_path / "fake-redis-server"
    fake.write_text("#!/bin/sh\necho 'fake server: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(EmbeddedRedisError, match=r"(?s)exited with code 3.*fake server: cannot start"):
        EmbeddedRedis(tmp_path / "data", executable=fake).start()
    # the failed start released the data dir
    with EmbeddedRedis(tmp_path / "data") as server, _client(server) as client:
        assert client.ping()


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(EmbeddedRedisError, match="Address already in use"):
            EmbeddedRedis(tmp_path, port=busy.getsockname()[1]).start()


def test_default_executable_is_found() -> None:
    assert os.access(find_executable(), os.X_OK)
