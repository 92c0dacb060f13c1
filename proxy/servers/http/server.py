"""HttpServer: the proxy's aiohttp server, in the proxy's own event loop.

A thin adapter like the Thrift server: handlers decode the request, call the service (or one
read-only view), and encode JSON. Every error answer has the JSON body of
:mod:`ddmq.proxy.servers.http.errors`; a body above ``max_body_bytes`` is refused (413) before it is
read (:mod:`ddmq.proxy.servers.http.connections` holds the limits on connections and requests). The
routes are documented in ``openapi.yaml`` (served at ``/openapi.json``); a test checks that the
document and the app agree.

>>> server = HttpServer(ProxyView(registry, api, metrics, clients, lambda: running), config.http)
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
from aiohttp.http_exceptions import HttpProcessingError

from ddmq.config.schema import HttpConfig
from ddmq.proxy.api.requests import RequestRules
from ddmq.proxy.servers.http.admin import OperatorApi
from ddmq.proxy.servers.http.connections import HttpConnections
from ddmq.proxy.servers.http.console import ConsoleApi
from ddmq.proxy.servers.http.errors import errors_middleware, json_errors_protocols
from ddmq.proxy.servers.http.guard import access_guard
from ddmq.proxy.servers.http.pull_api import PullApi

if TYPE_CHECKING:
    from ddmq.proxy.servers.http.view import ProxyView

log = logging.getLogger(__name__)

#: How long close() lets running requests finish; parked pulls are answered before it is called.
SHUTDOWN_TIMEOUT_S: Final = 2.0
#: After answering a request whose body was not read (a 413 or 408, say), aiohttp reads and drops
#: the rest for this long before closing, so the client gets to read the answer; short, because a
#: client that keeps sending must not keep the connection.
LINGER_S: Final = 0.5


class _OneLineParseErrors(logging.Filter):
    """aiohttp logs a request it cannot parse with a traceback that quotes the raw bytes (a client's
    data in our log, one traceback per bad request). This filter makes it one line: who, and what
    was wrong, without the bytes. Other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            reason = (exc.message or "").splitlines()[0].rstrip(": ") if exc.message else type(exc).__name__
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "bad HTTP request from %s answered %d and closed: %s"
            record.args = (remote, exc.code, reason)
            record.exc_info = None
            record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


#: aiohttp's protocol-level log (requests that do not parse), through :class:`_OneLineParseErrors`.
protocol_log = logging.getLogger(__name__ + ".protocol")
protocol_log.addFilter(_OneLineParseErrors())


@cache
def load_openapi() -> dict[str, Any]:
    """The OpenAPI document shipped with the package (``openapi.yaml``), as a dict."""
    text = resources.files("ddmq.proxy.servers.http").joinpath("openapi.yaml").read_text("utf-8")
    document: dict[str, Any] = yaml.safe_load(text)
    return document


def build_app(service: ProxyView, config: HttpConfig, connections: HttpConnections | None = None) -> web.Application:
    connections = connections or HttpConnections(config)
    cors, guard = access_guard(config)
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[cors, errors_middleware, connections.middleware, guard],
    )
    pulls = service.api.bound(RequestRules(config.max_linger_ms))
    PullApi(pulls, connections.read_body, service.clients).add_routes(app)
    OperatorApi(service, connections.read_body).add_routes(app)
    ConsoleApi(service).add_routes(app)
    openapi = json.dumps(load_openapi()).encode()

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(body=openapi, content_type="application/json")

    app.router.add_get("/openapi.json", openapi_json)
    return app


class HttpServer:
    """Serves :func:`build_app` on ``config.host``:``config.port``; read :attr:`port` after start."""

    def __init__(self, service: ProxyView, config: HttpConfig) -> None:
        self._service = service
        self._config = config
        self._runner: web.AppRunner | None = None
        self._started = False
        #: The limits and their counters (refused connections, timeouts, early 413s).
        self.connections = HttpConnections(config)

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("HttpServer.start() called twice")
        self._started = True
        self._runner = web.AppRunner(
            build_app(self._service, self._config, self.connections),
            access_log=None,
            shutdown_timeout=SHUTDOWN_TIMEOUT_S,
            # A client that hangs up during a long poll leaves no parked pull behind to take messages.
            handler_cancellation=True,
            logger=protocol_log,
            lingering_time=LINGER_S,
        )
        await self._runner.setup()
        try:
            assert self._runner.server is not None
            await self.connections.start(json_errors_protocols(self._runner.server))
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise
        log.info("http server listening on %s:%d", self._config.host, self.port)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await self.connections.stop_accepting()
            await runner.cleanup()
            log.info("http server on %s closed", self._config.host)

    @property
    def port(self) -> int:
        """The bound port (the chosen one when configured with port 0)."""
        if self._runner is None:
            raise RuntimeError("HttpServer is not listening")
        return self.connections.listener.port
