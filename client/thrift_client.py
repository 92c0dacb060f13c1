"""Clients for the proxy's ``ConsumerService``: :class:`ProxyClient` (blocking) and :class:`AsyncProxyClient`.

Both speak framed compact Thrift through :mod:`ddmq.protocol.wire`, connect on first use and again after
a failure, number their calls and check that each reply answers the call just made. A pull is allowed
``timeout_s`` on top of the long-poll wait it asks for.

>>> with ProxyClient("127.0.0.1", 9713) as client:
...     response = client.pull(PullRequest(groupId="rides", maxBatchSize=32, maxLingerTime=1000))
...     offsets = [m.offset for m in response.messages]

Errors: :class:`PullError` carries the server's ``PullException`` (``code``, ``message``);
:class:`ProxyConnectionError` means the transport failed (the connection is dropped; the next call
reconnects); :class:`ProxyProtocolError` means the reply made no sense, and its subclass
:class:`WrongPortError` that the server speaks HTTP (the proxy's HTTP port, not its Thrift port);
:class:`RemoteApplicationError` is a Thrift ``TApplicationException`` from the server (an unknown
method, say). Every error says whether calling again can help: :attr:`ProxyClientError.retriable`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from types import TracebackType
from typing import Any, Final

from thriftpy2.thrift import TPayload

from ddmq.protocol.errors import ERROR_CODES, DdmqError, is_retriable
from ddmq.protocol.wire import (
    DEFAULT_PORT,
    FRAME_HEADER_BYTES,
    AckResult,
    ConsumeResult,
    ConsumerService,
    ConsumeStats,
    ConsumeStatsRequest,
    Envelope,
    FetchRequest,
    FetchResponse,
    FrameDecodeError,
    LeaseAck,
    PullRequest,
    PullResponse,
    TApplicationException,
    TMessageType,
    decode,
    encode,
    frame_length,
)

__all__ = [
    "DEFAULT_MAX_REPLY_BYTES",
    "AsyncProxyClient",
    "ProxyClient",
    "ProxyClientError",
    "ProxyConnectionError",
    "ProxyProtocolError",
    "PullError",
    "RemoteApplicationError",
    "WrongPortError",
]

#: Replies carry message bodies, so they may be much larger than requests.
DEFAULT_MAX_REPLY_BYTES: Final = 256 * 1024 * 1024
#: What the proxy waits when a pull does not say (``maxLingerTime`` unset).
_SERVER_DEFAULT_LINGER_MS: Final = 1000
_MAX_CLIENT_SEQID: Final = 0x7FFFFFFF
#: ``PullException`` codes that retrying the same request cannot cure (the table's non-retriable ones).
FATAL_CODES: Final = frozenset(code for code, entry in ERROR_CODES.items() if not entry.retriable)
#: What a reply's 4-byte frame header holds when the server is an HTTP server answering our bytes
#: with an HTTP error ("HTTP/1.1 400 ..."): the proxy's HTTP port instead of its Thrift port.
_HTTP_REPLY: Final = b"HTTP"


class ProxyClientError(DdmqError):
    """Base of the errors the proxy clients raise. ``retriable`` is False when calling again cannot
    help (an unknown group, a server that is not a Thrift proxy): consumers stop on those."""

    retriable = True


class PullError(ProxyClientError):
    """The proxy answered with a ``PullException``; ``code`` is one of :data:`ddmq.protocol.errors.ERROR_CODES`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.retriable = is_retriable(code)


class ProxyConnectionError(ProxyClientError, ConnectionError):
    """Connecting, sending or receiving failed; the connection was dropped and the next call reconnects.
    ``sent`` is False when the call never left (no connection could be made): only a call that may
    have reached the proxy can have lost its reply."""

    sent = True


def _not_connected(message: str) -> ProxyConnectionError:
    error = ProxyConnectionError(message)
    error.sent = False
    return error


class ProxyProtocolError(ProxyClientError):
    """The reply was malformed or answered another call; the connection was dropped."""


class WrongPortError(ProxyProtocolError):
    """The server answered in HTTP: the address is a proxy's HTTP port (or another web server), not a
    Thrift port. Not retriable."""

    retriable = False


class RemoteApplicationError(ProxyClientError):
    """The server replied with a Thrift ``TApplicationException`` (``kind`` is its type number).

    ``fetch`` and ``ack`` declare no exception, so the proxy reports their errors this way with the
    ``PullException`` code first (``"1001: unknown group 'g'..."``); :attr:`code` is that number, else None.
    """

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        head, sep, _ = message.partition(":")
        # None where the message carries no PullException code: unlike the other errors' ``code``,
        # this one says what the proxy sent, and it may have sent none.
        self.code: int | None = int(head) if sep and head.isdigit() else None  # type: ignore[assignment]
        if self.code is not None:
            self.retriable = is_retriable(self.code)
        else:
            self.retriable = kind == TApplicationException.INTERNAL_ERROR


class _CallCodec:
    """What both clients share: sequence ids, request frames and the reading of replies."""

    def __init__(self, host: str, port: int, timeout_s: float, max_frame_bytes: int) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.max_frame_bytes = max_frame_bytes
        self._seqid = 0

    def _request(self, name: str, **args: Any) -> tuple[int, bytes]:
        self._seqid = self._seqid + 1 if self._seqid < _MAX_CLIENT_SEQID else 1
        body = getattr(ConsumerService, f"{name}_args")(**args)
        return self._seqid, encode(name, TMessageType.CALL, self._seqid, body)

    def _check_length(self, header: bytes) -> int:
        if header == _HTTP_REPLY:
            raise WrongPortError(
                f"{self.host}:{self.port} answered in HTTP: it is an HTTP port (the proxy's HTTP API?), "
                "not the proxy's Thrift port (default 9713)"
            )
        length = frame_length(header)
        if not 0 < length <= self.max_frame_bytes:
            raise ProxyProtocolError(
                f"{self.host}:{self.port} sent a frame of {length} bytes (allowed 1..{self.max_frame_bytes})"
            )
        return length

    def _answer(self, name: str, seqid: int, payload: bytes) -> Any:
        """The ``success`` value of the reply to call ``seqid``, or the error it carries, raised."""

        def body_for(reply_name: str, mtype: int) -> TPayload | None:
            if mtype == TMessageType.EXCEPTION:
                return TApplicationException()
            result: TPayload = getattr(ConsumerService, f"{name}_result")()
            return result

        try:
            envelope: Envelope = decode(payload, body_for)
        except FrameDecodeError as exc:
            raise ProxyProtocolError(f"undecodable reply to {name}: {exc}") from exc
        if envelope.name != name or envelope.seqid != seqid:
            raise ProxyProtocolError(f"expected the reply to {name} #{seqid}, got {envelope.name} #{envelope.seqid}")
        body: Any = envelope.body
        if envelope.type == TMessageType.EXCEPTION:
            raise RemoteApplicationError(body.type or 0, body.message or "")
        if envelope.type != TMessageType.REPLY:
            raise ProxyProtocolError(f"expected a reply to {name}, got message type {envelope.type}")
        error = getattr(body, "error", None)
        if error is not None:
            raise PullError(error.code if error.code is not None else 0, error.message or "")
        if body.success is None:
            raise ProxyProtocolError(f"the reply to {name} carries no result")
        return body.success

    @staticmethod
    def _pull_wait_s(request: PullRequest | FetchRequest) -> float:
        linger_ms = request.maxLingerTime if request.maxLingerTime is not None else _SERVER_DEFAULT_LINGER_MS
        return max(linger_ms, 0) / 1000


class ProxyClient(_CallCodec):
    """A blocking client on one TCP connection; safe to share between threads (calls are serialised)."""

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        timeout_s: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        super().__init__(host, port, timeout_s, max_frame_bytes)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def connect(self) -> None:
        """Open the connection now rather than on the first call."""
        with self._lock:
            self._connection()

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> ProxyClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def pull(self, request: PullRequest) -> PullResponse:
        response: PullResponse = self._call("pull", self._pull_wait_s(request), request=request)
        return response

    def submit(self, result: ConsumeResult | None) -> bool:
        ok: bool = self._call("submit", 0.0, result=result)
        return ok

    def get_consume_stats(self, request: ConsumeStatsRequest) -> list[ConsumeStats]:
        stats: list[ConsumeStats] = self._call("getConsumeStats", 0.0, request=request)
        return stats

    def ack_leases(self, request: LeaseAck) -> int:
        """Ack every message of the pull leases named in ``request``; returns how many were acked."""
        acked: int = self._call("ackLeases", 0.0, request=request)
        return acked

    def fetch(self, request: FetchRequest) -> FetchResponse:
        """Low-level read from the offsets the request names (no ordering gates); see ``proxy/api/fetch.py``."""
        response: FetchResponse = self._call("fetch", self._pull_wait_s(request), request=request)
        return response

    def ack(self, result: AckResult) -> bool:
        """Store low-level positions (the next offset to fetch, per topic and qid) for the group."""
        ok: bool = self._call("ack", 0.0, result=result)
        return ok

    def _call(self, name: str, wait_s: float, **args: Any) -> Any:
        with self._lock:
            sock = self._connection()
            seqid, frame = self._request(name, **args)
            try:
                sock.settimeout(self.timeout_s + wait_s)
                sock.sendall(frame)
                length = self._check_length(self._receive(sock, FRAME_HEADER_BYTES))
                payload = self._receive(sock, length)
                return self._answer(name, seqid, payload)
            except OSError as exc:
                self._drop()
                raise ProxyConnectionError(f"{name} to {self.host}:{self.port} failed: {exc!r}") from exc
            except ProxyProtocolError:
                # The stream may be mid-message or out of step: start afresh on the next call.
                self._drop()
                raise

    def _connection(self) -> socket.socket:
        if self._sock is None:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            except OSError as exc:
                raise _not_connected(f"cannot connect to {self.host}:{self.port}: {exc!r}") from exc
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = sock
        return self._sock

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _receive(self, sock: socket.socket, size: int) -> bytes:
        buffer = bytearray(size)
        view = memoryview(buffer)
        received = 0
        while received < size:
            count = sock.recv_into(view[received:])
            if count == 0:
                raise ConnectionError("the server closed the connection")
            received += count
        return bytes(buffer)


class AsyncProxyClient(_CallCodec):
    """The asyncio twin of :class:`ProxyClient`; concurrent calls on one client take turns."""

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        timeout_s: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        super().__init__(host, port, timeout_s, max_frame_bytes)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def connect(self) -> None:
        async with self._lock:
            await self._connection()

    async def close(self) -> None:
        async with self._lock:
            writer = self._drop()
            if writer is not None:
                try:
                    await writer.wait_closed()
                except OSError:
                    pass

    async def __aenter__(self) -> AsyncProxyClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def pull(self, request: PullRequest) -> PullResponse:
        response: PullResponse = await self._call("pull", self._pull_wait_s(request), request=request)
        return response

    async def submit(self, result: ConsumeResult | None) -> bool:
        ok: bool = await self._call("submit", 0.0, result=result)
        return ok

    async def get_consume_stats(self, request: ConsumeStatsRequest) -> list[ConsumeStats]:
        stats: list[ConsumeStats] = await self._call("getConsumeStats", 0.0, request=request)
        return stats

    async def ack_leases(self, request: LeaseAck) -> int:
        """Ack every message of the pull leases named in ``request``; returns how many were acked."""
        acked: int = await self._call("ackLeases", 0.0, request=request)
        return acked

    async def fetch(self, request: FetchRequest) -> FetchResponse:
        response: FetchResponse = await self._call("fetch", self._pull_wait_s(request), request=request)
        return response

    async def ack(self, result: AckResult) -> bool:
        ok: bool = await self._call("ack", 0.0, result=result)
        return ok

    async def _call(self, name: str, wait_s: float, **args: Any) -> Any:
        async with self._lock:
            reader, writer = await self._connection()
            seqid, frame = self._request(name, **args)
            try:
                async with asyncio.timeout(self.timeout_s + wait_s):
                    writer.write(frame)
                    await writer.drain()
                    length = self._check_length(await reader.readexactly(FRAME_HEADER_BYTES))
                    payload = await reader.readexactly(length)
            except (OSError, asyncio.IncompleteReadError) as exc:  # TimeoutError is an OSError
                self._drop()
                raise ProxyConnectionError(f"{name} to {self.host}:{self.port} failed: {exc!r}") from exc
            except BaseException:
                # A bad frame length or a cancellation leaves the stream mid-message.
                self._drop()
                raise
            try:
                return self._answer(name, seqid, payload)
            except ProxyProtocolError:
                self._drop()
                raise

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            try:
                async with asyncio.timeout(self.timeout_s):
                    reader, writer = await asyncio.open_connection(self.host, self.port)
            except (OSError, TimeoutError) as exc:
                raise _not_connected(f"cannot connect to {self.host}:{self.port}: {exc!r}") from exc
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._reader, self._writer = reader, writer
        return self._reader, self._writer

    def _drop(self) -> asyncio.StreamWriter | None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
        return writer
