"""``Json``: parse the body once; later actions and JSONPath order keys read ``job.data``."""

from __future__ import annotations

import json
import logging
from typing import Final

from ddmq.actions.base import ChainContext, Status, register
from ddmq.proxy.engine.job import INVALID_JSON, UpstreamJob

log: Final = logging.getLogger(__name__)

# json.loads(bytes) first detects the encoding and checks its keyword arguments: for UTF-8 bodies (nearly
# all), decoding the text directly costs 0.6 of it.
_decode_text: Final = json.JSONDecoder().decode
_CONTINUE: Final = Status.CONTINUE  # enum members read through their class are slow; Final: a C static when compiled


class JsonAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx

    def act(self, job: UpstreamJob) -> Status:
        body = job.message.value
        try:
            try:
                job.data = _decode_text(body.decode("utf-8"))
            except ValueError:  # not UTF-8 or with a BOM: json.loads detects UTF-16/32 and BOMs
                job.data = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            # Not an error of the proxy: the rule for such bodies is the Order action's fallback.
            # RecursionError: arrays/objects nested deeper than the decoder's stack allows.
            reason = "nested too deeply" if isinstance(exc, RecursionError) else exc
            job.data = INVALID_JSON
            job.last_error = f"body is not JSON: {reason}"
            self._ctx.count("json_invalid")
            log.debug("%r: %s", job, job.last_error)
        return _CONTINUE


# Registered here rather than by decorating the class: the compiled build makes a decorated class a
# plain Python one (attributes in a dict, methods bound per call), and this one runs for every message.
register("Json")(JsonAction)
