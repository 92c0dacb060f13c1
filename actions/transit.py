"""``Transit``: replace the body with a new JSON object built from JSONPath -> field mappings.

Config ``transit: {out_field: "$.path", ...}``; a dotted output field nests (``rider.id`` gives
``{"rider": {"id": ...}}``); a path that finds nothing leaves its field out. Later actions (``Order``
with a JSONPath key, ``AsyncHttp``, ``Redis``) and pull clients see the new body. A body that is not
JSON cannot be reshaped: the message is dead-lettered at once with the reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ddmq.actions.base import ChainContext, Status, register
from ddmq.actions.job import INVALID_JSON, Job
from ddmq.config.jsonpath import MISSING, compile_jsonpath


@register("Transit")
class TransitAction:
    def __init__(self, ctx: ChainContext) -> None:
        self._ctx = ctx
        mapping = ctx.config.transit
        assert mapping is not None  # the config refuses Transit without its settings
        self._fields: list[tuple[list[str], Callable[[Any], Any]]] = [
            (name.split("."), compile_jsonpath(path)) for name, path in mapping.items()
        ]

    def reshape(self, data: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for parts, getter in self._fields:
            value = getter(data)
            if value is MISSING:
                continue
            target = out
            for part in parts[:-1]:
                target = target.setdefault(part, {})
            target[parts[-1]] = value
        return out

    def act(self, job: Job) -> Status:
        if job.data is INVALID_JSON:
            job.last_error = f"Transit: {job.last_error or 'body is not JSON'}"
            self._ctx.count("transit_invalid")
            return Status.FAIL
        out = self.reshape(job.data)
        job.data = out
        job.message = job.message._replace(value=json.dumps(out, separators=(",", ":")).encode())
        return Status.CONTINUE
