"""``/admin/groups/{group}/pause``: pause a group (or one topic of it), resume it, show its pauses.

The pause is written to Redis (:mod:`ddmq.protocol.redis.pauses`), where every proxy of the group reads
it within one heartbeat (:mod:`ddmq.proxy.groups.pausing`); this proxy applies it at once too.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any

from aiohttp import web
from pydantic import Field

from ddmq.protocol.redis.pauses import ALL, MAX_PAUSE_MS, pause_async, pauses_async, resume_async
from ddmq.proxy.core.errors import BadRequestError, UnavailableError
from ddmq.proxy.groups.group import ConsumerGroup
from ddmq.proxy.servers.http.actions_api import record
from ddmq.proxy.servers.http.lookup import find_group, find_topic
from ddmq.proxy.servers.http.pull_api import WHOLE, BodyReader, JsonBody, parse

if TYPE_CHECKING:
    from ddmq.proxy.servers.http.view import ProxyView

__all__ = ["PauseApi"]

log = logging.getLogger(__name__)


class PauseIn(JsonBody):
    """``{"topic": optional, "for_ms": optional (pause only), "by": optional}``."""

    topic: Annotated[str, Field(min_length=1, max_length=255)] | None = None
    for_ms: Annotated[int, Field(gt=0, le=MAX_PAUSE_MS), WHOLE] | None = None
    by: Annotated[str, Field(max_length=200)] | None = None


class PauseApi:
    def __init__(self, service: ProxyView, read_body: BodyReader) -> None:
        self._service = service
        self._read_body = read_body

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/groups/{group}/pause", self.show)
        app.router.add_post("/admin/groups/{group}/pause", self.pause)
        app.router.add_post("/admin/groups/{group}/resume", self.resume)

    def _group(self, request: web.Request) -> ConsumerGroup:
        return find_group(self._service, request)

    async def _body(self, request: web.Request, group: ConsumerGroup) -> PauseIn:
        body = parse(PauseIn, await self._read_body(request))
        if body.topic == ALL:
            raise BadRequestError('"topic" takes a topic name; leave it out for every topic')
        find_topic(group, body.topic)
        return body

    async def _answer(self, group: ConsumerGroup, **extra: Any) -> web.Response:
        now_ms, found = await pauses_async(self._redis(), group.name)
        await group.pause_watch.read()  # this proxy follows at once, the others within a heartbeat
        return web.json_response({"group": group.name, "now_ms": now_ms, **extra,
                                  "paused": [p.as_json() for p in found]})

    def _redis(self) -> Any:
        if self._service.redis is None:
            raise UnavailableError("the proxy is not started")
        return self._service.redis

    async def show(self, request: web.Request) -> web.Response:
        return await self._answer(self._group(request))

    async def pause(self, request: web.Request) -> web.Response:
        group = self._group(request)
        body = await self._body(request, group)
        by = body.by or "admin api"
        await pause_async(self._redis(), group.name, body.topic, by, body.for_ms or 0)
        log.warning("pause of %s%s by %s%s", group.name, f"/{body.topic}" if body.topic else "", by,
                    f" for {body.for_ms} ms" if body.for_ms else "")
        await record(self._service, request, "pause", group.name, body.topic, {"for_ms": body.for_ms}, body.by)
        return await self._answer(group)

    async def resume(self, request: web.Request) -> web.Response:
        group = self._group(request)
        body = await self._body(request, group)
        if body.for_ms is not None:
            raise BadRequestError('"for_ms" is for a pause')
        lifted = await resume_async(self._redis(), group.name, body.topic)
        log.warning("resume of %s%s by %s (%d pause(s) lifted)", group.name, f"/{body.topic}" if body.topic else "",
                    body.by or "admin api", lifted)
        await record(self._service, request, "resume", group.name, body.topic, {"lifted": lifted}, body.by)
        return await self._answer(group, lifted=lifted)
