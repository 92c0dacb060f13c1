"""``Json``: parse the body once; later actions and JSONPath order keys read ``job.data``."""

from __future__ import annotations

import json
import json.scanner
import logging
from collections.abc import Callable
from typing import Any, Final, cast

from ddmq.actions.base import ChainContext, Status, register
from ddmq.proxy.engine.job import INVALID_JSON, UpstreamJob

log: Final = logging.getLogger(__name__)

# json.loads(bytes) first detects the encoding and checks its keyword arguments, and JSONDecoder.decode
# is Python around the C scanner (two regex matches for the whitespace at either end). A UTF-8 body that
# is one JSON value with nothing around it (nearly all) goes to the scanner alone; anything else takes
# decode() or loads(), which give the same value or the same error.
_decoder = json.JSONDecoder()
_decode_text: Final = _decoder.decode
# json's C scanner for this decoder (typeshed's stub of make_scanner takes no decoder, hence the cast)
_scan_once: Final[Callable[[str, int], tuple[Any, int]]] = json.scanner.make_scanner(cast(Any, _decoder))
_CONTINUE: Final = Status.CONTINUE  # enum members read through their class are slow; Final: a C static when compiled


class JsonAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx

    def act(self, job: UpstreamJob) -> Status:
        body = job.message.value
        try:
            try:
                job.data = _parse(body.decode("utf-8"))
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


def _parse(text: str) -> Any:
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:  # no value at 0: leading whitespace, or nothing that is JSON
        return _decode_text(text)
    return value if end == len(text) else _decode_text(text)


# Registered here rather than by decorating the class: the compiled build makes a decorated class a
# plain Python one (attributes in a dict, methods bound per call), and this one runs for every message.
register("Json")(JsonAction)
