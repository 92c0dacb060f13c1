"""The client process: one separate Python process that runs a scenario's whole client-side load.

The proxy is one process on one core; on a 2-core machine the clients must not share that core with
the harness, so every load (Thrift pull clients, raw Redis consumers, XREAD readers) runs in ONE
spawned process, on asyncio, with several connections. The harness process stays mostly idle while
it waits (it only samples ``/proc`` and, in P4, produces at a steady rate).

>>> with ClientProcess(clients.drain_raw, spec) as load:
...     load.wait_ready(30)
...     result = load.result(120)

A load is an ``async def load(spec, ready) -> dict`` at module level (so it pickles by reference);
it calls ``ready()`` once its connections are up and returns a JSON-able dict. ``ready()`` settles the
process's heap first (:func:`ddmq.protocol.native.settle_heap`), as the proxy does once started.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import traceback
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from ddmq.protocol.native import loop_factory, settle_heap
from tests.harness.stack import HarnessError, loop_choice

__all__ = ["ClientProcess", "Load", "Ready"]

Ready = Callable[[], None]
Load = Callable[[Any, Ready], Coroutine[Any, Any, dict[str, Any]]]

_context = multiprocessing.get_context("spawn")  # no inherited sockets, loops or threads


def _child(conn: Connection, load: Load, spec: Any) -> None:
    def ready() -> None:
        # Settled as the proxy settles its own: a full collection over the imports' objects is a pause
        # of the measuring client, inside the window it measures (bench/README.md, "How it runs").
        settle_heap()
        conn.send(("ready", None))

    try:
        with asyncio.Runner(loop_factory=loop_factory(loop_choice())) as runner:
            result: dict[str, Any] = runner.run(load(spec, ready))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
    else:
        conn.send(("result", result))
    finally:
        conn.close()


class ClientProcess:
    def __init__(self, load: Load, spec: Any) -> None:
        self._parent, child = _context.Pipe(duplex=False)
        self._process = _context.Process(target=_child, args=(child, load, spec), name=f"bench-{load.__name__}")
        self._child_end = child
        self._ready = False
        self._result: dict[str, Any] | None = None
        self.name = load.__name__

    def start(self) -> ClientProcess:
        self._process.start()
        self._child_end.close()  # the child holds its own copy; EOF then means it is gone
        return self

    def _receive(self, timeout_s: float) -> tuple[str, Any]:
        if not self._parent.poll(timeout_s):
            raise HarnessError(f"client load {self.name} sent nothing within {timeout_s:.0f}s")
        try:
            kind, payload = self._parent.recv()
        except EOFError:
            raise HarnessError(f"client load {self.name} died (exit code {self._process.exitcode})") from None
        if kind == "error":
            raise HarnessError(f"client load {self.name} failed:\n{payload}")
        return kind, payload

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        kind, payload = self._receive(timeout_s)
        if kind == "result":
            self._result = payload
        self._ready = True

    def result(self, timeout_s: float) -> dict[str, Any]:
        if not self._ready:
            self.wait_ready(timeout_s)
        if self._result is None:
            kind, payload = self._receive(timeout_s)
            if kind != "result":
                raise HarnessError(f"client load {self.name} sent {kind!r} twice")
            self._result = payload
        return self._result

    @property
    def pid(self) -> int:
        pid = self._process.pid
        if pid is None:
            raise HarnessError(f"client load {self.name} was not started")
        return pid

    def kill(self) -> None:
        """SIGKILL, as a crash would (the soak's consumer fault); :meth:`stop` still cleans up."""
        self._process.kill()
        self._process.join(10)

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(10)
        self._parent.close()

    def __enter__(self) -> ClientProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
