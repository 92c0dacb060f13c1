"""The two servers' sections: Thrift and HTTP, their listeners and limits on clients."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from ddmq.config.schema.base import Model


class ListenConfig(Model):
    #: The address to listen on; the loopback default keeps the port on this machine (see the docs'
    #: Security page before binding 0.0.0.0).
    host: str = "127.0.0.1"
    #: 0 binds a free port (tests use it).
    port: Annotated[int, Field(ge=0, le=65535)] = 9713


class ConnectionLimits(Model):
    """Limits every server (Thrift, HTTP) puts on its clients; each closes the connection that breaks it."""

    #: Connections open at once; more are accepted and closed at once (logged once per 10 s). Keep
    #: the Thrift and HTTP maxima together well under the process's descriptor limit (``ulimit -n``).
    max_connections: Annotated[int, Field(ge=1)] = 1000
    #: A connection with no request under way for this long is closed (a long poll is not idle).
    idle_timeout_ms: Annotated[int, Field(ge=10, le=3_600_000)] = 60_000
    #: A request whose first byte arrived must arrive whole within this (a reply must be taken too).
    request_timeout_ms: Annotated[int, Field(ge=10, le=600_000)] = 10_000
    #: Bytes of requests being read or decoded at once, over all connections; a big request waits for
    #: room (within request_timeout_ms). Must hold one largest request.
    max_buffered_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024 * 1024
    #: Only peers in these networks may connect (``["10.0.0.0/8", "127.0.0.1"]``; an address is a
    #: network of one); others are closed at accept (logged, counted). None: everyone.
    allowed_clients: list[str] | None = None

    @field_validator("allowed_clients")
    @classmethod
    def _networks(cls, value: list[str] | None) -> list[str] | None:
        for cidr in value or ():
            try:
                ipaddress.ip_network(cidr.strip(), strict=False)
            except ValueError as exc:
                raise ValueError(f"{cidr!r} is not an IP address or CIDR network: {exc}") from None
        return value


class ThriftConfig(ListenConfig, ConnectionLimits):
    #: Largest accepted request frame; a bigger one closes that connection (it is logged).
    max_frame_bytes: Annotated[int, Field(ge=1024)] = 16 * 1024 * 1024
    #: Upper bound on a client's ``maxLingerTime`` (long-poll wait).
    max_linger_ms: Annotated[int, Field(ge=0)] = 30_000

    @model_validator(mode="after")
    def _one_frame_fits(self) -> ThriftConfig:
        if self.max_buffered_bytes < self.max_frame_bytes:
            raise ValueError("max_buffered_bytes must be at least max_frame_bytes")
        return self


_HOST_NAME = re.compile(r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_\-]{0,61}[A-Za-z0-9_])?\.?)+$|^\[[0-9A-Fa-f:.]+\]$")


def _host(value: str) -> str:
    """``name`` or ``name:port``; names compare without case."""
    name, colon, port = value.rpartition(":") if not value.endswith("]") else (value, "", "")
    if not colon:
        name, port = value, ""
    if not _HOST_NAME.match(name) or (colon and not (port.isdigit() and 0 < int(port) < 65536)):
        raise ValueError(f"{value!r} is not a host name or name:port")
    return value.lower()


def _origin(value: str) -> str:
    """``scheme://host[:port]`` exactly as a browser sends it in ``Origin`` (no path, no trailing slash)."""
    scheme, sep, rest = value.partition("://")
    if scheme not in ("http", "https") or not sep or "/" in rest or not rest:
        raise ValueError(f"{value!r} is not an origin like https://ops.example.com or http://127.0.0.1:8080")
    _host(rest)
    return value.lower()


class HttpConfig(ConnectionLimits):
    """The HTTP server: pull API, ``/metrics``, health checks and the admin endpoints."""

    #: Off by default: only the Thrift port listens.
    enabled: bool = False
    #: Loopback by default: the admin endpoints are then reachable from this machine only.
    host: str = "127.0.0.1"
    #: 0 picks a free port (read it back from the log or ``ProxyService.http_port``).
    port: Annotated[int, Field(ge=0, le=65535)] = 9714
    #: When set, every ``/admin/...`` request needs ``Authorization: Bearer <admin_token>``. When unset,
    #: admin endpoints answer loopback peers only (the pull API, metrics and health checks stay open).
    admin_token: Annotated[str, Field(min_length=16)] | None = None
    #: Largest accepted request body; a bigger one is answered 413 (nothing of it is applied).
    max_body_bytes: Annotated[int, Field(ge=1024, le=256 * 1024 * 1024)] = 1024 * 1024
    #: Upper bound on a pull's ``linger_ms`` (long-poll wait).
    max_linger_ms: Annotated[int, Field(ge=0)] = 30_000
    #: Connections open at once (see ConnectionLimits; fewer than Thrift: HTTP clients are few).
    max_connections: Annotated[int, Field(ge=1)] = 256
    #: Browser origins (``scheme://host[:port]``) whose pages may call ``/v1/...`` and ``/admin/...``
    #: (CORS). A request whose ``Origin`` is not listed is refused (403); the console, served by the
    #: proxy itself, needs no entry. Empty (the default): no other site's page may call the proxy.
    allowed_origins: list[Annotated[str, AfterValidator(_origin)]] = []
    #: Host names (``name`` or ``name:port``) the console and ``/admin/...`` answer under when no
    #: admin_token is set, besides loopback literals and ``localhost``: a request naming any other
    #: ``Host`` (a DNS rebinding attack, say) is refused (403).
    allowed_hosts: list[Annotated[str, AfterValidator(_host)]] = []
    #: When set, ``/v1/...`` needs ``Authorization: Bearer <data_token>`` (401 otherwise).
    data_token: Annotated[str, Field(min_length=16)] | None = None
    #: Largest admin answer (dead letters, in-flight, blocked keys...): a page stops before the entry that
    #: would pass it and says where to go on.
    max_answer_bytes: Annotated[int, Field(ge=64 * 1024, le=256 * 1024 * 1024)] = 4 * 1024 * 1024
    #: Values longer than this are cut in listings (``value_truncated: true``); the full value is read
    #: alone, by id (itself within max_answer_bytes).
    max_listed_value_bytes: Annotated[int, Field(ge=64, le=16 * 1024 * 1024)] = 16 * 1024

    @model_validator(mode="after")
    def _one_body_fits(self) -> HttpConfig:
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ValueError("max_buffered_bytes must be at least max_body_bytes")
        if self.max_listed_value_bytes * 4 > self.max_answer_bytes:
            raise ValueError("max_answer_bytes must hold at least four listed values (4 x max_listed_value_bytes)")
        return self
