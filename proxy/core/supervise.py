"""Supervised tasks: a long-running task of the proxy that fails unexpectedly is restarted, not lost.

The proxy's per-queue readers and its process-wide loops (the upkeep, the offset committer, the
trimmer, the idle watcher, the key-command watcher) are meant to run for as long as their owner does.
Each handles the failures it expects (Redis unavailable: retry with backoff); anything else would end
the task silently while the rest of the proxy carries on as if it ran (a queue whose lease is renewed
but which nobody reads). :func:`supervised` runs such a body again after an unexpected exception,
with a growing pause, saying so as one WARNING naming the task and "restarting", and counts it in
:data:`RESTARTS` (``ddmq_task_restarts_total{task}`` on ``/metrics``).

>>> task = asyncio.create_task(supervised("committer", lambda: commit_forever()))
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

__all__ = ["RESTARTS", "Backoff", "supervised"]

#: Restarts so far, by kind of task (``reader``, ``upkeep``, ``committer``, ...), for ``/metrics``.
RESTARTS: Counter[str] = Counter()
#: A body that ran this long without failing starts again from the shortest pause.
_HEALTHY_S = 60.0


class Backoff:
    """Pauses that double from ``first`` up to ``most`` seconds; :meth:`reset` after a success."""

    __slots__ = ("first", "most", "next")

    def __init__(self, first: float = 0.1, most: float = 30.0) -> None:
        self.first, self.most = first, most
        self.next = first

    def take(self) -> float:
        pause, self.next = self.next, min(self.next * 2, self.most)
        return pause

    def reset(self) -> None:
        self.next = self.first


def note_restart(kind: str, name: str, exc: BaseException, pause_s: float) -> None:
    """Say and count that task ``name`` (of ``kind``) failed unexpectedly and restarts in ``pause_s``."""
    RESTARTS[kind] += 1
    log.warning("%s failed unexpectedly (%s: %s); restarting in %.1fs", name, type(exc).__name__, exc, pause_s,
                exc_info=exc)


async def supervised(
    kind: str, body: Callable[[], Awaitable[None]], name: str | None = None, backoff: Backoff | None = None
) -> None:
    """Run ``body()`` until it returns or the task is cancelled, starting it again after an unexpected
    exception (see the module's docstring). ``name`` is what the log calls it (default: ``kind``)."""
    backoff = backoff or Backoff()
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        try:
            await body()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if loop.time() - started > _HEALTHY_S:
                backoff.reset()
            pause = backoff.take()
            note_restart(kind, name or kind, exc, pause)
            await asyncio.sleep(pause)
