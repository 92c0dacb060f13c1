"""Who may call what over HTTP: decided by one middleware before any handler runs (and CORS by another).

Every port is assumed reachable by a hostile client and by a hostile web page in the operator's
browser. The rules, by route (decided by the route that matched, so no spelling of a URL slips by):

``/v1/...`` (the data plane)
    A request carrying ``Origin`` (only browsers send it) is refused (403) unless the origin is in
    ``http.allowed_origins``; a body must be ``application/json`` (415): together they keep pages of
    other sites, ``file://`` pages included, from pulling or acking. With ``http.data_token`` set,
    ``Authorization: Bearer <data_token>`` is required (401).
``/admin/...`` and the console (``/``, ``/console...``)
    With ``http.admin_token``: the token on every admin call, from anywhere (401); the console page
    itself holds no data. Without a token: a loopback peer, and a ``Host`` that is a loopback literal,
    ``localhost`` or in ``http.allowed_hosts`` (403 otherwise: after DNS rebinding the browser names
    the attacker's host there). Either way an ``Origin``, when sent, must be the page's own
    (``Origin`` naming the ``Host`` asked for, which must itself be allowed unless a token was
    checked) or in ``http.allowed_origins``; changing calls need a JSON body (415).
``/healthz``, ``/readyz``, ``/metrics``, ``/openapi.json``
    Open: they carry no message data and no credentials.

CORS headers go to allowed origins only, and a preflight (``OPTIONS``) from one of them is answered
here; any other preflight gets 403, so the browser never sends the real request.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Final
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp.typedefs import Middleware

from ddmq.config.schema import HttpConfig
from ddmq.proxy.core.errors import ForbiddenError, UnauthorizedError, UnsupportedMediaTypeError
from ddmq.proxy.servers.http.errors import Handler, error_response

ADMIN_PREFIX: Final = "/admin/"
DATA_PREFIX: Final = "/v1/"
#: The console's page and files; ``/`` serves the page too.
CONSOLE_PREFIX: Final = "/console"
#: Methods whose requests carry no body and change nothing.
_READS: Final = frozenset({"GET", "HEAD"})
_CORS_MAX_AGE_S: Final = 600


def is_loopback(remote: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and ::ffff:127.x (a dual-stack socket's IPv4 peer)."""
    if remote is None:
        return False
    try:
        address = ipaddress.ip_address(remote)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _split_host(host: str) -> tuple[str, str]:
    """``Host`` (or an origin's netloc) as (name, port); brackets kept off IPv6 literals."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest.removeprefix(":")
    name, _, port = host.partition(":")
    return name, port


def _is_console(path: str) -> bool:
    return path in ("/", CONSOLE_PREFIX) or path.startswith(CONSOLE_PREFIX + "/")


class AccessPolicy:
    """The decisions of the module docstring for one :class:`HttpConfig`."""

    def __init__(self, config: HttpConfig) -> None:
        self._admin = f"Bearer {config.admin_token}".encode() if config.admin_token else None
        self._data = f"Bearer {config.data_token}".encode() if config.data_token else None
        self._origins = frozenset(config.allowed_origins)
        self._hosts = frozenset(config.allowed_hosts)

    def trusted_host(self, host: str) -> bool:
        """A loopback literal, ``localhost``, or listed in ``http.allowed_hosts`` (by name or name:port)."""
        host = host.lower()
        name, _ = _split_host(host)
        name = name.rstrip(".")
        if name == "localhost" or is_loopback(name):
            return True
        return host in self._hosts or name in self._hosts

    def allowed_origin(self, origin: str) -> bool:
        return origin.lower() in self._origins

    def _own_origin(self, request: web.Request, origin: str, token_checked: bool) -> bool:
        """The page that made the request was served by this proxy under the name the request asks for."""
        host = request.headers.get("Host")
        parts = urlsplit(origin)
        if host is None or parts.scheme not in ("http", "https") or parts.netloc.lower() != host.lower():
            return False
        return token_checked or self.trusted_host(host)

    def check(self, request: web.Request, path: str) -> None:
        """Raise the error that refuses ``request`` to the route ``path``, or return."""
        origin = request.headers.get("Origin")
        if path.startswith(DATA_PREFIX):
            if origin is not None and not self.allowed_origin(origin):
                raise ForbiddenError(
                    f"calls from a web page of another origin ({origin[:100]!r}) are refused; "
                    "list it in http.allowed_origins to allow it"
                )
            if self._data is not None and not self._bearer(request, self._data):
                raise UnauthorizedError("the pull API needs 'Authorization: Bearer <http.data_token>'")
            self._json_body(request)
            return
        admin = path.startswith(ADMIN_PREFIX)
        if not (admin or _is_console(path)):
            return
        token_checked = False
        if self._admin is not None:
            if admin:
                if not self._bearer(request, self._admin):
                    raise UnauthorizedError("admin endpoints need 'Authorization: Bearer <http.admin_token>'")
                token_checked = True
        else:
            what = "admin endpoints" if admin else "the console"
            if not is_loopback(request.remote):
                raise ForbiddenError(
                    f"{what} answer loopback clients only; set http.admin_token to reach them from elsewhere"
                )
            host = request.headers.get("Host")
            if host is not None and not self.trusted_host(host):
                raise ForbiddenError(
                    f"{what} answer under a loopback address, localhost or http.allowed_hosts only, "
                    f"not Host {host[:100]!r}"
                )
        if origin is not None and not (self.allowed_origin(origin) or self._own_origin(request, origin, token_checked)):
            raise ForbiddenError(f"admin calls from a web page of another origin ({origin[:100]!r}) are refused")
        if admin:
            self._json_body(request)

    @staticmethod
    def _bearer(request: web.Request, expected: bytes) -> bool:
        return hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected)

    @staticmethod
    def _json_body(request: web.Request) -> None:
        if request.method not in _READS and request.content_type != "application/json":
            raise UnsupportedMediaTypeError(
                f"request bodies must be sent as Content-Type: application/json, not {request.content_type!r}"
            )

    def cors_headers(self, request: web.Request) -> dict[str, str]:
        origin = request.headers.get("Origin")
        if origin is None or not self.allowed_origin(origin):
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def preflight(self, request: web.Request) -> web.Response:
        """The answer to an ``OPTIONS`` preflight for ``/v1/...`` or ``/admin/...``."""
        headers = self.cors_headers(request)
        if not headers:
            raise ForbiddenError("cross-origin calls are allowed from the origins in http.allowed_origins only")
        return web.Response(
            status=204,
            headers={
                **headers,
                "Access-Control-Allow-Methods": "GET, POST",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": str(_CORS_MAX_AGE_S),
            },
        )


def access_guard(config: HttpConfig) -> tuple[Middleware, Middleware]:
    """Two middlewares applying :class:`AccessPolicy`: the CORS one goes outermost (so error answers to
    an allowed origin carry its headers too, and the page can read them); the guard goes innermost,
    inside the errors middleware, so a refusal is the usual JSON error answer."""
    policy = AccessPolicy(config)

    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" and request.path.startswith((DATA_PREFIX, ADMIN_PREFIX)):
            try:
                return policy.preflight(request)
            except ForbiddenError as exc:
                return error_response(403, exc.code, str(exc))
        response = await handler(request)
        if request.path.startswith((DATA_PREFIX, ADMIN_PREFIX)):
            response.headers.update(policy.cors_headers(request))
        return response

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        resource = request.match_info.route.resource
        policy.check(request, resource.canonical if resource is not None else "")
        return await handler(request)

    return cors, guard
