"""``POST /v1/pull`` and ``POST /v1/ack``: DDMQ's pull API as JSON, for clients without Thrift.

Same semantics as the Thrift ``pull`` and ``submit``, decided by the service (:mod:`ddmq.proxy.requests`):
a pull applies the piggy-backed ``results`` first, then answers messages of one (topic, qid), waiting
up to ``linger_ms`` when none are ready; acks for offsets the proxy does not hold are ignored
(counted). This module only translates: bodies are validated by the models below (unknown fields,
wrong types and offsets < 1 are a 400 naming the field), answers are encoded as JSON.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ddmq.proxy.api import MAX_RESULT_OFFSETS, ConsumeService
from ddmq.proxy.clients import ClientTracker
from ddmq.proxy.errors import BadRequestError
from ddmq.proxy.http_server.errors import validation_message
from ddmq.proxy.types import PullBatch, QueueResult, StoredMessage

#: Offsets are dense per queue, from 1; the wire type is i64.
Offset = Annotated[int, Field(ge=1, le=2**63 - 1)]
#: Reads a request's body within the server's limits (``HttpConnections.read_body``).
BodyReader = Callable[[web.Request], Awaitable[bytes]]


class JsonBody(BaseModel):
    """A request body: unknown fields and type coercions are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ResultIn(JsonBody):
    """Acks and fails for one (topic, qid): one node of DDMQ's ConsumeResult list."""

    group: str | None = None
    topic: Annotated[str, Field(min_length=1, max_length=200)]
    qid: Annotated[int, Field(ge=0, le=65535)] | Annotated[str, Field(max_length=20)]
    success: Annotated[list[Offset], Field(max_length=MAX_RESULT_OFFSETS)] = []
    fail: Annotated[list[Offset], Field(max_length=MAX_RESULT_OFFSETS)] = []


class PullIn(JsonBody):
    group: Annotated[str, Field(min_length=1, max_length=200)]
    topic: Annotated[str, Field(max_length=200)] | None = None
    max_batch: Annotated[int, Field(ge=0, le=10_000)] | None = None
    linger_ms: Annotated[int, Field(ge=0, le=2**31 - 1)] | None = None
    max_per_key: Annotated[int, Field(ge=0, le=10_000)] | None = None
    results: Annotated[list[ResultIn], Field(max_length=10_000)] = []


class AckIn(JsonBody):
    group: Annotated[str, Field(min_length=1, max_length=200)]
    results: Annotated[list[ResultIn], Field(max_length=10_000)]


_M = TypeVar("_M", bound="JsonBody")


def parse(model: type[_M], raw: bytes) -> _M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise BadRequestError(f"invalid request body: {validation_message(exc)}") from exc


def results_from_json(results: list[ResultIn]) -> list[QueueResult]:
    """As engine values, as sent (the service gives a result without ``group`` the request's)."""
    return [QueueResult(r.group or "", r.topic, str(r.qid), list(r.success), list(r.fail)) for r in results]


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


def pull_json(group: str, topic: str | None, batch: PullBatch) -> dict[str, Any]:
    queue = batch.queue
    answer: dict[str, Any] = {
        "group": group,
        "topic": queue.topic if queue is not None else topic,
        "qid": queue.qid if queue is not None else None,
        "messages": [message_json(m) for m in batch.messages],
    }
    if batch.runs is not None:
        answer["runs"] = batch.runs
    return answer


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
        results = results_from_json(body.results)
        batch = await self._service.pull(
            body.group,
            body.topic,
            body.max_batch,
            body.linger_ms,
            results,
            max_per_key=body.max_per_key,
        )
        if self._clients is not None:
            # HTTP carries no version field: the User-Agent header says which client it is.
            self._clients.pulled("http", _peer(request), body.group, request.headers.get("User-Agent"), batch, results)
        return web.json_response(pull_json(body.group, body.topic or None, batch))

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
