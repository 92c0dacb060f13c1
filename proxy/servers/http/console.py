"""The ops console: one static page (``static/``) at ``/`` and ``/console``, and the lag history.

The page is plain HTML, CSS and a small script, shipped as package data; everything it shows comes
from the ``/admin/...`` JSON endpoints, called by the script with the operator's bearer token (kept
in the browser tab only). The script builds the DOM from text nodes, and the page is served with a
Content Security Policy that allows only its own files, so no key or message body can run as code.

``/admin/groups/{group}/lag-history`` answers the samples :class:`~ddmq.proxy.ops.lag.LagHistory` keeps
(every 5 s for the last hour, in memory and in Redis: lag, totals in and out, dead letters; and this
proxy's keys by state and end-to-end latency) and the rates in and out they give; the console draws
its charts from it. The sampler runs while the HTTP server does.

>>> ConsoleApi(service).add_routes(app)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Final

from aiohttp import web

from ddmq.proxy.core.errors import UnknownGroupError
from ddmq.proxy.ops.lag import LagHistory, LagSample, LocalSample, rates

if TYPE_CHECKING:
    from ddmq.proxy.servers.http.view import ProxyView

#: The console's files and their content types; nothing else is served from the folder.
FILES: Final = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
#: Only the page's own script, style and API calls; no inline script, no framing by other sites.
HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def console_file(name: str) -> bytes:
    return resources.files("ddmq.proxy.servers.http").joinpath("static", name).read_bytes()


class ConsoleApi:
    def __init__(self, service: ProxyView) -> None:
        self._service = service
        self.history = LagHistory(service.registry)

    def add_routes(self, app: web.Application) -> None:
        router = app.router
        router.add_get("/", self.page)
        router.add_get("/console", self.page)
        router.add_get("/console/{name}", self.file)
        router.add_get("/admin/groups/{group}/lag-history", self.lag_history)
        app.cleanup_ctx.append(self._sampling)

    async def _sampling(self, app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(self.history.run(), name="lag-history")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def page(self, request: web.Request) -> web.Response:
        return self._serve("index.html")

    async def file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in FILES or name == "index.html":
            raise web.HTTPNotFound()
        return self._serve(name)

    @staticmethod
    def _serve(name: str) -> web.Response:
        return web.Response(body=console_file(name), content_type=FILES[name], charset="utf-8", headers=HEADERS)

    async def lag_history(self, request: web.Request) -> web.Response:
        name = request.match_info["group"]
        if name not in self._service.groups:
            raise UnknownGroupError(f"unknown group {name!r}; this proxy serves {sorted(self._service.groups)}")
        series = self.history.series(name)
        local = self.history.local_series(name)
        return web.json_response(
            {
                "group": name,
                "interval_ms": int(self.history.interval_s * 1000),
                "topics": {topic: [list(s) for s in samples] for topic, samples in series.items()},
                "rates": {topic: _rates_json(samples) for topic, samples in series.items()},
                "local": {topic: [_local_json(s) for s in samples] for topic, samples in local.items()},
            }
        )


def _local_json(sample: LocalSample) -> list[int | None]:
    """A local sample as the API gives it: its latency figures null when nothing was acked meanwhile."""
    *counts, p50, p99 = sample
    return [*counts, p50 if p50 >= 0 else None, p99 if p99 >= 0 else None]


def _rates_json(samples: list[LagSample]) -> dict[str, float] | None:
    found = rates(samples)
    if found is None:
        return None
    return {"produced_per_s": round(found[0], 3), "consumed_per_s": round(found[1], 3)}
