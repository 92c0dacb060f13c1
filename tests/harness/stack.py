"""The processes a test, a benchmark or the soak runs against: a private Redis (or Redis Cluster) in a
temporary directory, and a real proxy process with a config written here, plus ``/proc`` readings.

>>> with RedisServer() as redis_server:
...     with ProxyRun(redis_server.url, groups={...}, topics={...}) as proxy:
...         print(proxy.port, proxy.rss_mb())

They wrap the product's own launchers (``EmbeddedRedis``, ``EmbeddedCluster``,
:class:`~ddmq.client.cli.proxy_process.ProxyChild`, ``free_port``) with what a run needs around them:
temporary folders, a config from sections, crash and restart, and errors that end a run
(:class:`HarnessError`). ``tests/support.py``'s ``ProxyProcess`` is the tests' flavour of
:class:`ProxyRun`; ``bench/profiler.py`` profiles one.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from ddmq.client.cli.proxy_process import ProxyChild, ProxyProcessError, write_config
from ddmq.protocol.native import resolve_loop
from ddmq.protocol.net import free_port
from ddmq.proxy.store.embedded import EmbeddedRedis
from ddmq.proxy.store.embedded_cluster import EmbeddedCluster

__all__ = [
    "ClusterServer",
    "HarnessError",
    "ProcessProfiler",
    "ProxyRun",
    "RedisServer",
    "cpu_seconds",
    "free_port",
    "rss_mb",
]

#: The event loop of the proxy and of the client process (``python bench/run.py --loop``), inherited
#: through the environment by every process the bench starts.
LOOP_ENV = "DDMQ_BENCH_LOOP"


def loop_choice() -> str:
    """``uvloop`` or ``asyncio``: what :data:`LOOP_ENV` asks for (auto: uvloop where installed)."""
    return resolve_loop(os.environ.get(LOOP_ENV, "auto"))


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class HarnessError(RuntimeError):
    """The harness itself broke (a process did not start, a load crashed): the run exits non-zero."""


def rss_mb(pid: int) -> float:
    """Resident set size of ``pid`` in MiB, from ``VmRSS`` in ``/proc/<pid>/status``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise HarnessError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


class RedisServer:
    """An ``EmbeddedRedis`` in a temporary directory that is deleted on :meth:`stop`.

    :meth:`kill` and :meth:`restart` crash it and bring it back on the same port from its AOF (the
    soak's Redis fault); ``appendfsync`` is passed on to ``EmbeddedRedis``.
    """

    def __init__(self, *, appendfsync: str = "everysec") -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="ddmq-bench-redis-"))
        self._appendfsync = appendfsync
        self._server = EmbeddedRedis(self._dir / "data", appendfsync=appendfsync)

    @property
    def url(self) -> str:
        return str(self._server.url)

    @property
    def pid(self) -> int:
        pid = self._server.pid
        if pid is None:
            raise HarnessError("redis is not running")
        return int(pid)

    @property
    def pids(self) -> list[int]:
        return [self.pid]

    def start(self) -> RedisServer:
        self._server.start()
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        self._server.kill()

    def restart(self) -> None:
        """Start again on the same port and data dir (after :meth:`kill`): Redis replays its AOF."""
        port = self._server.port
        self._server = EmbeddedRedis(self._dir / "data", port=port, appendfsync=self._appendfsync).start()

    def stop(self) -> None:
        try:
            self._server.stop()
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ClusterServer:
    """A Redis Cluster of ``masters`` masters without replicas (``EmbeddedCluster``) in a temporary
    directory, deleted on :meth:`stop`; the same ``url`` / ``pids`` surface as :class:`RedisServer`."""

    def __init__(self, masters: int = 3) -> None:
        self._cluster = EmbeddedCluster(tempfile.mkdtemp(prefix="ddmq-bench-cluster-"), masters=masters, replicas=0)

    @property
    def url(self) -> str:
        return self._cluster.url

    @property
    def pids(self) -> list[int]:
        return [node.process.pid for node in self._cluster.nodes if node.process is not None]

    def __enter__(self) -> ClusterServer:
        self._cluster.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._cluster.stop()


class ProcessProfiler(Protocol):
    """What profiles a :class:`ProxyRun` (``bench/profiler.py``'s ``Profiler``): it may rewrite the
    command, is told the pid once the proxy listens, and reports once the proxy exited."""

    def wrap(self, command: list[str]) -> list[str]: ...

    def attach(self, pid: int) -> None: ...

    def finish(self) -> Any: ...


class ProxyRun:
    """A ``python -m ddmq.proxy --config FILE`` child process with a config written here, restartable
    on the same port (each start is a new process).

    The config is ``instance_id``, ``redis``, ``thrift`` (a free port), :attr:`SETTINGS`, ``topics``,
    ``groups`` and then ``extra`` (which may override any of them). It lives in ``folder``, or in a
    temporary folder deleted at the end of a ``with`` block. The class attributes are a benchmark's
    defaults (quiet log, a short shutdown grace); a subclass sets its own.
    """

    INSTANCE_ID = "bench-proxy"
    SETTINGS: dict[str, Any] = {"shutdown_grace_ms": 500}
    ARGS: tuple[str, ...] = ("--log-level", "WARNING")

    def __init__(
        self,
        redis_url: str,
        *,
        groups: dict[str, Any],
        topics: dict[str, Any],
        folder: Path | None = None,
        profiler: ProcessProfiler | None = None,
        start_timeout_s: float = 30.0,
        **extra: Any,
    ) -> None:
        self._own_folder = folder is None
        self._dir = Path(tempfile.mkdtemp(prefix="ddmq-proxy-")) if folder is None else folder
        self._dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.config_path = self._dir / "proxy.yaml"
        self.log_path = self._dir / "proxy.log"
        self.profiler = profiler
        self.profile: Any = None
        self._start_timeout_s = start_timeout_s
        config = {
            "instance_id": self.INSTANCE_ID,
            "redis": redis_url,
            "thrift": {"host": "127.0.0.1", "port": self.port},
            **self.SETTINGS,
            "topics": topics,
            "groups": groups,
            **extra,
        }
        write_config(self.config_path, config)
        self.child = ProxyChild(
            self.config_path, self.port, self.log_path, args=[*self.ARGS, "--loop", loop_choice()],
            wrap=profiler.wrap if profiler is not None else None,
        )
        self._killed = False

    @property
    def pid(self) -> int:
        try:
            return self.child.pid
        except ProxyProcessError as exc:
            raise HarnessError(str(exc)) from None

    def start(self, before_exec: Callable[[], None] | None = None) -> ProxyRun:
        """Start it and wait until it listens; ``before_exec`` runs in the child before it execs."""
        try:
            proc = self.child.start(self._start_timeout_s, before_exec)
        except ProxyProcessError as exc:
            raise HarnessError(str(exc)) from None
        if self.profiler is not None:
            self.profiler.attach(proc.pid)
        return self

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the proxy drains and flushes offsets), SIGKILL if it hangs; returns the exit code."""
        if self.child.proc is None:
            return 0
        code = self.child.stop(timeout_s)
        if self.profiler is not None and self.profile is None:
            self.profile = self.profiler.finish()
        return code

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.child.running():
            self._killed = True
            self.child.kill()

    def log_tail(self, chars: int = 4000) -> str:
        return self.child.log_tail(chars)

    def __enter__(self) -> ProxyRun:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        code = self.stop()
        failed = code not in (0, -signal.SIGTERM) and not self._killed
        if failed or exc is not None:
            print(f"proxy log ({self.log_path}), last lines:\n{self.log_tail()}", file=sys.stderr)
        if self._own_folder:
            shutil.rmtree(self._dir, ignore_errors=True)
        if failed and exc is None:
            raise HarnessError(f"the proxy exited with {code}")
