"""ThriftHandler: one decoded ``ConsumerService`` call in, one reply frame out.

The request half of the Thrift server (:mod:`ddmq.proxy.servers.thrift.server` owns sockets, frames and
their limits): it maps each method's arguments onto one :class:`~ddmq.proxy.api.surface.ConsumeService`
call and the answer, or the error, onto the method's result struct. Request rules (linger, batch
size, which group a result belongs to, ...) are the service's; what is checked here is only that
the wire struct carries what the call needs (``PullRequest.groupId``, say).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final

from ddmq.protocol.wire import (
    ConsumeResult,
    ConsumerService,
    ConsumeStats,
    Context,
    Envelope,
    FetchResponse,
    FrameRefusedError,
    FrameTooLargeError,
    Message,
    PullException,
    PullResponse,
    QidResponse,
    TApplicationException,
    TMessageType,
    encode,
)
from ddmq.protocol.wire.reader import new_struct
from ddmq.proxy.api.requests import request_group, too_many_offsets
from ddmq.proxy.api.surface import ConsumeService
from ddmq.proxy.core.errors import INTERNAL_ERROR_CODE, BadRequestError, DdmqError, RequestError
from ddmq.proxy.core.pull_codec import FAST_PULL_REPLY, encode_pull_reply
from ddmq.proxy.core.types import FailNote, PullBatch, PullLease, QueueResult, StoredMessage
from ddmq.proxy.servers.clients import ClientTracker

log = logging.getLogger(__name__)

_ARGS: Final[dict[str, Any]] = {
    name: getattr(ConsumerService, f"{name}_args") for name in ConsumerService.thrift_services
}
_RESULTS: Final[dict[str, Any]] = {
    name: getattr(ConsumerService, f"{name}_result") for name in ConsumerService.thrift_services
}


class ThriftHandler:
    """Serves the calls of ``ConsumerService`` (pull, submit, getConsumeStats, fetch, ack, ackLeases)
    from one ConsumeService."""

    def __init__(self, service: ConsumeService, clients: ClientTracker | None = None) -> None:
        self._service = service
        self._clients = clients
        self._handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {
            "pull": self._pull,
            "submit": self._submit,
            "getConsumeStats": self._get_consume_stats,
            "fetch": self._fetch,
            "ack": self._ack,
            "ackLeases": self._ack_leases,
        }

    async def dispatch(
        self, envelope: Envelope, peer: str, write: Callable[[bytes], None] | None = None
    ) -> bytes | None:
        """The reply frame for one decoded call (None for a oneway call). With ``write``, a pull that
        waits has its reply written there as soon as it is answered (:class:`EarlyPullReply`), and None
        comes back for it."""
        name, mtype, seqid, args = envelope
        if mtype not in (TMessageType.CALL, TMessageType.ONEWAY):
            return _application_error(
                name, seqid, TApplicationException.INVALID_MESSAGE_TYPE, f"expected a call, got type {mtype}"
            )
        handler = self._handlers.get(name)
        if handler is None or args is None:
            log.debug("%s called unknown method %r", peer, name)
            return _application_error(name, seqid, TApplicationException.UNKNOWN_METHOD, f"unknown method {name!r}")
        try:
            if name == "pull":
                fast = mtype == TMessageType.CALL and FAST_PULL_REPLY
                group, topic, batch, sent = await self._pull(args, peer, write if fast else None, seqid)
                if sent:
                    return None
                if fast:
                    return _encode_pull_reply(seqid, group, topic, batch, peer)
                success: Any = pull_response(group, topic, batch)
            else:
                success = await handler(args)
        except Exception as exc:
            reply = _error_reply(name, seqid, exc, peer)
            return None if mtype == TMessageType.ONEWAY else reply
        if mtype == TMessageType.ONEWAY:
            return None
        # Made here, not before the call: the pull's own encoder needs no result struct.
        result = _RESULTS[name]()
        result.success = success
        try:
            return encode(name, TMessageType.REPLY, seqid, result)
        except Exception:
            log.exception("could not encode the %s reply for %s", name, peer)
            return _application_error(
                name, seqid, TApplicationException.INTERNAL_ERROR, "internal error: the reply could not be encoded"
            )

    def refused(self, exc: FrameRefusedError, peer: str) -> bytes | None:
        """The answer to a call refused while it was decoded (too many offsets, an integer outside its
        IDL type): a 1003 error, and nothing of it applied."""
        if exc.mtype == TMessageType.ONEWAY:
            return None
        if exc.name not in self._handlers:
            return _application_error(
                exc.name, exc.seqid, TApplicationException.UNKNOWN_METHOD, f"unknown method {exc.name!r}"
            )
        error = too_many_offsets() if isinstance(exc, FrameTooLargeError) else BadRequestError(str(exc))
        return _error_reply(exc.name, exc.seqid, error, peer)

    # handlers: decode the request, call the service once, encode the answer --------------------

    async def _pull(
        self, args: Any, peer: str = "", write: Callable[[bytes], None] | None = None, seqid: int = 0
    ) -> tuple[str, str | None, PullBatch, bool]:
        """The request's group and topic, the batch that answers it, and whether its reply (call
        ``seqid``) went out through ``write`` already."""
        request = args.request
        if request is None or not request.groupId:
            raise BadRequestError("PullRequest.groupId is required")
        lease = None
        if request.leaseId is not None:
            lease = PullLease(request.leaseId, request.leaseIndex or 0, request.leaseTimeoutMs)
        results = results_from_wire(request.result)
        early = EarlyPullReply(seqid, request.groupId, request.topic, peer, write) if write is not None else None
        batch = await self._service.pull(
            request.groupId,
            request.topic,
            request.maxBatchSize,
            request.maxLingerTime,
            results,
            lease,
            max_per_key=request.maxPerKey,
            early=early,
            request_id=request.requestId,
        )
        if self._clients is not None:
            version = request.version if isinstance(request.version, str) else None
            self._clients.pulled("thrift", peer, request.groupId, version, batch, results)
        return request.groupId, request.topic, batch, early is not None and early.sent

    async def _ack_leases(self, args: Any) -> int:
        request = args.request
        if request is None or not request.groupId:
            raise BadRequestError("LeaseAck.groupId is required")
        return await self._service.ack_leases(request.groupId, list(request.leaseIds or ()), bool(request.abandon))

    async def _submit(self, args: Any) -> bool:
        results = results_from_wire(args.result)
        # submit names no group of its own: its first result's is the request's, refused when unknown.
        await self._service.submit(results, request_group(results))
        if self._clients is not None:
            self._clients.answered(results)
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
                expired=dict(row.expired) or None,
                expiredLast=dict(row.expired_last) or None,
            )
            for row in rows
        ]

    async def _fetch(self, args: Any) -> FetchResponse:
        request = args.request
        if request is None or not request.groupId:
            raise BadRequestError("FetchRequest.groupId is required")
        pages = await self._service.fetch(
            request.groupId, request.fetchOffset, request.maxBatchSize, request.maxLingerTime
        )
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


class EarlyPullReply:
    """A parked pull's reply, written in the step that answers the pull (a read's batch landing, or
    the buffer's deferred wake) rather than when the connection's task resumes: that waits for every
    other callback of the loop iteration, other readers' batches included. Only the bytes go out
    early; the task still resumes to record the pull and read the connection's next frame."""

    def __init__(self, seqid: int, group: str, topic: str | None, peer: str, write: Callable[[bytes], None]) -> None:
        self.seqid = seqid
        self.group = group
        self.topic = topic
        self.peer = peer
        self.write = write
        self.sent = False

    def __call__(self, batch: PullBatch) -> None:
        frame = _encode_pull_reply(self.seqid, self.group, self.topic, batch, self.peer)
        try:
            self.write(frame)
        except ConnectionError:
            return  # lost: the task meets it when it resumes and writes the reply itself
        except Exception:  # never into the step that answered the pull (a reader's)
            log.exception("could not write the pull reply for %s early", self.peer)
            return
        self.sent = True


def results_from_wire(head: ConsumeResult | None) -> list[QueueResult]:
    """The ``nextResult`` list as engine values, one per node, as sent: missing pieces become empty
    values (the service gives a node without groupId the request's group, and ignores and counts
    what it cannot match)."""
    results = []
    node = head
    # The walk of iter_results, inline: a generator of an interpreted module costs a Python frame.
    while node is not None:
        context = node.context if node.context is not None else Context()
        results.append(
            QueueResult(
                group=context.groupId or "",
                topic=context.topic or "",
                qid=context.qid or "",
                success=list(node.successOffsets or ()),
                fail=list(node.failOffsets or ()),
                release=node.releaseOffsets or (),
                extend=node.extendOffsets or (),
                # A detail without its offset names no message: offset 0, which the rules leave out and count.
                fail_details=[
                    FailNote(d.offset or 0, d.retryAfterMs, d.reason) for d in node.failDetails
                ] if node.failDetails else (),
            )
        )
        node = node.nextResult
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


def _encode_pull_reply(seqid: int, group: str, topic: str | None, batch: PullBatch, peer: str) -> bytes:
    """The reply frame by the hand-written encoder (:mod:`ddmq.proxy.core.pull_codec`)."""
    queue = batch.queue
    try:
        if queue is None:
            return encode_pull_reply(seqid, group, topic or "", "", ())
        return encode_pull_reply(seqid, group, queue.topic, str(queue.qid), batch.messages, batch.runs)
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
        # fetch/ack declare no exception: a TApplicationException whose type is the PullException
        # code (an i32 every Thrift library hands its caller; the standard types stop at 10), and whose
        # message starts with it too.
        code = error.code or INTERNAL_ERROR_CODE
        return _application_error(name, seqid, code, f"{code}: {error.message}")
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


def args_for(name: str, mtype: int) -> Any:
    """The empty args struct to decode a call of ``name`` into (None for a method the IDL lacks)."""
    args_class = _ARGS.get(name)
    return new_struct(args_class) if args_class is not None else None


def _application_error(name: str, seqid: int, kind: int, message: str) -> bytes:
    return encode(name, TMessageType.EXCEPTION, seqid, TApplicationException(kind, message))
