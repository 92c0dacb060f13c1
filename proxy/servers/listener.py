"""Listener: accepts TCP connections for one server, within a connection limit, through accept errors.

Both servers (Thrift and HTTP) accept through a Listener instead of the event loop's own accept
loop, for three reasons. A connection from an address outside ``allowed_clients`` is closed at once.
At ``max_connections`` the server makes room for the new connection by closing one it can spare
(:class:`Evictions`: past its deadline, then stalled inside a request, then idle, oldest first); only
when none can go (every connection is busy serving a call) is the new one accepted and closed at
once, so the client learns it was refused and the descriptors left stay for the connections being
served, Redis and the log. And when ``accept()`` fails for want of resources (``EMFILE`` under a low
descriptor limit, ``ENFILE``, ``ENOBUFS``, ``ENOMEM``), the listener logs one line per
:data:`LOG_INTERVAL_S` with the number of failures, waits :data:`ACCEPT_RETRY_S` and accepts again;
the connections already open keep being served.

>>> listener = Listener("thrift", "127.0.0.1", 9713, max_connections=1000, serve=hand_over)
>>> await listener.start()      # hand_over(sock) gets every accepted socket; call listener.closed() after
>>> await listener.close()
"""

from __future__ import annotations

import asyncio
import errno
import heapq
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Final, Generic, Protocol, TypeVar

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


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(cidrs: Iterable[str]) -> list[Network]:
    """``["10.0.0.0/8", "127.0.0.1", "::1"]`` as networks (a bare address is a network of one);
    raises ValueError naming a bad entry."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as exc:
            raise ValueError(f"{cidr!r} is not an IP address or CIDR network: {exc}") from None
    return networks


def is_allowed(address: str, networks: Sequence[Network]) -> bool:
    """Whether peer ``address`` lies in one of ``networks`` (an IPv4-mapped IPv6 address counts as IPv4)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False  # not an IP peer (a Unix socket, say): nothing to match
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip in network for network in networks)


class Evictable(Protocol):
    """What :class:`Evictions` reads of a connection: what it is doing (``phase``), until when
    (``deadline``, the loop's clock; infinite while a call is served), and whether it was chosen."""

    phase: str
    deadline: float
    evicted: bool


C = TypeVar("C", bound=Evictable)

#: Evictions rank connections: past their deadline first, then stalled inside a request, then idle.
_EXPIRED_RANK: Final = 0
_PARTIAL_RANK: Final = 1
_IDLE_RANK: Final = 2


class Evictions(Generic[C]):
    """Which connection a server at ``max_connections`` closes to admit a new one.

    First any connection past its deadline that the timeout sweep has not closed yet (a request or a
    reply past ``request_timeout_ms``, an idle one past ``idle_timeout_ms``); then the connections
    inside a request (a partial frame, or headers or a body still arriving), the one that started
    first; then idle ones, the one idle longest first. A connection serving a call (a long poll
    included) is never chosen. Within a phase the deadline orders by start, as every connection of a
    phase gets the same timeout. Ranking is a scan of every connection, so the best :data:`BATCH`
    are kept between accepts (checked again before use: a connection that moved on since is
    skipped), and a flood of connections at the cap costs one scan per ``BATCH`` evictions.
    """

    BATCH: Final = 64

    def __init__(self, connections: Callable[[], Iterable[C]], partial: frozenset[str], idle: str) -> None:
        self._connections = connections
        self._partial = partial
        self._idle = idle
        self._picks: list[tuple[int, float, int, str, C]] = []  # best last

    def pick(self, now: float) -> C | None:
        """The connection to close now, marked ``evicted``; None when every connection is busy."""
        rebuilt = False
        while True:
            while self._picks:
                _, deadline, _, phase, connection = self._picks.pop()
                if not connection.evicted and connection.phase == phase and connection.deadline == deadline:
                    connection.evicted = True
                    return connection
            if rebuilt:
                return None
            self._picks = sorted(heapq.nsmallest(self.BATCH, self._ranked(now)), reverse=True)
            rebuilt = True

    def rank(self, connection: C, now: float) -> int | None:
        if connection.evicted:
            return None
        if connection.deadline <= now:
            return _EXPIRED_RANK
        if connection.phase in self._partial:
            return _PARTIAL_RANK
        if connection.phase == self._idle:
            return _IDLE_RANK
        return None

    def _ranked(self, now: float) -> Iterable[tuple[int, float, int, str, C]]:
        for connection in self._connections():
            rank = self.rank(connection, now)
            if rank is not None:
                yield rank, connection.deadline, id(connection), connection.phase, connection


class Listener:
    """Accepts connections on ``host``:``port`` and hands each socket to ``serve``.

    ``serve`` owns the socket from then on and must call :meth:`closed` once when the connection
    ends; if ``serve`` raises, the listener closes the socket and counts it closed. At
    ``max_connections``, ``make_room()`` may close a connection to admit the new one: it returns a
    description of what it closed for the log, or None (then the new one is refused). With
    ``allowed`` (networks), a peer outside them is closed at accept. Counters: :attr:`accepted`,
    :attr:`refused` (over the limit, nothing to close), :attr:`evicted` (closed to make room),
    :attr:`not_allowed`, :attr:`accept_errors`.
    """

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        max_connections: int,
        serve: Callable[[socket.socket], None],
        *,
        make_room: Callable[[], str | None] | None = None,
        allowed: Sequence[Network] | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be positive, got {max_connections}")
        self.name = name
        self._host = host
        self._port = port
        self.max_connections = max_connections
        self._serve = serve
        self._make_room = make_room
        self._allowed = allowed
        self._sockets: list[socket.socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.open = 0
        self.accepted = 0
        self.refused = 0
        self.evicted = 0
        self.not_allowed = 0
        self.accept_errors = 0
        self._log_refused = ThrottledLog(log, logging.WARNING)
        self._log_evicted = ThrottledLog(log, logging.INFO)
        self._log_not_allowed = ThrottledLog(log, logging.WARNING)
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
                sock, address = await loop.sock_accept(listening)
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
            peer = address[0] if isinstance(address, tuple) else str(address)
            if self._allowed is not None and not is_allowed(peer, self._allowed):
                self.not_allowed += 1
                self._log_not_allowed("%s: closed a connection from %s: not in allowed_clients", self.name, peer)
                sock.close()
                continue
            made_room = False
            if self.open >= self.max_connections:
                closed = self._make_room() if self._make_room is not None else None
                if closed is None:
                    self.refused += 1
                    self._log_refused(
                        "%s: refusing a connection: %d open, max_connections is %d, every one busy",
                        self.name, self.open, self.max_connections,
                    )
                    sock.close()
                    continue
                self.evicted += 1
                made_room = True
                self._log_evicted(
                    "%s: max_connections (%d) reached: closed %s to admit one from %s",
                    self.name, self.max_connections, closed, peer,
                )
            self.accepted += 1
            self.open += 1
            try:
                self._serve(sock)
            except Exception:
                log.exception("%s: could not set up a connection", self.name)
                sock.close()
                self.open -= 1
            if made_room:
                await asyncio.sleep(0)  # let the closed connection give its descriptor back
