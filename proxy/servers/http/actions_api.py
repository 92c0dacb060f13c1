"""``GET /admin/actions``: the last operator actions (:mod:`ddmq.protocol.redis.actions`), and the
record every changing admin call writes through :func:`record`.

Who acted is what the proxy knows of the caller, not what the caller says: the peer address, and
whether the admin token was checked (the token has no name; it says "someone holding the token").
A ``by`` in the body (the ``ddmq`` command sends the operator's login name) is kept in the detail
as what the caller said. The record is written after the action is done; a Redis failure then is
logged and the action's answer stands (its log line, ``operator action: ...``, is written first).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from ddmq.protocol.redis.actions import MAX_KEPT, recent_actions, record_action
from ddmq.proxy.core.errors import BadRequestError, BrokerError, UnavailableError
from ddmq.proxy.servers.http.lookup import query_int

if TYPE_CHECKING:
    from ddmq.proxy.servers.http.view import ProxyView

__all__ = ["ActionsApi", "caller", "record"]

log = logging.getLogger(__name__)

#: ``limit``'s default: the console's panel shows this many.
DEFAULT_LIMIT: Final = 50


def caller(service: ProxyView, request: web.Request) -> str:
    """Who made ``request``: its peer address, and ``admin token`` when the guard checked one."""
    peer = request.remote or "unknown peer"
    return f"admin token from {peer}" if service.config.http.admin_token else f"loopback {peer}"


async def record(service: ProxyView, request: web.Request, action: str, group: str | None = None,
                 topic: str | None = None, detail: dict[str, Any] | None = None,
                 by: str | None = None) -> None:
    """Keep ``action`` in the record; ``by``, when the caller gave one, goes in the detail."""
    if service.redis is None:
        return
    said = {**(detail or {}), **({"by": by} if by else {})}
    try:
        await record_action(service.redis, caller(service, request), action, group=group, topic=topic, detail=said)
    except BrokerError as exc:
        log.warning("the record of operator action %s could not be written: %s", action, exc)


#: The longest prefix of a list whose JSON fits a byte budget (the admin API's ``fit``).
Fit = Callable[[list[dict[str, Any]], int], list[dict[str, Any]]]


class ActionsApi:
    def __init__(self, service: ProxyView, fit: Fit, list_bytes: int) -> None:
        self._service = service
        self._fit = fit
        self._list_bytes = list_bytes

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/admin/actions", self.actions)

    async def actions(self, request: web.Request) -> web.Response:
        """``?limit=N`` (1..1000, default 50), ``?group=G``: newest first, as many as fit the answer's
        cap (``more``: some were left out)."""
        limit = query_int(request, "limit", 1, MAX_KEPT) or DEFAULT_LIMIT
        group = request.query.get("group")
        if group is not None and len(group) > 200:
            raise BadRequestError(f"group: at most 200 characters, got {len(group)}")
        if self._service.redis is None:
            raise UnavailableError("the proxy is not started")
        found = [action.as_json() for action in await recent_actions(self._service.redis, limit, group)]
        shown = self._fit(found, self._list_bytes)
        return web.json_response({"actions": shown, "more": len(shown) < len(found), "kept": MAX_KEPT})
