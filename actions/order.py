"""``Order``: give the job its order key and gate it behind the key's unfinished jobs.

The key is ``QID`` (the whole queue is one key), ``KEY`` (the message key), ``NONE`` (no ordering),
or a JSONPath into the body parsed by ``Json`` (first match; a string is used as is, any other JSON
value by its canonical JSON text, so ``1`` and ``"1"`` are different keys).

When there is no key to take (empty message key, body not JSON, path not found) the job follows
``order_key_fallback``: ``none`` delivers it without ordering, ``qid`` orders it with the other
key-less jobs of its queue. Either way it is counted (``order_key_missing``) and logged at debug level.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Hashable
from typing import Any, Final

from ddmq.actions.base import ChainContext, Status, register
from ddmq.actions.job import INVALID_JSON, Job
from ddmq.config.jsonpath import MISSING, compile_jsonpath
from ddmq.config.schema import ORDER_KEY_KEY, ORDER_KEY_NONE, ORDER_KEY_QID

_CONTINUE: Final = Status.CONTINUE
_ASYNC: Final = Status.ASYNC  # enum members read through their class are slow; Final: a C static when compiled

log: Final = logging.getLogger(__name__)


def _key_of(value: Any) -> Hashable | None:
    if value is MISSING or value is None:
        return None
    if isinstance(value, str):
        return value
    return ("json", json.dumps(value, sort_keys=True, separators=(",", ":")))


class OrderAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx
        config = ctx.config
        self._mode = config.order_key
        self._fallback_qid = config.order_key_fallback == "qid"
        self._getter = compile_jsonpath(config.order_key) if config.is_jsonpath_key else None
        self._queue = ctx.blocking_queue

    def order_key(self, job: Job) -> Hashable | None:
        mode = self._mode
        if mode == ORDER_KEY_KEY:
            key: Hashable | None = job.message.key or None
        elif mode == ORDER_KEY_QID:
            return ("qid", job.qid)
        elif mode == ORDER_KEY_NONE:
            return None
        else:
            assert self._getter is not None
            data = job.data
            key = None if data is INVALID_JSON else _key_of(self._getter(data))
        if key is None:
            self._ctx.count("order_key_missing")
            log.debug("%r has no order key (%s); fallback: %s", job, mode, "qid" if self._fallback_qid else "none")
            if self._fallback_qid:
                return ("qid", job.qid)
        return key

    def act(self, job: Job) -> Status:
        job.order_key = self.order_key(job)
        # Its key's head with nothing else waiting to run: the chain goes on now. Otherwise the
        # consumer's dispatcher continues it once the blocking queue hands the job out.
        return _CONTINUE if self._queue.admit(job) else _ASYNC


# Registered here rather than by decorating the class: the compiled build makes a decorated class a
# plain Python one (attributes in a dict, methods bound per call), and this one runs for every message.
register("Order")(OrderAction)
