"""``POST /v1/pull`` and ``POST /v1/ack``: DDMQ's pull API as JSON, for clients without Thrift.

Same semantics as the Thrift ``pull`` and ``submit``, decided by the service (:mod:`ddmq.proxy.api.requests`):
a pull applies the piggy-backed ``results`` first, then answers messages of one (topic, qid), waiting
up to ``linger_ms`` when none are ready; acks for offsets the proxy does not hold are ignored
(counted). This module only translates: bodies are validated by the models below, whose bounds are
the shared table's (:data:`~ddmq.proxy.api.requests.REQUEST_BOUNDS`): unknown fields, wrong types and
a request field out of bounds are a 400 naming the field; a result entry naming no message (an offset
below 1, say) is the service's to leave out and count, as over Thrift. Answers are encoded as JSON.

A pull answer stays within the topic's ``max_reply_bytes`` in the bytes this server sends: the buffer
fills it by each message's JSON text (:class:`JsonReply`), which then makes up the answer as measured.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final, TypeVar

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from ddmq.proxy.api.requests import I32_MAX, I64_MAX, REQUEST_BOUNDS
from ddmq.proxy.api.surface import MAX_RESULT_OFFSETS, ConsumeService
from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.core.types import FailNote, PullBatch, QueueResult, StoredMessage
from ddmq.proxy.servers.clients import ClientTracker
from ddmq.proxy.servers.http.errors import validation_message


def whole(value: object) -> object:
    """A JSON number without a fraction (``1500.0``) as the integer it is: JSON Schema's ``integer``
    admits it, and a client that writes every number as a float (JavaScript's) sends such."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: Marks an integer field as taking whole-number floats (:func:`whole`).
WHOLE = BeforeValidator(whole)
_R = REQUEST_BOUNDS
#: An offset as the IDL's i64. Within the type but below 1 it names no message: the service leaves it
#: out and counts it, as Thrift's (RESULT_BOUNDS), so the good acks of the request still count.
Offset = Annotated[int, Field(ge=-(2**63), le=I64_MAX), WHOLE]
#: Reads a request's body within the server's limits (``HttpConnections.read_body``).
BodyReader = Callable[[web.Request], Awaitable[bytes]]


class JsonBody(BaseModel):
    """A request body: unknown fields and type coercions are errors (whole-number floats aside)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class FailDetailIn(JsonBody):
    """A failure with a retry delay and a reason (the Thrift ``FailDetail``)."""

    offset: Offset
    retry_after_ms: Annotated[int, Field(ge=-(2**31), le=I32_MAX), WHOLE] | None = None  # i32; < 0: left out
    reason: str | None = None  # cut to 1 KiB by the engine; the body's size bounds it here


class ResultIn(JsonBody):
    """Acks and fails for one (topic, qid): one node of DDMQ's ConsumeResult list. A topic or qid
    that names no queue (RESULT_BOUNDS) leaves the node out, counted, as over Thrift."""

    group: str | None = None
    topic: str = ""
    qid: Annotated[int, Field(ge=-(2**63), le=I64_MAX), WHOLE] | str = ""
    success: Annotated[list[Offset], Field(max_length=MAX_RESULT_OFFSETS)] = []
    fail: Annotated[list[Offset], Field(max_length=MAX_RESULT_OFFSETS)] = []
    release: Annotated[list[Offset], Field(max_length=MAX_RESULT_OFFSETS)] = []
    extend: Annotated[list[Offset], Field(max_length=MAX_RESULT_OFFSETS)] = []
    fail_details: Annotated[list[FailDetailIn], Field(max_length=MAX_RESULT_OFFSETS)] = []


#: The request's own fields take REQUEST_BOUNDS (the IDL's i32 for the numbers); what a value means
#: within them (the topic's cap, the server's linger bound) is the service's rule.
BatchSize = Annotated[int, Field(ge=_R["max_batch"].low, le=_R["max_batch"].high), WHOLE]
LingerMs = Annotated[int, Field(ge=_R["linger_ms"].low, le=_R["linger_ms"].high), WHOLE]
PerKey = Annotated[int, Field(ge=_R["max_per_key"].low, le=_R["max_per_key"].high), WHOLE]
GroupName = Annotated[str, Field(min_length=_R["group"].low, max_length=_R["group"].high)]
RequestId = Annotated[str, Field(min_length=_R["request_id"].low, max_length=_R["request_id"].high)]
#: Most result nodes one HTTP request may carry (a shape bound of this wire: a Thrift chain is bounded
#: by the decoder's nesting limit).
MAX_RESULT_NODES: Final = 10_000


class PullIn(JsonBody):
    group: GroupName
    topic: Annotated[str, Field(min_length=_R["topic"].low, max_length=_R["topic"].high)] | None = None
    max_batch: BatchSize | None = None
    linger_ms: LingerMs | None = None
    max_per_key: PerKey | None = None
    #: A retriable pull's id (the Thrift ``requestId``; :mod:`ddmq.proxy.api.pull_retries`).
    request_id: RequestId | None = None
    results: Annotated[list[ResultIn], Field(max_length=MAX_RESULT_NODES)] = []


class AckIn(JsonBody):
    group: GroupName
    results: Annotated[list[ResultIn], Field(max_length=MAX_RESULT_NODES)]


_M = TypeVar("_M", bound="JsonBody")


def parse(model: type[_M], raw: bytes) -> _M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise BadRequestError(f"invalid request body: {validation_message(exc)}") from exc


def results_from_json(results: list[ResultIn]) -> list[QueueResult]:
    """As engine values, as sent (the service gives a result without ``group`` the request's)."""
    return [
        QueueResult(
            r.group or "", r.topic, str(r.qid), list(r.success), list(r.fail), r.release or (), r.extend or (),
            [FailNote(d.offset, d.retry_after_ms, d.reason) for d in r.fail_details] if r.fail_details else (),
        )
        for r in results
    ]


def message_json(message: StoredMessage) -> dict[str, Any]:
    try:
        text: str | None = message.value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {
        "offset": message.offset,
        "key": message.key,
        "tag": message.tag,
        "properties": message.properties,
        "produce_ms": message.produce_ms,
        "value_base64": base64.b64encode(message.value).decode("ascii"),
        "value_text": text,
    }


#: Most bytes a ``/v1/pull`` answer takes besides its messages' texts: ``{"group": ..., "topic": ...,
#: "qid": ..., "messages": [], "runs": []}``, names of at most 200 characters.
REPLY_OVERHEAD_BYTES: Final = 4096
# What a message adds beside its own text: the ", " before it and its entry in "runs" (", " and up to
# ten digits).
_SEPARATORS: Final = 2 + 12


class JsonReply:
    """The bytes of one ``/v1/pull`` answer, counted by each message's JSON text (base64 and
    ``value_text`` included: several times the value for a binary or escaped body). The texts are
    kept, so :meth:`body` writes the answer from what was measured, encoding each message once."""

    overhead = REPLY_OVERHEAD_BYTES

    def __init__(self) -> None:
        self._texts: dict[int, tuple[StoredMessage, str]] = {}

    def message(self, message: StoredMessage) -> int:
        text = json.dumps(message_json(message))  # ASCII (ensure_ascii): one byte per character
        self._texts[message.offset] = (message, text)
        return len(text) + _SEPARATORS

    def _text(self, message: StoredMessage) -> str:
        kept = self._texts.get(message.offset)
        if kept is not None and kept[0] is message:
            return kept[1]
        return json.dumps(message_json(message))  # a message this reply did not measure (none, today)

    def body(self, group: str, topic: str | None, batch: PullBatch) -> bytes:
        queue = batch.queue
        head = json.dumps(
            {"group": group, "topic": queue.topic if queue is not None else topic,
             "qid": queue.qid if queue is not None else None}
        )
        parts = [head[:-1], ', "messages": [', ", ".join(map(self._text, batch.messages)), "]"]
        if batch.runs is not None:
            parts += ', "runs": ', json.dumps(batch.runs)
        parts.append("}")
        return "".join(parts).encode("ascii")


class PullApi:
    """The two routes, bound to one service."""

    def __init__(self, service: ConsumeService, read_body: BodyReader, clients: ClientTracker | None = None) -> None:
        self._service = service
        self._read_body = read_body
        self._clients = clients

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/pull", self.pull)
        app.router.add_post("/v1/ack", self.ack)

    async def pull(self, request: web.Request) -> web.Response:
        body = parse(PullIn, await self._read_body(request))
        reply = JsonReply()
        results = results_from_json(body.results)
        batch = await self._service.pull(
            body.group,
            body.topic,
            body.max_batch,
            body.linger_ms,
            results,
            max_per_key=body.max_per_key,
            reply=reply,
            request_id=body.request_id,
        )
        if self._clients is not None:
            # HTTP carries no version field: the User-Agent header says which client it is.
            self._clients.pulled("http", _peer(request), body.group, request.headers.get("User-Agent"), batch, results)
        return web.Response(body=reply.body(body.group, body.topic or None, batch), content_type="application/json")

    async def ack(self, request: web.Request) -> web.Response:
        body = parse(AckIn, await self._read_body(request))
        results = results_from_json(body.results)
        await self._service.submit(results, body.group)
        if self._clients is not None:
            self._clients.answered(results, body.group)
        return web.json_response({"ok": True})


def _peer(request: web.Request) -> str:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return request.remote or "?"
