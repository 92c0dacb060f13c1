"""``PullServer``: park the job in the group's PullBuffer for pull clients (Thrift, HTTP)."""

from __future__ import annotations

from ddmq.actions.base import ChainContext, Status, register
from ddmq.proxy.engine.job import UpstreamJob

_ASYNC = Status.ASYNC  # a plain global: enum members read through their class are slow on Python 3.11


@register("PullServer")
class PullServerAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._buffer = ctx.buffer

    def act(self, job: UpstreamJob) -> Status:
        self._buffer.add(job)
        return _ASYNC
