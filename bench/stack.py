"""What a scenario runs against: a private Redis, a real proxy process, and readings from ``/proc``.

>>> with RedisServer() as redis_server:
...     with ProxyRun(redis_server.url, groups={...}, topics={...}) as proxy:
...         print(proxy.port, proxy.rss_mb())

Each scenario gets its own :class:`RedisServer` (``EmbeddedRedis`` on a free port in a temp dir) and
its own :class:`ProxyRun` (``python -m ddmq.proxy --config FILE`` with a config written here), and
stops both, so no scenario sees another's data, keys or warm caches.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from ddmq.protocol.native import resolve_loop
from ddmq.protocol.net import free_port
from ddmq.protocol.proxy_process import ProxyChild, ProxyProcessError, write_config
from ddmq.proxy.store.embedded import EmbeddedRedis
from ddmq.proxy.store.embedded_cluster import EmbeddedCluster

__all__ = [
    "ClusterServer",
    "HarnessError",
    "ProfileReport",
    "Profiler",
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


@dataclass
class ProfileReport:
    """Where a profile went and, for py-spy, the functions with the most self time (samples)."""

    tool: str
    output: Path | None
    top_self: list[tuple[str, int]] = field(default_factory=list)
    samples: int = 0
    #: Samples with no Python frame at all (a thread in native code); not in ``samples``.
    unattributed: int = 0
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        total = max(self.samples, 1)
        return {
            "tool": self.tool,
            "output": str(self.output) if self.output else None,
            "samples": self.samples,
            "unattributed_samples": self.unattributed,
            "top_self": [
                {"function": name, "samples": count, "percent": round(100 * count / total, 1)}
                for name, count in self.top_self
            ],
            "note": self.note,
        }


class Profiler:
    """Profiles one proxy process: py-spy if installed, else pyinstrument, else nothing (says why).

    py-spy attaches to the running proxy by pid once it listens, so start-up imports stay out of the
    profile and the harness keeps the proxy's own pid (for SIGTERM, RSS and CPU readings). Two
    non-blocking samplers run side by side: one writes the flame graph, the other collapsed stacks from
    which the self time per function is counted. pyinstrument cannot attach, so it wraps the proxy's
    command (``python -m pyinstrument -r html -o FILE -m ddmq.proxy ...``), which keeps the pid too.
    """

    RATE_HZ = 200

    def __init__(self, out_dir: Path, stem: str) -> None:
        self.out_dir = out_dir
        self.stem = stem
        self.py_spy = shutil.which("py-spy") or _venv_tool("py-spy")
        self.pyinstrument = self.py_spy is None and _has_module("pyinstrument")
        self._samplers: list[subprocess.Popen[bytes]] = []
        self._raw: Path | None = None

    @property
    def tool(self) -> str | None:
        if self.py_spy:
            return "py-spy"
        return "pyinstrument" if self.pyinstrument else None

    def wrap(self, command: list[str]) -> list[str]:
        """The proxy's command, wrapped by pyinstrument when that is the profiler."""
        if self.tool != "pyinstrument":
            return command
        self.out_dir.mkdir(parents=True, exist_ok=True)
        output = self.out_dir / f"{self.stem}.html"
        assert command[1:3] == ["-m", "ddmq.proxy"]
        return [command[0], "-m", "pyinstrument", "-r", "html", "-o", str(output), *command[1:]]

    def attach(self, pid: int) -> None:
        if self.tool != "py-spy":
            return
        assert self.py_spy is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._raw = self.out_dir / f"{self.stem}.collapsed.txt"
        common = [self.py_spy, "record", "--pid", str(pid), "--rate", str(self.RATE_HZ), "--nonblocking"]
        for fmt, output in (("flamegraph", self.out_dir / f"{self.stem}.svg"), ("raw", self._raw)):
            self._samplers.append(subprocess.Popen(
                [*common, "--format", fmt, "-o", str(output)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))

    def finish(self) -> ProfileReport:
        """After the proxy exited: wait for the samplers to write, then read the collapsed stacks."""
        if self.tool is None:
            return ProfileReport(
                "none", None, note="no profiler found: pip install py-spy (or pyinstrument) into this venv"
            )
        if self.tool == "pyinstrument":
            return ProfileReport("pyinstrument", self.out_dir / f"{self.stem}.html", note="open the HTML report")
        for sampler in self._samplers:
            try:
                sampler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                sampler.send_signal(signal.SIGINT)
                sampler.wait(timeout=10)
        report = ProfileReport("py-spy", self.out_dir / f"{self.stem}.svg")
        if self._raw is not None and self._raw.exists():
            report.top_self, report.samples, report.unattributed = top_self_time(self._raw.read_text())
        else:
            report.note = "py-spy wrote no samples (is ptrace allowed here?)"
        return report


def top_self_time(collapsed: str, count: int = 5) -> tuple[list[tuple[str, int]], int, int]:
    """The ``count`` functions with the most self samples in py-spy's raw (collapsed) output, the
    samples with a Python stack, and those without one.

    Each line is ``frame;frame;...;leaf N``; a frame is ``function (file:line)``. Self time belongs to
    the leaf; line numbers are dropped so a function's lines add up.
    """
    selves: Counter[str] = Counter()
    total = unattributed = 0
    for line in collapsed.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not samples.isdigit():
            continue
        if not stack.strip():
            unattributed += int(samples)
            continue
        leaf = stack.rsplit(";", 1)[-1]
        name, _, where = leaf.partition(" (")
        file = where.rstrip(")").rsplit(":", 1)[0]
        selves[f"{name} ({_short_path(file)})"] += int(samples)
        total += int(samples)
    return selves.most_common(count), total, unattributed


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/lib/python3", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _venv_tool(name: str) -> str | None:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if os.access(candidate, os.X_OK) else None


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


class ProxyRun:
    """A ``python -m ddmq.proxy --config FILE`` child process with a config written here.

    ``groups`` and ``topics`` are the config's sections; ``commit_interval_ms`` is left at its default.
    """

    def __init__(
        self,
        redis_url: str,
        *,
        groups: dict[str, Any],
        topics: dict[str, Any],
        profiler: Profiler | None = None,
        start_timeout_s: float = 30.0,
        **extra: Any,
    ) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="ddmq-bench-proxy-"))
        self.port = free_port()
        self.config_path = self._dir / "proxy.yaml"
        self.log_path = self._dir / "proxy.log"
        self.profiler = profiler
        self.profile: ProfileReport | None = None
        self._start_timeout_s = start_timeout_s
        config = {
            "instance_id": "bench-proxy",
            "redis": redis_url,
            "thrift": {"host": "127.0.0.1", "port": self.port},
            "shutdown_grace_ms": 500,
            "topics": topics,
            "groups": groups,
            **extra,
        }
        write_config(self.config_path, config)
        self._child = ProxyChild(
            self.config_path, self.port, self.log_path, args=["--log-level", "WARNING", "--loop", loop_choice()],
            wrap=profiler.wrap if profiler is not None else None,
        )
        self._killed = False

    @property
    def pid(self) -> int:
        try:
            return self._child.pid
        except ProxyProcessError as exc:
            raise HarnessError(str(exc)) from None

    def start(self) -> ProxyRun:
        try:
            proc = self._child.start(self._start_timeout_s)
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
        if self._child.proc is None:
            return 0
        code = self._child.stop(timeout_s)
        if self.profiler is not None and self.profile is None:
            self.profile = self.profiler.finish()
        return code

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self._child.running():
            self._killed = True
            self._child.kill()

    def log_tail(self, chars: int = 4000) -> str:
        return self._child.log_tail(chars)

    def __enter__(self) -> ProxyRun:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        code = self.stop()
        failed = code not in (0, -signal.SIGTERM) and not self._killed
        if failed or exc is not None:
            print(f"proxy log ({self.log_path}), last lines:\n{self.log_tail()}", file=sys.stderr)
        shutil.rmtree(self._dir, ignore_errors=True)
        if failed and exc is None:
            raise HarnessError(f"the proxy exited with {code}")
