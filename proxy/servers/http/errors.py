"""Errors on the HTTP side: the proxy's error codes as HTTP statuses and one JSON error body.

Every error answer, whatever raised it (our :class:`~ddmq.proxy.core.errors.DdmqError`, aiohttp's own
404/405/413, a bug), has the body ``{"code": <int>, "message": <str>, "retriable": <bool>}`` with the
same ``code`` values as Thrift's ``PullException.code``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from pydantic import ValidationError

from ddmq.protocol.errors import is_retriable
from ddmq.proxy.core.errors import (
    INTERNAL_ERROR_CODE,
    BadRequestError,
    BrokerError,
    DdmqError,
    ForbiddenError,
    NotSupportedError,
    RequestError,
    UnauthorizedError,
    UnavailableError,
    UnknownEntryError,
    UnknownGroupError,
    UnknownTopicError,
    UnsupportedMediaTypeError,
)

log = logging.getLogger(__name__)

#: Error class -> HTTP status; subclasses not listed take their parent's.
HTTP_STATUS: Final[dict[type[DdmqError], int]] = {
    UnknownGroupError: 404,
    UnknownTopicError: 404,
    BadRequestError: 400,
    UnsupportedMediaTypeError: 415,
    UnknownEntryError: 404,
    NotSupportedError: 501,
    UnauthorizedError: 401,
    ForbiddenError: 403,
    RequestError: 400,
    UnavailableError: 503,
    BrokerError: 503,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_of(exc: DdmqError) -> int:
    for cls in type(exc).__mro__:
        status = HTTP_STATUS.get(cls)
        if status is not None:
            return status
    return 500


#: Headers of aiohttp's own error answers that the JSON answer keeps (405's ``Allow``: RFC 9110 requires it).
_KEPT_HEADERS: Final = ("Allow",)


def error_response(
    status: int, code: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    """The error body; whether a retry can help is the code's (:data:`ddmq.protocol.errors.ERROR_CODES`)."""
    retriable = is_retriable(code)
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="ddmq-admin"'
    return web.json_response(
        {"code": code, "message": message, "retriable": retriable}, status=status, headers=headers or None
    )


def validation_message(exc: ValidationError) -> str:
    """A pydantic error as one line naming each bad field's path, e.g. ``results.0.success.2: ...``."""
    parts = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(part) for part in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into the JSON error body; the server keeps serving."""
    try:
        return await handler(request)
    except DdmqError as exc:
        status = status_of(exc)
        level = logging.DEBUG if status < 500 else logging.WARNING
        log.log(level, "%s %s from %s: %s (code %d)", request.method, request.path, request.remote, exc, exc.code)
        return error_response(status, exc.code, str(exc) or type(exc).__name__)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = BadRequestError.code if exc.status < 500 else INTERNAL_ERROR_CODE
        log.debug("%s %s from %s: HTTP %d %s", request.method, request.path, request.remote, exc.status, exc.reason)
        text = exc.text or ""
        if not text or text == f"{exc.status}: {exc.reason}":  # aiohttp's default body says no more
            text = f"{exc.reason}: {request.method} {request.path}"
        kept = {name: exc.headers[name] for name in _KEPT_HEADERS if name in exc.headers}
        return error_response(exc.status, code, text, kept)
    except Exception:
        log.exception("internal error serving %s %s from %s", request.method, request.path, request.remote)
        return error_response(500, INTERNAL_ERROR_CODE, "internal error")


class JsonErrorsHandler(RequestHandler):
    """aiohttp's protocol for one connection, answering what its parser refuses (a request line or
    headers too long: 414, 431; a malformed request: 400) with the JSON error body too, as every
    other error answer. aiohttp logs and closes as it would."""

    __slots__ = ()

    def handle_error(
        self, request: BaseRequest, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; raises if a reply was sent already
        if isinstance(exc, LineTooLong):
            status, text = _too_long(exc)
        elif status < 500:
            # The parser's words, without the client's bytes it may quote.
            text = "malformed request: " + (getattr(exc, "message", "") or "").split(":", 1)[0].strip()
        else:
            text = "internal error"
        error = error_response(status, BadRequestError.code if status < 500 else INTERNAL_ERROR_CODE, text)
        error.force_close()
        return error


def _too_long(exc: LineTooLong) -> tuple[int, str]:
    """414 for the request line (the line aiohttp quotes is its target: a path or an absolute URL),
    431 for a header; aiohttp answers both 400."""
    line, limit = exc.args[0], exc.args[1]
    if bytes(line[:1]) == b"/" or bytes(line[:4]).lower() == b"http":
        return 414, f"the request line is longer than {limit} bytes"
    return 431, f"a request header is longer than {limit} bytes"


def json_errors_protocols(server: web.Server) -> Callable[[], RequestHandler]:
    """The protocol factory of ``server`` with :class:`JsonErrorsHandler`: what ``web.Server()``
    makes, with the same arguments."""

    def protocol() -> RequestHandler:
        return JsonErrorsHandler(server, loop=server._loop, **server._kwargs)

    return protocol
