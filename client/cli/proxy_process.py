"""A ``ddmq-proxy`` child process on this host: ``python -m ddmq.proxy --config FILE``, started, waited
for until it listens, stopped with SIGTERM (it drains and flushes offsets) or killed as a crash would.

The demo (``ddmq demo``) and the one harness of the tests, the soak and the benchmarks
(``tests/harness/stack.py``) launch the proxy this way; each writes its own config and keeps its own
bookkeeping around this one launcher.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from ddmq.protocol.errors import DdmqError


class ProxyProcessError(DdmqError, RuntimeError):
    """The proxy exited, or did not listen in time; the message ends with the tail of its log. Not
    retriable: the log says what to change first."""

    retriable = False


def write_config(path: Path, config: dict[str, object]) -> Path:
    """``config`` as YAML at ``path``, sections in the order given."""
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class ProxyChild:
    """One proxy process, writing its output to ``log_path``; restartable (each start is a new process).

    ``args`` go after ``--config FILE``; ``wrap`` rewrites the command (a profiler's prefix);
    ``before_exec`` runs in the child before it execs (resource limits).
    """

    def __init__(
        self,
        config_path: Path,
        port: int,
        log_path: Path,
        *,
        args: Sequence[str] = (),
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        self.config_path, self.port, self.log_path = config_path, port, log_path
        self._args, self._wrap = list(args), wrap
        self.proc: subprocess.Popen[bytes] | None = None

    def wrap(self, wrap: Callable[[list[str]], list[str]] | None) -> None:
        """Rewrite the command with ``wrap`` from the next start on (None: as it is)."""
        self._wrap = wrap

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ProxyProcessError("the proxy is not running")
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 30.0, before_exec: Callable[[], None] | None = None) -> subprocess.Popen[bytes]:
        """Start the process and wait until its Thrift port accepts connections; a process that exits
        first, or does not listen within ``timeout_s`` (it is then killed), raises ProxyProcessError."""
        command = [sys.executable, "-m", "ddmq.proxy", "--config", str(self.config_path), *self._args]
        if self._wrap is not None:
            command = self._wrap(command)
        with self.log_path.open("ab") as log:
            self.proc = proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=before_exec)
        self.wait_until(lambda: port_open(self.port), timeout_s, "listening")
        return proc

    def wait_until(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``predicate`` until it holds; the process exiting first, or ``timeout_s`` passing (the
        process is then killed), raises ProxyProcessError naming ``what`` was awaited."""
        proc = self.proc
        assert proc is not None, "start() first"
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if proc.poll() is not None:
                raise ProxyProcessError(f"the proxy exited with {proc.returncode} before {what}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise ProxyProcessError(f"the proxy was not {what} within {timeout_s:g}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit within ``timeout_s``. Returns the exit code
        (``-SIGKILL`` when it had to be killed); 0 when it never started."""
        proc = self.proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, chars: int = 5000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""
