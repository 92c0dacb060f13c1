"""HttpConnections: the HTTP server's limits on its clients, around aiohttp's own request handler.

aiohttp parses and answers; this module decides which connections it gets and how long they stay:

- at most ``max_connections`` open (a :class:`~ddmq.proxy.servers.listener.Listener` accepts; at the limit
  a new connection takes the place of one past its deadline, inside a request (headers or a body
  still arriving), or idle, oldest first, as :class:`~ddmq.proxy.servers.listener.Evictions` orders them;
  with every one busy it is closed at once; accept errors are logged once per interval), and only
  from ``allowed_clients`` when set;
- a connection with no request under way for ``idle_timeout_ms`` is closed; one whose request
  started (a first byte arrived) but whose headers did not arrive within ``request_timeout_ms`` is
  closed; a body must arrive within ``request_timeout_ms`` too (408, then closed). A request being
  handled, a long poll included, is never idle;
- a body declared bigger than ``max_body_bytes`` is answered 413 from its headers, before any of it
  is read, and the connection is closed;
- bodies being read at once hold at most ``max_buffered_bytes`` over all connections (a
  :class:`~ddmq.proxy.servers.byte_budget.ByteBudget`; a chunked body reserves ``max_body_bytes``).

Each connection's protocol is aiohttp's request handler wrapped by :class:`_GuardedProtocol`, which
forwards every event to it and keeps the connection's deadline; a sweep task closes the connections
past theirs. Handlers read bodies through :func:`read_body`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Final, cast

from aiohttp import web

from ddmq.config.schema import HttpConfig
from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.servers.byte_budget import ByteBudget
from ddmq.proxy.servers.http.errors import Handler, error_response
from ddmq.proxy.servers.listener import Evictions, Listener, parse_networks

log = logging.getLogger(__name__)

_IDLE: Final = "idle"
_REQUEST: Final = "request"
_BODY: Final = "body"  # a handler waits for the body (read_body answers 408 at its deadline, not the sweep)
_BUSY: Final = "busy"
_EXPIRED: Final = {
    _IDLE: "no request within http.idle_timeout_ms",
    _REQUEST: "the request headers did not arrive within http.request_timeout_ms",
}
_DOING: Final = {_IDLE: "an idle", _REQUEST: "a half-sent", _BODY: "a half-sent", _BUSY: "a busy"}


class BodyTimeoutError(BadRequestError):
    """The body of a request did not arrive within ``request_timeout_ms``."""


class _GuardedProtocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the deadline of what the connection is doing."""

    def __init__(self, inner: asyncio.Protocol, owner: HttpConnections) -> None:
        self.inner = inner
        self.owner = owner
        self.transport: asyncio.Transport | None = None
        self.phase = _IDLE
        self.deadline = float("inf")
        self.busy = 0
        #: Closed to admit a new connection at max_connections.
        self.evicted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream socket's transport; not an isinstance check: uvloop's transports have every method
        # of asyncio.Transport without being registered as its subclasses.
        self.transport = cast(asyncio.Transport, transport)
        self.owner.opened(self)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.phase == _IDLE:
            self.phase, self.deadline = _REQUEST, self.owner.now() + self.owner.request_s
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.lost(self)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def handling(self) -> None:
        self.busy += 1
        self.phase, self.deadline = _BUSY, float("inf")

    def handled(self) -> None:
        self.busy -= 1
        if not self.busy:
            self.phase, self.deadline = _IDLE, self.owner.now() + self.owner.idle_s


class HttpConnections:
    """The limits of one HTTP server; :meth:`start` listens and hands connections to ``protocol_factory``.

    Counters: :attr:`timeouts` (connections closed by a timeout), :attr:`too_large` (early 413s), and
    the listener's (``listener.refused``, ``listener.accept_errors``).
    """

    def __init__(self, config: HttpConfig) -> None:
        self._config = config
        self.idle_s = config.idle_timeout_ms / 1000
        self.request_s = config.request_timeout_ms / 1000
        self.budget = ByteBudget(config.max_buffered_bytes)
        allowed = parse_networks(config.allowed_clients) if config.allowed_clients is not None else None
        self.listener = Listener(
            "http", config.host, config.port, config.max_connections, self._accepted,
            make_room=self._make_room, allowed=allowed,
        )
        self._factory: Callable[[], asyncio.Protocol] | None = None
        self._open: dict[asyncio.BaseTransport, _GuardedProtocol] = {}
        self._evictions = Evictions(self._open.values, frozenset({_REQUEST, _BODY}), _IDLE)
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.timeouts = 0
        self.too_large = 0

    async def start(self, protocol_factory: Callable[[], asyncio.Protocol]) -> None:
        self._factory = protocol_factory
        self._loop = asyncio.get_running_loop()
        await self.listener.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="http-timeouts")

    async def stop_accepting(self) -> None:
        """Stop listening; open connections are left to aiohttp's shutdown."""
        await self.listener.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    def stats(self) -> dict[str, int]:
        """Counters and gauges as :meth:`ThriftServer.stats` has them (too_large: early 413s)."""
        return {
            "open": self.listener.open,
            "accepted": self.listener.accepted,
            "refused": self.listener.refused,
            "evicted": self.listener.evicted,
            "not_allowed": self.listener.not_allowed,
            "accept_errors": self.listener.accept_errors,
            "timeouts": self.timeouts,
            "too_large": self.too_large,
            "buffered_bytes": self.budget.used,
        }

    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    # connections -------------------------------------------------------------------------------

    def _accepted(self, sock: socket.socket) -> None:
        assert self._factory is not None and self._loop is not None
        protocol = _GuardedProtocol(self._factory(), self)
        task = self._loop.create_task(self._connect(sock, protocol))
        task.add_done_callback(_log_failure)

    async def _connect(self, sock: socket.socket, protocol: _GuardedProtocol) -> None:
        assert self._loop is not None
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, sock)
        except BaseException:
            sock.close()
            self.listener.closed()
            raise

    def opened(self, protocol: _GuardedProtocol) -> None:
        assert protocol.transport is not None
        self._open[protocol.transport] = protocol
        protocol.deadline = self.now() + self.idle_s

    def _make_room(self) -> str | None:
        """At max_connections: close the connection :class:`Evictions` picks; what it was, for the log."""
        now = self.now()
        victim = self._evictions.pick(now)
        if victim is None or victim.transport is None:
            return None
        late = " past its deadline" if victim.deadline <= now else ""
        description = f"{_DOING[victim.phase]} connection from {_peer(victim.transport)}{late}"
        victim.transport.abort()
        return description

    def lost(self, protocol: _GuardedProtocol) -> None:
        if self._open.pop(protocol.transport, None) is not None:  # type: ignore[arg-type]
            self.listener.closed()

    async def _sweep(self) -> None:
        period = min(max(min(self.idle_s, self.request_s) / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(period)
            now = self.now()
            for protocol in list(self._open.values()):
                if now > protocol.deadline and protocol.transport is not None and protocol.phase != _BODY:
                    self.timeouts += 1
                    log.info("closing http connection from %s: %s", _peer(protocol.transport), _EXPIRED[protocol.phase])
                    protocol.deadline = float("inf")
                    protocol.transport.abort()

    # requests ----------------------------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Marks the connection busy while its request is handled; refuses oversized bodies at once."""
        declared = request.content_length
        if declared is not None and declared > self._config.max_body_bytes:
            self.too_large += 1
            log.debug("%s %s from %s: body of %d bytes refused", request.method, request.path, request.remote, declared)
            most = self._config.max_body_bytes
            message = f"the request body is {declared} bytes, more than http.max_body_bytes ({most})"
            return _closing(error_response(413, BadRequestError.code, message))
        protocol = self._open.get(request.transport) if request.transport is not None else None
        if protocol is not None:
            protocol.handling()
        try:
            return await handler(request)
        except BodyTimeoutError as exc:
            self.timeouts += 1
            log.info("%s %s from %s: %s", request.method, request.path, request.remote, exc)
            return _closing(error_response(408, exc.code, str(exc)))
        finally:
            if protocol is not None:
                protocol.handled()

    async def read_body(self, request: web.Request) -> bytes:
        """The request body, read within ``request_timeout_ms`` and within the server's byte budget."""
        size = request.content_length
        if size is None:
            size = self._config.max_body_bytes if request.body_exists else 0
        protocol = self._open.get(request.transport) if request.transport is not None else None
        if protocol is not None:  # waiting for the client: a full server may close it for a new one
            protocol.phase, protocol.deadline = _BODY, self.now() + self.request_s
        try:
            async with asyncio.timeout(self.request_s), self.budget.reserve(size):
                return await request.read()
        except TimeoutError:
            raise BodyTimeoutError("the request body did not arrive within http.request_timeout_ms") from None
        finally:
            if protocol is not None and protocol.phase == _BODY:
                protocol.phase, protocol.deadline = _BUSY, float("inf")


def _closing(response: web.Response) -> web.Response:
    response.force_close()
    return response


def _peer(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("could not set up an http connection: %s", task.exception())
