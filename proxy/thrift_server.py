"""ThriftServer: DDMQ's ``ConsumerService`` over framed compact Thrift, in front of a ConsumeService.

A thin adapter: it reads frames, decodes them with :mod:`ddmq.protocol.wire`, calls one method of the
:class:`~ddmq.proxy.api.ConsumeService` and encodes the answer. Ordering, offsets and retries live in
the engine. Built on a :class:`~ddmq.proxy.listener.Listener` and asyncio streams rather than
thriftpy2's server so that every frame is size-checked before it is buffered and every payload is
decoded by the bounded reader.

Per connection, requests are served one after another (a long-poll ``pull`` holds its connection);
connections are served concurrently. A frame whose declared length is not in ``1..max_frame_bytes``
or whose payload does not decode closes that connection only. Limits, each closing the connection
that breaks it (logged): ``max_connections`` open at once (more are accepted and closed at once);
``idle_timeout_ms`` without a request (a call being served, a long poll included, is not idle);
``frame_timeout_ms`` for a frame whose first byte arrived to arrive whole, and for a reply to be
taken by the client; ``max_buffered_bytes`` for the frames above :data:`INLINE_DECODE_MAX_BYTES`
being read or decoded at once, over all connections (a frame waits for room within its
``frame_timeout_ms``).

>>> async with ThriftServer(service, "0.0.0.0", 9713, max_frame_bytes=1 << 20, max_linger_ms=30_000):
...     await stop.wait()
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Final, NamedTuple

from ddmq.protocol.pull_codec import FAST_PULL_REPLY, encode_pull_reply
from ddmq.protocol.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER_BYTES,
    ConsumeResult,
    ConsumerService,
    ConsumeStats,
    Context,
    Envelope,
    FetchResponse,
    FrameDecodeError,
    FrameTooLargeError,
    Message,
    PullException,
    PullResponse,
    QidResponse,
    TApplicationException,
    TMessageType,
    decode,
    encode,
    frame_length,
    iter_results,
)
from ddmq.proxy.api import MAX_RESULT_OFFSETS, ConsumeService
from ddmq.proxy.byte_budget import ByteBudget
from ddmq.proxy.errors import INTERNAL_ERROR_CODE, BadRequestError, DdmqError, NotSupportedError, RequestError
from ddmq.proxy.listener import Listener
from ddmq.proxy.types import PullBatch, PullLease, QueueResult, StoredMessage

log = logging.getLogger(__name__)

#: Upper bound for a client's ``maxLingerTime`` unless the server is told otherwise.
DEFAULT_MAX_LINGER_MS: Final = 30_000
#: Payloads above this size are decoded in a worker thread, so one big frame cannot stall the loop, and
#: count against ``max_buffered_bytes``. A pull is a few hundred bytes: pulls never wait for that budget.
INLINE_DECODE_MAX_BYTES: Final = 64 * 1024
DEFAULT_MAX_CONNECTIONS: Final = 1000
DEFAULT_IDLE_TIMEOUT_MS: Final = 60_000
DEFAULT_FRAME_TIMEOUT_MS: Final = 10_000
DEFAULT_MAX_BUFFERED_BYTES: Final = 64 * 1024 * 1024

# What a connection is doing, for the timeout sweep.
_IDLE: Final = "idle"
_FRAME: Final = "frame"
_REPLY: Final = "reply"
_BUSY: Final = "busy"
_EXPIRED: Final = {
    _IDLE: "no request within idle_timeout_ms",
    _FRAME: "the frame did not arrive whole within frame_timeout_ms",
    _REPLY: "the reply was not taken within frame_timeout_ms",
}

_ARGS: Final[dict[str, Any]] = {
    name: getattr(ConsumerService, f"{name}_args") for name in ConsumerService.thrift_services
}
_RESULTS: Final[dict[str, Any]] = {
    name: getattr(ConsumerService, f"{name}_result") for name in ConsumerService.thrift_services
}


class _Connection:
    """One client connection: its task and the deadline of what it is doing (see ``_sweep``)."""

    __slots__ = ("deadline", "expired", "peer", "phase", "task")

    def __init__(self, task: asyncio.Task[None], peer: str) -> None:
        self.task = task
        self.peer = peer
        self.phase = _IDLE
        self.deadline = float("inf")
        self.expired: str | None = None


class ThriftServer:
    """Serves ``ConsumerService`` (pull, submit, getConsumeStats, fetch, ack) on one port.

    ``port=0`` binds a free port; read it back from :attr:`port` after :meth:`start`. Counters for
    metrics: :attr:`connections` (accepted so far), :attr:`frames_rejected` (bad length),
    :attr:`decode_errors` (undecodable payload), :attr:`timeouts` (closed by a timeout),
    :attr:`connections_refused` and :attr:`accept_errors` (from the listener).
    """

    def __init__(
        self,
        service: ConsumeService,
        host: str,
        port: int,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_linger_ms: int = DEFAULT_MAX_LINGER_MS,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS,
        frame_timeout_ms: int = DEFAULT_FRAME_TIMEOUT_MS,
        max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES,
    ) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be positive, got {max_frame_bytes}")
        if max_linger_ms < 0:
            raise ValueError(f"max_linger_ms must not be negative, got {max_linger_ms}")
        if idle_timeout_ms < 1 or frame_timeout_ms < 1:
            raise ValueError("idle_timeout_ms and frame_timeout_ms must be positive")
        if max_buffered_bytes < max_frame_bytes:
            raise ValueError(f"max_buffered_bytes ({max_buffered_bytes}) must hold one frame of max_frame_bytes")
        self._service = service
        self._max_frame_bytes = max_frame_bytes
        self._max_linger_ms = max_linger_ms
        self._idle_s = idle_timeout_ms / 1000
        self._frame_s = frame_timeout_ms / 1000
        self._host = host
        self._budget = ByteBudget(max_buffered_bytes)
        # One big frame decoded at a time: each decoding thread takes the GIL from the loop, so
        # several at once would slow every other connection's requests that many times over.
        self._decoding = asyncio.Semaphore(1)
        self._listener = Listener("thrift", host, port, max_connections, self._accepted)
        self._started = False
        self._closing = False
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "pull": self._pull,
            "submit": self._submit,
            "getConsumeStats": self._get_consume_stats,
            "fetch": self._fetch,
            "ack": self._ack,
            "ackLeases": self._ack_leases,
        }
        self.connections = 0
        self.frames_rejected = 0
        self.decode_errors = 0
        self.timeouts = 0

    # lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("ThriftServer.start() called twice")
        self._started = True
        await self._listener.start()
        self._sweeper = asyncio.create_task(self._sweep(), name="thrift-timeouts")
        log.info("thrift server listening on %s:%d", self._host, self.port)

    async def close(self) -> None:
        """Stop listening and drop every connection (an in-flight call is cancelled)."""
        if not self._started or self._closing:
            return
        self._closing = True
        await self._listener.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        tasks = [*self._connections, *([self._sweeper] if self._sweeper else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        log.info("thrift server closed")

    @property
    def port(self) -> int:
        """The bound port (the chosen one when constructed with port 0)."""
        return self._listener.port

    @property
    def active_connections(self) -> int:
        return len(self._connections)

    @property
    def connections_refused(self) -> int:
        return self._listener.refused

    @property
    def accept_errors(self) -> int:
        return self._listener.accept_errors

    def stats(self) -> dict[str, int]:
        """Counters (accepted, refused, accept_errors, timeouts, frames_rejected, decode_errors) and
        gauges (open, buffered_bytes), for metrics."""
        return {
            "open": self.active_connections,
            "accepted": self._listener.accepted,
            "refused": self._listener.refused,
            "accept_errors": self._listener.accept_errors,
            "timeouts": self.timeouts,
            "frames_rejected": self.frames_rejected,
            "decode_errors": self.decode_errors,
            "buffered_bytes": self._budget.used,
        }

    @property
    def buffered_bytes(self) -> int:
        """Bytes of big frames being read or decoded now (bounded by ``max_buffered_bytes``)."""
        return self._budget.used

    async def __aenter__(self) -> ThriftServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # connections -------------------------------------------------------------------------------

    def _accepted(self, sock: socket.socket) -> None:
        task = asyncio.get_running_loop().create_task(self._serve_connection(sock))
        self._connections[task] = _Connection(task, _peer_name(sock))

    async def _serve_connection(self, sock: socket.socket) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = self._connections[task]
        peer = connection.peer
        self.connections += 1
        writer = None
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
            log.debug("thrift connection from %s", peer)
            await self._serve_frames(reader, writer, connection)
        except asyncio.CancelledError:
            if connection.expired is None or self._closing:
                raise
            self.timeouts += 1
            log.info("closing thrift connection from %s: %s", peer, connection.expired)
        except (ConnectionError, TimeoutError) as exc:
            log.debug("thrift connection from %s lost: %s", peer, exc)
        except Exception:
            log.exception("thrift connection from %s failed", peer)
        finally:
            del self._connections[task]
            self._listener.closed()
            if writer is None:
                sock.close()
            else:
                writer.close()
                try:
                    await writer.wait_closed()
                except (ConnectionError, TimeoutError):
                    pass

    async def _sweep(self) -> None:
        """Cancel the connections past their deadline, a few times per shortest timeout."""
        loop = asyncio.get_running_loop()
        period = min(max(min(self._idle_s, self._frame_s) / 4, 0.01), 1.0)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for connection in list(self._connections.values()):
                if now > connection.deadline and connection.expired is None:
                    connection.expired = _EXPIRED[connection.phase]
                    connection.task.cancel()

    async def _serve_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, connection: _Connection
    ) -> None:
        loop = asyncio.get_running_loop()
        peer = connection.peer
        while True:
            connection.phase, connection.deadline = _IDLE, loop.time() + self._idle_s
            try:
                # The first byte alone: from it on, the frame has frame_timeout_ms to arrive whole.
                first = await reader.readexactly(1)
                connection.phase, connection.deadline = _FRAME, loop.time() + self._frame_s
                header = first + await reader.readexactly(FRAME_HEADER_BYTES - 1)
            except asyncio.IncompleteReadError as exc:
                if exc.partial or connection.phase == _FRAME:
                    log.debug("%s closed the connection inside a frame header", peer)
                return
            length = frame_length(header)
            if not 0 < length <= self._max_frame_bytes:
                self.frames_rejected += 1
                log.warning(
                    "closing thrift connection from %s: frame length %d is outside 1..%d",
                    peer,
                    length,
                    self._max_frame_bytes,
                )
                return
            try:
                if length > INLINE_DECODE_MAX_BYTES:
                    envelope = await self._read_big_frame(reader, length, connection)
                else:
                    payload = await reader.readexactly(length)
                    connection.phase, connection.deadline = _BUSY, float("inf")
                    envelope = decode(payload, _args_for, MAX_RESULT_OFFSETS)
            except asyncio.IncompleteReadError as exc:
                log.info("%s closed the connection after %d of %d frame bytes", peer, len(exc.partial), length)
                return
            except FrameTooLargeError as exc:
                reply = self._too_large(exc, peer)
            except FrameDecodeError as exc:
                self.decode_errors += 1
                log.warning("closing thrift connection from %s: undecodable %d-byte frame: %s", peer, length, exc)
                return
            else:
                reply = await self._dispatch(envelope, peer)
            if reply is not None:
                connection.phase, connection.deadline = _REPLY, loop.time() + self._frame_s
                writer.write(reply)
                await writer.drain()

    async def _read_big_frame(self, reader: asyncio.StreamReader, length: int, connection: _Connection) -> Envelope:
        """Read and decode a frame above INLINE_DECODE_MAX_BYTES within the byte budget; its payload is
        gone when this returns (a method of its own so that no local outlives the reservation)."""
        async with self._budget.reserve(length):
            payload = await _read_big(reader, length)
            connection.phase, connection.deadline = _BUSY, float("inf")
            async with self._decoding:
                return await asyncio.to_thread(decode, payload, _args_for, MAX_RESULT_OFFSETS)

    async def _dispatch(self, envelope: Envelope, peer: str) -> bytes | None:
        name, mtype, seqid, args = envelope
        if mtype not in (TMessageType.CALL, TMessageType.ONEWAY):
            return _application_error(
                name, seqid, TApplicationException.INVALID_MESSAGE_TYPE, f"expected a call, got type {mtype}"
            )
        handler = self._handlers.get(name)
        if handler is None or args is None:
            log.debug("%s called unknown method %r", peer, name)
            return _application_error(name, seqid, TApplicationException.UNKNOWN_METHOD, f"unknown method {name!r}")
        result = _RESULTS[name]()
        try:
            success = await handler(args)
            if isinstance(success, _PullReply):
                if mtype == TMessageType.CALL and FAST_PULL_REPLY:
                    return _encode_pull_reply(seqid, success, peer)
                success = pull_response(*success)
            result.success = success
        except Exception as exc:
            reply = _error_reply(name, seqid, exc, peer)
            return None if mtype == TMessageType.ONEWAY else reply
        if mtype == TMessageType.ONEWAY:
            return None
        try:
            return encode(name, TMessageType.REPLY, seqid, result)
        except Exception:
            log.exception("could not encode the %s reply for %s", name, peer)
            return _application_error(
                name, seqid, TApplicationException.INTERNAL_ERROR, "internal error: the reply could not be encoded"
            )

    def _too_large(self, exc: FrameTooLargeError, peer: str) -> bytes | None:
        """The answer to a call with too many offsets: a 1003 error, and nothing of it applied."""
        if exc.mtype == TMessageType.ONEWAY:
            return None
        if exc.name not in self._handlers:
            return _application_error(
                exc.name, exc.seqid, TApplicationException.UNKNOWN_METHOD, f"unknown method {exc.name!r}"
            )
        error = BadRequestError(
            f"a request may carry at most {exc.limit} offsets (acks and fails together); split them over several"
        )
        return _error_reply(exc.name, exc.seqid, error, peer)

    # handlers: decode the request, call the service once, encode the answer --------------------

    async def _pull(self, args: Any) -> _PullReply:
        request = args.request
        if request is None or not request.groupId:
            raise BadRequestError("PullRequest.groupId is required")
        linger_ms = self._linger(request.maxLingerTime)
        lease = None
        if request.leaseId is not None:
            lease = PullLease(request.leaseId, request.leaseIndex or 0, request.leaseTimeoutMs)
        batch = await self._service.pull(
            request.groupId,
            request.topic,
            request.maxBatchSize,
            linger_ms,
            queue_results(request.result, default_group=request.groupId),
            lease,
            max_per_key=request.maxPerKey,
        )
        return _PullReply(request.groupId, request.topic, batch)

    async def _ack_leases(self, args: Any) -> int:
        request = args.request
        if request is None or not request.groupId:
            raise BadRequestError("LeaseAck.groupId is required")
        return await self._service.ack_leases(request.groupId, list(request.leaseIds or ()))

    async def _submit(self, args: Any) -> bool:
        await self._service.submit(queue_results(args.result, default_group=""))
        return True

    async def _get_consume_stats(self, args: Any) -> list[ConsumeStats]:
        request = args.request
        if request is None or not request.group:
            raise BadRequestError("ConsumeStatsRequest.group is required")
        rows = await self._service.consume_stats(request.group, request.topic)
        return [
            ConsumeStats(
                group=row.group,
                topic=row.topic,
                consumeOffsets=dict(row.consume_offsets),
                produceOffsets=dict(row.produce_offsets),
                owners=dict(row.owners),
                leaseTtlMs=dict(row.lease_ttl_ms),
                leaseTerms=dict(row.lease_terms),
            )
            for row in rows
        ]

    def _linger(self, asked_ms: int | None) -> int | None:
        """The client's ``maxLingerTime`` within ``0..max_linger_ms`` (None: the service's default)."""
        return None if asked_ms is None else min(max(asked_ms, 0), self._max_linger_ms)

    async def _fetch(self, args: Any) -> FetchResponse:
        request = args.request
        if request is None or not request.groupId:
            raise BadRequestError("FetchRequest.groupId is required")
        linger_ms = self._linger(request.maxLingerTime)
        pages = await self._service.fetch(request.groupId, request.fetchOffset, request.maxBatchSize, linger_ms)
        return FetchResponse(
            code=0,
            results=[
                QidResponse(
                    topic=page.topic,
                    qid=str(page.qid),
                    nextRequestOffset=page.next_offset,
                    messages=[_message(m) for m in page.messages],
                )
                for page in pages
            ],
        )

    async def _ack(self, args: Any) -> bool:
        result = args.result
        if result is None or not result.groupId:
            raise BadRequestError("AckResult.groupId is required")
        await self._service.ack(result.groupId, result.offsets or {})
        return True


async def _read_big(reader: asyncio.StreamReader, length: int) -> bytes:
    """``readexactly(length)`` in pieces: the stream's own buffer stays small. (After one big
    readexactly, its bytearray keeps the frame's capacity for as long as the connection lives.)"""
    chunks: list[bytes] = []
    left = length
    while left:
        chunk = await reader.read(min(left, INLINE_DECODE_MAX_BYTES))
        if not chunk:
            raise asyncio.IncompleteReadError(b"".join(chunks), length)
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def queue_results(head: ConsumeResult | None, default_group: str) -> list[QueueResult]:
    """The ``nextResult`` list as engine values, one per node; a node without groupId gets ``default_group``.

    Missing pieces become empty values (the engine ignores and counts what it cannot match).
    """
    results = []
    for node in iter_results(head):
        context = node.context if node.context is not None else Context()
        results.append(
            QueueResult(
                group=context.groupId or default_group,
                topic=context.topic or "",
                qid=context.qid or "",
                success=list(node.successOffsets or ()),
                fail=list(node.failOffsets or ()),
            )
        )
    return results


def pull_response(group: str, topic: str | None, batch: PullBatch) -> PullResponse:
    """The wire answer for ``batch``; an empty batch keeps the asked-for topic and an empty qid."""
    if batch.queue is None:
        return PullResponse(context=Context(groupId=group, topic=topic or "", qid=""), messages=[])
    return PullResponse(
        context=Context(groupId=group, topic=batch.queue.topic, qid=str(batch.queue.qid)),
        messages=[_message(m) for m in batch.messages],
        runs=batch.runs,
    )


def _message(m: StoredMessage) -> Message:
    return Message(
        key=m.key, value=m.value, tag=m.tag, offset=m.offset, properties=dict(m.properties), produceTime=m.produce_ms
    )


class _PullReply(NamedTuple):
    """What ``_pull`` answers before encoding: :func:`pull_response`'s arguments."""

    group: str
    topic: str | None
    batch: PullBatch


def _encode_pull_reply(seqid: int, reply: _PullReply, peer: str) -> bytes:
    """The reply frame by the hand-written encoder (:mod:`ddmq.protocol.pull_codec`)."""
    queue = reply.batch.queue
    try:
        if queue is None:
            return encode_pull_reply(seqid, reply.group, reply.topic or "", "", ())
        batch = reply.batch
        return encode_pull_reply(seqid, reply.group, queue.topic, str(queue.qid), batch.messages, batch.runs)
    except Exception:
        log.exception("could not encode the pull reply for %s", peer)
        return _application_error(
            "pull", seqid, TApplicationException.INTERNAL_ERROR, "internal error: the reply could not be encoded"
        )


def _error_reply(name: str, seqid: int, exc: Exception, peer: str) -> bytes:
    """The reply frame for a call of ``name`` that raised ``exc``: its declared error field, else a
    TApplicationException."""
    result = _RESULTS[name]()
    error = _pull_exception(exc, name, peer)
    if "error" not in (field[1] for field in result.thrift_spec.values()):
        # fetch/ack declare no exception: a standard client sees a TApplicationException.
        kind = (
            TApplicationException.UNKNOWN_METHOD
            if error.code == NotSupportedError.code
            else TApplicationException.INTERNAL_ERROR
        )
        return _application_error(name, seqid, kind, f"{error.code}: {error.message}")
    result.error = error
    return encode(name, TMessageType.REPLY, seqid, result)


def _pull_exception(exc: Exception, method: str, peer: str) -> PullException:
    """Map an error raised while serving ``method`` to what goes on the wire."""
    if isinstance(exc, DdmqError):
        level = logging.DEBUG if isinstance(exc, RequestError) else logging.WARNING
        log.log(level, "%s from %s failed: %s (code %d)", method, peer, exc, exc.code)
        return PullException(code=exc.code, message=str(exc) or type(exc).__name__)
    log.error("internal error serving %s from %s", method, peer, exc_info=exc)
    return PullException(code=INTERNAL_ERROR_CODE, message="internal error")


def _args_for(name: str, mtype: int) -> Any:
    args_class = _ARGS.get(name)
    return args_class() if args_class is not None else None


def _application_error(name: str, seqid: int, kind: int, message: str) -> bytes:
    return encode(name, TMessageType.EXCEPTION, seqid, TApplicationException(kind, message))


def _peer_name(sock: socket.socket) -> str:
    try:
        peer = sock.getpeername()
    except OSError:
        return "?"
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
