"""HttpServer: the proxy's aiohttp server, in the proxy's own event loop.

A thin adapter like the Thrift server: handlers decode the request, call the service (or one
read-only view), and encode JSON. Every error answer has the JSON body of
:mod:`ddmq.proxy.http_server.errors`; a body above ``max_body_bytes`` is refused (413) before it is
read to the end. The routes are documented in ``openapi.yaml`` (served at ``/openapi.json``); a test
checks that the document and the app agree.

>>> server = HttpServer(service, config.http)
>>> await server.start()          # logs the bound port; 0 picks a free one
>>> await server.close()
"""

from __future__ import annotations

import json
import logging
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

import yaml
from aiohttp import web

from ddmq.config.schema import HttpConfig
from ddmq.proxy.http_server.admin import OperatorApi, admin_guard
from ddmq.proxy.http_server.console import ConsoleApi
from ddmq.proxy.http_server.errors import errors_middleware
from ddmq.proxy.http_server.pull_api import PullApi

if TYPE_CHECKING:
    from ddmq.proxy.service import ProxyService

log = logging.getLogger(__name__)

#: How long close() lets running requests finish; parked pulls are answered before it is called.
SHUTDOWN_TIMEOUT_S: Final = 2.0


@cache
def load_openapi() -> dict[str, Any]:
    """The OpenAPI document shipped with the package (``openapi.yaml``), as a dict."""
    text = resources.files("ddmq.proxy.http_server").joinpath("openapi.yaml").read_text("utf-8")
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def build_app(service: ProxyService, config: HttpConfig) -> web.Application:
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[errors_middleware, admin_guard(config.admin_token)],
    )
    PullApi(service, config.max_linger_ms).add_routes(app)
    OperatorApi(service).add_routes(app)
    ConsoleApi(service).add_routes(app)
    openapi = json.dumps(load_openapi()).encode()

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(body=openapi, content_type="application/json")

    app.router.add_get("/openapi.json", openapi_json)
    return app


class HttpServer:
    """Serves :func:`build_app` on ``config.host``:``config.port``; read :attr:`port` after start."""

    def __init__(self, service: ProxyService, config: HttpConfig) -> None:
        self._service = service
        self._config = config
        self._runner: web.AppRunner | None = None
        self._started = False

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("HttpServer.start() called twice")
        self._started = True
        self._runner = web.AppRunner(
            build_app(self._service, self._config),
            access_log=None,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            # A client that hangs up during a long poll leaves no parked pull behind to take messages.
            handler_cancellation=True,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._config.host, self._config.port)
        try:
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        log.info("http server listening on %s:%d", self._config.host, self.port)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
            log.info("http server on %s closed", self._config.host)

    @property
    def port(self) -> int:
        """The bound port (the chosen one when configured with port 0)."""
        addresses = self._runner.addresses if self._runner is not None else []
        if not addresses:
            raise RuntimeError("HttpServer is not listening")
        port: int = addresses[0][1]
        return port
