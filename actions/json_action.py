"""``Json``: parse the body once; later actions and JSONPath order keys read ``job.data``."""

from __future__ import annotations

import json
import logging

from ddmq.actions.base import ChainContext, Status, register
from ddmq.proxy.job import INVALID_JSON, UpstreamJob

log = logging.getLogger(__name__)


@register("Json")
class JsonAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx

    async def act(self, job: UpstreamJob) -> Status:
        try:
            job.data = json.loads(job.message.value)
        except (ValueError, UnicodeDecodeError) as exc:
            # Not an error of the proxy: the rule for such bodies is the Order action's fallback.
            job.data = INVALID_JSON
            job.last_error = f"body is not JSON: {exc}"
            self._ctx.count("json_invalid")
            log.debug("%r: %s", job, job.last_error)
        return Status.CONTINUE
