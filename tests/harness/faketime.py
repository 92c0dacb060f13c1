"""Clock skew for one child process: Debian's libfaketime (``LD_PRELOAD``) shifts its wall clock and
scales the speed of its clocks, so a test can run one proxy of several with a skewed clock.

>>> child = ProxyChild(config_path, port, log_path, wrap=faketime_wrap(offset_s=10))   # wall +10 s
>>> child = ProxyChild(config_path, port, log_path, wrap=faketime_wrap(rate=2))        # clocks run 2x

What was measured (Debian bookworm's libfaketime 0.9.10, CPython 3.11, glibc 2.36, redis-py 7.4), and
what this module does about it:

* ``FAKETIME="+10.000000"`` (a relative offset, in seconds) shifts ``time.time()`` by the offset and
  keeps it running; ``FAKETIME="+0.000000 x2.000000"`` makes the clocks run at twice real speed (a rate
  needs an offset before it: ``"x2"`` alone is ignored, and ``"+0x2"`` is read as a 2 s offset,
  in hexadecimal, with rate 2). The rate counts from the process's start: the wall clock is ``real + offset`` when the
  process starts and drifts by ``(rate - 1)`` seconds per real second after that; each restart of the
  process starts again from ``real + offset``.
* By default libfaketime fakes the monotonic clocks too (``time.monotonic()``, ``perf_counter()``,
  asyncio's and uvloop's ``loop.time()``) at the same rate, and every wait is scaled to match:
  ``asyncio.sleep(1)`` takes 0.5 s of real time at x2 and 2 s at x0.5 on both loops, as do
  ``time.sleep``, socket timeouts, ``select`` and ``subprocess`` timeouts. The faked monotonic clock
  no longer counts from boot: it reads about the faked wall clock (1.8e9 s), so its values mean
  nothing to another process. CPU-time clocks (``time.process_time()``) are not faked.
* ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (or ``DONT_FAKE_MONOTONIC=1``) is *not* used: with it, every
  ``time.sleep`` raises ``OSError(EINVAL)`` (0.9.10's ``clock_nanosleep`` turns the real monotonic
  deadline into a negative one), so ``subprocess.run(timeout=...)`` and anything else that sleeps
  breaks; and with a rate, waits are still scaled while the clocks that measure them are not.
* With the monotonic clock faked, 0.9.10 does not intercept ``sem_clockwait``, which CPython 3.11
  uses for every timed lock wait: ``threading.Event.wait(1)``, ``Lock.acquire(timeout=1)``,
  ``queue.get(timeout=1)`` and ``Thread.join(timeout=1)`` then wait for good (the deadline is on the
  faked clock, 1.8e9 s, the kernel's is not). A small shim, compiled here with gcc and preloaded after
  libfaketime, redoes that deadline on the kernel's clock (libfaketime 0.9.11 and later define
  ``sem_clockwait`` themselves, and as they come first in ``LD_PRELOAD`` theirs is used then).
* The GIL's waits (``pthread_cond_timedwait`` on a monotonic condition variable) are right only with
  libfaketime's "forced monotonic fix", which 0.9.10 turns on from the glibc version (2.30 and later);
  ``FAKETIME_FORCE_MONOTONIC_FIX=1`` turns it on whatever the version says (with ``=0`` a thread that
  waits for the GIL waits for good).
* A child inherits the variables: a ``redis-server`` the faked process starts (the proxy's
  ``redis: embedded`` mode) would run on the faked clock too, so ``FAKETIME_SKIP_CMDS`` leaves it
  alone. Redis is the reference clock of a skew test: start it outside the faked process anyway.
* File timestamps are not faked (``os.stat`` gives real times, so a file the faked process just wrote
  looks ``offset`` seconds old to it).
* ``FAKETIME_NO_CACHE=1`` and ``FAKETIME_DONT_RESET=1`` change nothing here (the first re-reads the
  setting on every clock call, at twice the cost; the second is for ``@date`` start times), so neither
  is set. ``libfaketime.so.1`` is used, not ``libfaketimeMT.so.1``: the MT one serialises every clock
  call through a semaphore (5x slower) and is not needed, as the setting never changes at run time.
* Each faked process keeps ``/dev/shm/faketime_shm_PID`` and ``/dev/shm/sem.faketime_sem_PID`` while
  it runs and removes them when it exits normally; one killed (SIGKILL, or SIGTERM without a handler)
  leaves them behind (harmless, but they pile up): :func:`faketime_cleanup` removes them.
* Start-up is barely slower (``python -m ddmq.proxy --version``: 0.75 s against 0.65 s), nothing hangs,
  and a redis-py asyncio client works as usual (PING, SET/GET; ``XREAD BLOCK 500`` returns after
  ~0.5 s of real time, Redis's, which the faked process sees as ~1 s at x2).
* Debian's ``faketime`` wrapper (``faketime -f SPEC cmd``) is not used: it forks and waits, so the pid
  a test gets is the wrapper's, and a SIGTERM sent to it does not reach the program. ``env`` execs.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path

__all__ = ["faketime_cleanup", "faketime_env", "faketime_library", "faketime_wrap"]

#: Debian's package with the library; ``faketime`` (the wrapper binary) depends on it.
LIBRARY_PACKAGE = "libfaketime"
_LIBRARY_NAME = "libfaketime.so.1"
_LIBRARY_GLOBS = (f"/usr/lib/*/faketime/{_LIBRARY_NAME}", f"/usr/lib/faketime/{_LIBRARY_NAME}",
                  f"/usr/local/lib/faketime/{_LIBRARY_NAME}")

# Variables of the parent's that would undo what faketime_env sets up, removed from the child's
# environment: real monotonic clocks (see the docstring), another process's start time to share, and
# FAKETIME_ONLY_CMDS, which libfaketime refuses next to FAKETIME_SKIP_CMDS (it exits).
_UNSET = ("FAKETIME_DONT_FAKE_MONOTONIC", "DONT_FAKE_MONOTONIC", "FAKETIME_SHARED", "FAKETIME_ONLY_CMDS")

# sem_clockwait on the kernel's clock: the time left until the caller's deadline, on the faked clock
# (libfaketime's clock_gettime, the clock the deadline was computed on), divided by the rate, from now
# on the kernel's clock (a raw syscall, past libfaketime). Reads the rate from FAKETIME as libfaketime
# does (the number after its 'x').
_SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int (*real_sem_clockwait)(sem_t *, clockid_t, const struct timespec *);

static double faked_rate(void) {
    const char *spec = getenv("FAKETIME");
    const char *x = spec ? strchr(spec, 'x') : NULL;
    double rate = x ? strtod(x + 1, NULL) : 1.0;
    return rate > 0 ? rate : 1.0;
}

int sem_clockwait(sem_t *sem, clockid_t clock, const struct timespec *abstime) {
    if (!real_sem_clockwait)
        real_sem_clockwait = (int (*)(sem_t *, clockid_t, const struct timespec *))dlsym(RTLD_NEXT, "sem_clockwait");
    if (clock != CLOCK_MONOTONIC && clock != CLOCK_REALTIME)
        return real_sem_clockwait(sem, clock, abstime);
    struct timespec faked, real, deadline;
    clock_gettime(clock, &faked);
    syscall(SYS_clock_gettime, clock, &real);
    double left = (double)(abstime->tv_sec - faked.tv_sec) + (abstime->tv_nsec - faked.tv_nsec) / 1e9;
    left = left > 0 ? left / faked_rate() : 0;
    long long ns = real.tv_nsec + (long long)((left - (double)(long long)left) * 1e9);
    deadline.tv_sec = real.tv_sec + (time_t)left + (time_t)(ns / 1000000000LL);
    deadline.tv_nsec = (long)(ns % 1000000000LL);
    return real_sem_clockwait(sem, clock, &deadline);
}
"""


def _find_library() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        listed = subprocess.run(["dpkg", "-L", LIBRARY_PACKAGE], capture_output=True, text=True, timeout=30)
        for line in listed.stdout.splitlines():
            if line.endswith("/" + _LIBRARY_NAME) and os.path.isfile(line):
                return line
    for pattern in _LIBRARY_GLOBS:  # a build from source, or no dpkg
        for path in sorted(glob.glob(pattern)):
            return path
    return None


@cache
def faketime_library() -> str:
    """The path of libfaketime's shared object (``/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1``
    on Debian); Debian's ``faketime`` package (which brings ``libfaketime``) is installed with apt-get
    when it is missing and the suite runs as root, else the test fails saying what to install."""
    path = _find_library()
    if path is None:
        from tests.support import debian_tool

        debian_tool("faketime")  # fails the test itself when it cannot install
        path = _find_library()
    if path is None:
        import pytest

        pytest.fail(f"this test needs {_LIBRARY_NAME}: run `apt-get install -y faketime` as root")
    return path


@cache
def _shim_library() -> str:
    """The compiled ``sem_clockwait`` shim, built once per source version in the temp directory
    (atomically: parallel test processes may build it at once)."""
    from tests.support import debian_tool

    digest = hashlib.sha256(_SHIM_SOURCE.encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "ddmq-faketime"
    target = folder / f"clockwait-{digest}.so"
    if target.exists():
        return str(target)
    gcc = debian_tool("gcc")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as work:
        source, built = Path(work) / "clockwait.c", Path(work) / "clockwait.so"
        source.write_text(_SHIM_SOURCE)
        done = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(built), str(source)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            import pytest

            pytest.fail(f"compiling the faketime sem_clockwait shim failed:\n{done.stderr}")
        os.replace(built, target)
    return str(target)


def _spec(offset_s: float, rate: float) -> str:
    # Fixed-point, never exponent notation (libfaketime reads it with atof), in seconds: no 'm', 'h',
    # 'd' or 'y' may appear anywhere in it, as libfaketime multiplies the offset by the first it finds.
    # The decimal point is read in the C locale, which CPython keeps for numbers.
    spec = f"{offset_s:+.6f}"
    return spec if rate == 1 else f"{spec} x{rate:.6f}"


def faketime_env(offset_s: float = 0.0, rate: float = 1.0) -> dict[str, str]:
    """The environment variables that make a child process see its wall clock ``offset_s`` seconds
    ahead of the real one (behind when negative) at its start, and all its clocks, wall and monotonic,
    and its waits run at ``rate`` times real speed. Merge them into the child's environment (and
    remove ``FAKETIME_DONT_FAKE_MONOTONIC`` from it), or use :func:`faketime_wrap`."""
    if not rate > 0:
        raise ValueError(f"the rate must be positive, not {rate}")
    # libfaketime first, so that its own sem_clockwait (0.9.11+) wins over the shim's where it has one;
    # an LD_PRELOAD already in the environment (a sanitizer) stays after them.
    preload = [faketime_library(), _shim_library()]
    inherited = os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":")
    preload += [lib for lib in inherited if lib and lib not in preload]
    return {
        "LD_PRELOAD": ":".join(preload),
        "FAKETIME": _spec(offset_s, rate),
        "FAKETIME_FORCE_MONOTONIC_FIX": "1",  # the GIL's timed waits (see the module's docstring)
        "FAKETIME_SKIP_CMDS": "redis-server",  # an embedded Redis keeps the real clock
    }


def faketime_wrap(offset_s: float = 0.0, rate: float = 1.0) -> Callable[[list[str]], list[str]]:
    """A command rewriter for ``ProxyChild(..., wrap=...)``: runs the command through ``env`` with
    :func:`faketime_env`'s variables (``env`` execs, so the pid stays the command's). The library and
    the shim are found or built now, so a missing tool fails the test before anything starts."""
    variables = faketime_env(offset_s, rate)
    env = shutil.which("env") or "/usr/bin/env"
    prefix = [env, *(arg for name in _UNSET for arg in ("-u", name)), *(f"{k}={v}" for k, v in variables.items())]

    def wrap(command: list[str]) -> list[str]:
        return [*prefix, *command]

    return wrap


def faketime_cleanup(pid: int) -> None:
    """Remove the shared-memory files libfaketime left for process ``pid`` (it removes them itself
    when the process exits normally; a killed one leaves them)."""
    for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")
