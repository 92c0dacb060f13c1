"""Listener: accepts TCP connections for one server, within a connection limit, through accept errors.

Both servers (Thrift and HTTP) accept through a Listener instead of the event loop's own accept
loop, for two reasons. A connection over ``max_connections`` is accepted and closed at once, so the
client learns it was refused and the descriptors left stay for the connections being served, Redis
and the log. And when ``accept()`` fails for want of resources (``EMFILE`` under a low descriptor
limit, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``), the listener logs one line per :data:`LOG_INTERVAL_S`
with the number of failures, waits :data:`ACCEPT_RETRY_S` and accepts again; the connections already
open keep being served.

>>> listener = Listener("thrift", "127.0.0.1", 9713, max_connections=1000, serve=hand_over)
>>> await listener.start()      # hand_over(sock) gets every accepted socket; call listener.closed() after
>>> await listener.close()
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

#: Accept errors that mean "out of a resource": wait and retry instead of spinning on them.
RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: Pause after a resource error before the next accept.
ACCEPT_RETRY_S: Final = 0.1
#: Refused connections and accept errors are logged at most once per this many seconds each.
LOG_INTERVAL_S: Final = 10.0
BACKLOG: Final = 128


class ThrottledLog:
    """Logs a recurring event at most once per ``interval_s``, with how often it happened meanwhile."""

    def __init__(self, logger: logging.Logger, level: int, interval_s: float = LOG_INTERVAL_S) -> None:
        self._log = logger
        self._level = level
        self._interval_s = interval_s
        self._next = 0.0
        self._suppressed = 0

    def __call__(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now < self._next:
            self._suppressed += 1
            return
        self._next = now + self._interval_s
        more, self._suppressed = self._suppressed, 0
        if more:
            message += f" ({more} more since the last such line)"
        self._log.log(self._level, message, *args)


class Listener:
    """Accepts connections on ``host``:``port`` and hands each socket to ``serve``.

    ``serve`` owns the socket from then on and must call :meth:`closed` once when the connection
    ends; if ``serve`` raises, the listener closes the socket and counts it closed. Counters:
    :attr:`accepted`, :attr:`refused` (over the limit), :attr:`accept_errors`.
    """

    def __init__(
        self, name: str, host: str, port: int, max_connections: int, serve: Callable[[socket.socket], None]
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be positive, got {max_connections}")
        self.name = name
        self._host = host
        self._port = port
        self.max_connections = max_connections
        self._serve = serve
        self._sockets: list[socket.socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.open = 0
        self.accepted = 0
        self.refused = 0
        self.accept_errors = 0
        self._log_refused = ThrottledLog(log, logging.WARNING)
        self._log_error = ThrottledLog(log, logging.ERROR)

    async def start(self) -> None:
        if self._sockets:
            raise RuntimeError("Listener.start() called twice")
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self._host or None, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        port = self._port
        try:
            for family, kind, proto, _, address in dict.fromkeys(infos):
                sock = socket.socket(family, kind, proto)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                # Port 0 on a name with several addresses: every socket takes the port the first got.
                sock.bind((address[0], port, *address[2:]))
                port = sock.getsockname()[1]
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except BaseException:
            self._close_sockets()
            raise
        self._tasks = [asyncio.create_task(self._accept(sock), name=f"{self.name}-accept") for sock in self._sockets]

    async def close(self) -> None:
        """Stop accepting; connections already handed over are their server's to close."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets = []

    @property
    def port(self) -> int:
        if not self._sockets:
            raise RuntimeError(f"the {self.name} listener is not listening")
        port: int = self._sockets[0].getsockname()[1]
        return port

    def closed(self) -> None:
        """A connection handed to ``serve`` has ended."""
        self.open -= 1

    async def _accept(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listening)
            except OSError as exc:
                if exc.errno not in RESOURCE_ERRNOS:
                    continue  # the peer gave up before we took it (ECONNABORTED and the like)
                self.accept_errors += 1
                self._log_error(
                    "%s: cannot accept connections: %s (%d open here); retrying every %.1fs",
                    self.name, exc.strerror or exc, self.open, ACCEPT_RETRY_S,
                )
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            if self.open >= self.max_connections:
                self.refused += 1
                self._log_refused(
                    "%s: refusing a connection: %d open, max_connections is %d",
                    self.name, self.open, self.max_connections,
                )
                sock.close()
                continue
            self.accepted += 1
            self.open += 1
            try:
                self._serve(sock)
            except Exception:
                log.exception("%s: could not set up a connection", self.name)
                sock.close()
                self.open -= 1
