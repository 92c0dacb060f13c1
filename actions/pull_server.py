"""``PullServer``: park the job in the group's PullBuffer for pull clients (Thrift, HTTP)."""

from __future__ import annotations

from typing import Final

from ddmq.actions.base import ChainContext, Status, register
from ddmq.actions.job import Job

_ASYNC: Final = Status.ASYNC  # enum members read through their class are slow; Final: a C static when compiled


class PullServerAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._buffer = ctx.buffer

    def act(self, job: Job) -> Status:
        self._buffer.add(job)
        return _ASYNC


# Registered here rather than by decorating the class: the compiled build makes a decorated class a
# plain Python one (attributes in a dict, methods bound per call), and this one runs for every message.
register("PullServer")(PullServerAction)
