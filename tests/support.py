"""Test support: a real ``ddmq-proxy`` process, and the per-key order/no-loss checker."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ProxyProcess:
    """``python -m ddmq.proxy --config FILE`` as a child process, restartable on the same port."""

    def __init__(self, tmp_path: Path, redis_url: str, groups: dict[str, Any], topics: dict[str, Any],
                 **extra: Any) -> None:
        self.port = free_port()
        self.config_path = tmp_path / "proxy.yaml"
        self.log_path = tmp_path / "proxy.log"
        config = {
            "instance_id": "e2e-proxy",
            "redis": redis_url,
            "thrift": {"host": "127.0.0.1", "port": self.port},
            "commit_interval_ms": 100,
            "topics": topics,
            "groups": groups,
            **extra,
        }
        self.config_path.write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30) -> ProxyProcess:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ddmq.proxy", "--config", str(self.config_path)],
                stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"proxy did not listen within {timeout_s}s:\n{self.log()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""


@dataclass
class OrderChecker:
    """Per-key order and no-loss over a whole run, across crashes.

    Each key's messages carry ``seq`` 0, 1, 2, ... A delivery is legal when it is the key's current
    head (first delivery, or a redelivery of the head) within the current *epoch*. After a proxy
    crash (:meth:`new_epoch`) a key may replay from its committed offset: its first delivery in the
    epoch may be any seq up to what was acked, and from there it must again go head by head. A
    delivery past an unacked predecessor is a violation, always.
    """

    acked_upto: dict[str, int] = field(default_factory=dict)  # key -> seqs 0..n-1 acked at least once
    epoch_head: dict[str, int] = field(default_factory=dict)
    deliveries: int = 0
    duplicates: int = 0
    violations: list[str] = field(default_factory=list)

    def delivered(self, key: str, seq: int) -> None:
        self.deliveries += 1
        head = self.epoch_head.get(key)
        acked = self.acked_upto.get(key, 0)
        if head is None:
            if seq > acked:
                self.violations.append(f"{key}: seq {seq} delivered before seq {acked} was acked")
            elif seq < acked:
                self.duplicates += 1
            self.epoch_head[key] = seq
        elif seq != head:
            self.violations.append(f"{key}: seq {seq} delivered while the head is {head}")
        elif seq < acked:
            self.duplicates += 1

    def acked(self, key: str, seq: int) -> None:
        self.epoch_head[key] = seq + 1
        if seq + 1 > self.acked_upto.get(key, 0):
            self.acked_upto[key] = seq + 1

    def new_epoch(self) -> None:
        self.epoch_head.clear()

    def missing(self, produced: dict[str, int]) -> dict[str, tuple[int, int]]:
        """Keys whose acked prefix is shorter than what was produced: key -> (acked, produced)."""
        return {k: (self.acked_upto.get(k, 0), n) for k, n in produced.items() if self.acked_upto.get(k, 0) != n}


def body(key: str, seq: int) -> str:
    return json.dumps({"k": key, "seq": seq})
