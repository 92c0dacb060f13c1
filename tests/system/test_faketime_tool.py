"""The clock-skew tool (:mod:`tests.harness.faketime`): a child started through ``faketime_wrap`` sees
its wall clock shifted and its monotonic clock sped up, and its timed waits still end (the
``sem_clockwait`` shim)."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.harness.faketime import faketime_cleanup, faketime_wrap

# The child prints one clock reading, then another each time it reads a line from stdin (a blocking
# read without a timeout: nothing the faked clock could stretch), until stdin closes.
READINGS = """
import sys, time
clock = getattr(time, sys.argv[1])
print(clock(), flush=True)
for _ in sys.stdin:
    print(clock(), flush=True)
"""


class Child:
    """A ``python -c`` child through ``wrap``, read line by line with deadlines."""

    def __init__(self, wrap: Callable[[list[str]], list[str]], code: str, *args: str) -> None:
        self.proc = subprocess.Popen(wrap([sys.executable, "-c", code, *args]), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._buffer = b""

    def line(self, timeout_s: float = 20.0) -> tuple[str, float]:
        """The next line and the parent's monotonic clock when it arrived."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not self._selector.select(left):
                pytest.fail(f"no line from the child within {timeout_s}s")
            chunk = os.read(self.proc.stdout.fileno(), 4096)  # type: ignore[union-attr]
            if not chunk:
                pytest.fail(f"the child exited: {self.proc.wait()} {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode(), time.monotonic()

    def send(self) -> None:
        self.proc.stdin.write(b"\n")  # type: ignore[union-attr]

    def close(self) -> None:
        self._selector.close()
        self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            faketime_cleanup(self.proc.pid)
        self.proc.stdout.close()  # type: ignore[union-attr]
        self.proc.stderr.close()  # type: ignore[union-attr]


def test_an_offset_shifts_the_wall_clock() -> None:
    child = Child(faketime_wrap(10, 1), READINGS, "time")
    try:
        seen, _ = child.line()
        now = time.time()
        # The child's reading is at most its start-up old; ahead by 10 s, within 1 s.
        assert abs(float(seen) - now - 10) < 1, float(seen) - now
    finally:
        child.close()


def test_a_rate_speeds_up_the_monotonic_clock() -> None:
    child = Child(faketime_wrap(0, 2), READINGS, "monotonic")
    try:
        first, real_first = child.line()
        time.sleep(1.0)
        child.send()
        second, real_second = child.line()
        faked, real = float(second) - float(first), real_second - real_first
        assert real >= 1.0
        assert 1.8 < faked / real < 2.2, (faked, real)
    finally:
        child.close()


@pytest.mark.parametrize("rate", [1.0, 2.0])
def test_timed_waits_still_end(rate: float) -> None:
    # Without the shim a timed lock wait under libfaketime 0.9.10 never ends (the module's docstring).
    code = (
        "import threading, time\n"
        "sleeper = threading.Thread(target=time.sleep, args=(30,), daemon=True); sleeper.start()\n"
        "threading.Event().wait(0.5); sleeper.join(timeout=0.5)\n"
        "print('done', flush=True)\n"
    )
    start = time.monotonic()
    child = Child(faketime_wrap(10, rate), code)
    try:
        assert child.line(timeout_s=10)[0] == "done"
        # 1 s on the child's clock is 1/rate s of real time (plus the child's start-up).
        assert 0.9 / rate < time.monotonic() - start < 1 / rate + 3
    finally:
        child.close()
