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
import re
from collections.abc import Callable, Hashable
from typing import Any

from jsonpath_ng.ext.parser import parse as parse_jsonpath

from ddmq.actions.base import ChainContext, Status, register
from ddmq.config.schema import ORDER_KEY_KEY, ORDER_KEY_NONE, ORDER_KEY_QID
from ddmq.proxy.job import INVALID_JSON, UpstreamJob

_ASYNC = Status.ASYNC  # a plain global: enum members read through their class are slow on Python 3.11

log = logging.getLogger(__name__)

_MISSING: Any = object()
_SIMPLE_PATH = re.compile(r"^\$(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def compile_jsonpath(path: str) -> Callable[[Any], Any]:
    """A getter returning the first match of ``path`` in a parsed body, or ``_MISSING``.

    Plain dotted paths (``$.order.id``) become chained dict lookups; anything else uses jsonpath-ng,
    parsed once here rather than per message.
    """
    if _SIMPLE_PATH.match(path):
        names = path[2:].split(".")

        def get_simple(data: Any) -> Any:
            for name in names:
                if not isinstance(data, dict):
                    return _MISSING
                data = data.get(name, _MISSING)
                if data is _MISSING:
                    return _MISSING
            return data

        return get_simple

    expression = parse_jsonpath(path)

    def get_general(data: Any) -> Any:
        matches = expression.find(data)
        return matches[0].value if matches else _MISSING

    return get_general


def _key_of(value: Any) -> Hashable | None:
    if value is _MISSING or value is None:
        return None
    if isinstance(value, str):
        return value
    return ("json", json.dumps(value, sort_keys=True, separators=(",", ":")))


@register("Order")
class OrderAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx
        config = ctx.config
        self._mode = config.order_key
        self._fallback_qid = config.order_key_fallback == "qid"
        self._getter = compile_jsonpath(config.order_key) if config.is_jsonpath_key else None
        self._queue = ctx.blocking_queue

    def order_key(self, job: UpstreamJob) -> Hashable | None:
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

    async def act(self, job: UpstreamJob) -> Status:
        job.order_key = self.order_key(job)
        # Runnable now or waiting behind its key's head: either way the consumer's dispatcher
        # continues the chain once the blocking queue hands the job out.
        self._queue.put(job)
        return _ASYNC
