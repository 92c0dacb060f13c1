"""``Order``: give the job its order key and gate it behind the key's unfinished jobs.

The key is ``QID`` (the whole queue is one key), ``KEY`` (the message key), ``NONE`` (no ordering),
or a JSONPath into the body parsed by ``Json`` (first match; a string is used as is, any other JSON
value by its canonical JSON text, so ``1`` and ``"1"`` are different keys).

When there is no key to take (empty message key, body not JSON, path not found) the job follows
``order_key_fallback``: ``none`` delivers it without ordering, ``qid`` orders it with the other
key-less jobs of its queue. Either way it is counted (``order_key_missing``) and logged at debug level.

With ``fair_key`` it names the job's tenant too (``KEY``, ``TAG`` or a JSONPath, the same way, as a
string); a job it finds none for is of the tenant ``""``, counted as ``fair_key_missing``. The key gate
holds a job of a tenant at its share (:mod:`ddmq.proxy.engine.tenants`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Hashable
from typing import Any, Final

from ddmq.actions.base import ChainContext, Status, register
from ddmq.actions.job import INVALID_JSON, Job
from ddmq.config.jsonpath import MISSING, compile_jsonpath
from ddmq.config.schema import FAIR_KEY_KEY, FAIR_KEY_TAG, ORDER_KEY_KEY, ORDER_KEY_NONE, ORDER_KEY_QID

_CONTINUE: Final = Status.CONTINUE
_ASYNC: Final = Status.ASYNC  # enum members read through their class are slow; Final: a C static when compiled

log: Final = logging.getLogger(__name__)


def _key_of(value: Any) -> Hashable | None:
    if isinstance(value, str):
        return value
    text = _text_of(value)
    return None if text is None else ("json", text)


def _text_of(value: Any) -> str | None:
    """A tenant found by a JSONPath: a string as is, any other JSON value by its canonical JSON text
    (tenants are shown to operators and named in ``fair_weights``, so they are strings)."""
    if value is MISSING or value is None:
        return None
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class OrderAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx
        config = ctx.config
        self._mode = config.order_key
        self._fallback_qid = config.order_key_fallback == "qid"
        self._getter = compile_jsonpath(config.order_key) if config.is_jsonpath_key else None
        self._queue = ctx.blocking_queue
        fair_key = config.fair_key
        self._tenant_getter = compile_jsonpath(fair_key) if fair_key is not None and fair_key.startswith("$") else None
        #: None without tenants; else how a job's tenant is found.
        self._tenant_mode = fair_key

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

    def tenant(self, job: Job) -> str:
        """``job``'s tenant under ``fair_key``: ``""`` when it names none (counted, never dropped)."""
        mode = self._tenant_mode
        if mode == FAIR_KEY_KEY:
            tenant: str | None = job.message.key or None
        elif mode == FAIR_KEY_TAG:
            tenant = job.message.tag or None
        else:
            assert self._tenant_getter is not None
            data = job.data
            tenant = None if data is INVALID_JSON else _text_of(self._tenant_getter(data))
        if tenant is None:
            self._ctx.count("fair_key_missing")
            return ""
        return tenant

    def act(self, job: Job) -> Status:
        job.order_key = self.order_key(job)
        if self._tenant_mode is not None:
            job.tenant = self.tenant(job)
        # Its key's head with nothing else waiting to run: the chain goes on now. Otherwise the
        # consumer's dispatcher continues it once the blocking queue hands the job out.
        return _CONTINUE if self._queue.admit(job) else _ASYNC


# Registered here rather than by decorating the class: the compiled build makes a decorated class a
# plain Python one (attributes in a dict, methods bound per call), and this one runs for every message.
register("Order")(OrderAction)
