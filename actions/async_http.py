"""``AsyncHttp``: push each message to an HTTP service with aiohttp (DDMQ's ``AsyncHttpAction``).

Settings under ``async_http`` (see :class:`~ddmq.config.schema.AsyncHttpConfig`). Each attempt goes
to the next of ``urls`` (round-robin), with the configured method, headers, query parameters taken
from the body by JSONPath, ``Authorization: Bearer <token>`` when a token is set, and the body as JSON
or form fields. Every request also carries ``X-Ddmq-Group``, ``X-Ddmq-Topic``, ``X-Ddmq-Qid``,
``X-Ddmq-Offset`` (together unique: an upstream can use them to drop duplicates) and ``X-Ddmq-Attempt``.

A 2xx answer finishes the message. Anything else (another status, a timeout, a refused connection)
is a failed attempt, retried and finally dead-lettered like a pull client's fail (see
:mod:`ddmq.actions.push`). ``max_in_flight`` workers share one connection pool of that size;
``http_max_tps`` paces requests with a token bucket.
"""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

import aiohttp

from ddmq.actions.base import ChainContext, register
from ddmq.actions.job import INVALID_JSON, NOT_PARSED, Job
from ddmq.actions.pacing import TokenBucket
from ddmq.actions.push import Failure, Outcome, PushAction
from ddmq.config.jsonpath import MISSING, compile_jsonpath
from ddmq.protocol.redis.connection import redact_url

log = logging.getLogger(__name__)

#: Bytes of an error answer kept for the dead-letter reason.
_ERROR_SNIPPET = 200
#: Bytes of an answer read at most (so the connection can be reused); a longer answer closes it.
_MAX_ANSWER = 64 * 1024


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


@register("AsyncHttp")
class AsyncHttpAction(PushAction):
    name = "AsyncHttp"

    def __init__(self, ctx: ChainContext) -> None:
        config = ctx.config.async_http
        assert config is not None  # the config refuses AsyncHttp without its settings
        super().__init__(ctx, workers=config.max_in_flight)
        self.config = config
        self._urls = itertools.cycle(config.urls)
        self._params = [(name, compile_jsonpath(path)) for name, path in config.query_params.items()]
        headers = dict(config.headers)
        if config.token:
            headers["Authorization"] = f"Bearer {config.token}"
        if config.body == "json":
            headers.setdefault("Content-Type", "application/json")
        self._headers = headers
        self._limiter = TokenBucket(config.http_max_tps) if config.http_max_tps else None
        self._timeout = aiohttp.ClientTimeout(total=config.timeout_ms / 1000)
        self._session: aiohttp.ClientSession | None = None

    def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.config.max_in_flight)
        self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def request_parts(self, job: Job) -> tuple[dict[str, str], Any] | Failure:
        """Query parameters and body of ``job``'s request, or why there cannot be one."""
        data = job.data
        if data is INVALID_JSON or data is NOT_PARSED:
            data = MISSING
        params = {}
        for name, getter in self._params:
            value = getter(data)
            if value is not MISSING and value is not None:
                params[name] = _text(value)
        body: Any = None
        if self.config.body == "json":
            body = job.message.value
        elif self.config.body == "form":
            if not isinstance(data, dict):
                return Failure("body=form needs a JSON object body", permanent=True)
            body = {name: _text(value) for name, value in data.items() if value is not None}
        return params, body

    async def push(self, jobs: list[Job]) -> list[Outcome]:
        return [await self._push_one(job) for job in jobs]

    async def _push_one(self, job: Job) -> Outcome:
        parts = self.request_parts(job)
        if isinstance(parts, Failure):
            return parts
        params, body = parts
        if self._limiter is not None:
            await self._limiter.take(1)
        session = self._session
        assert session is not None, "AsyncHttp action not started"
        url = next(self._urls)
        headers = {
            **self._headers,
            "X-Ddmq-Group": self._ctx.group,
            "X-Ddmq-Topic": self._ctx.topic,
            "X-Ddmq-Qid": str(job.qid),
            "X-Ddmq-Offset": str(job.offset),
            "X-Ddmq-Attempt": str(job.attempts),
        }
        try:
            async with session.request(
                self.config.method, url, params=params, data=body, headers=headers, allow_redirects=False
            ) as response:
                answer = await response.content.read(_MAX_ANSWER)
                if 200 <= response.status < 300:
                    return None
                snippet = answer[:_ERROR_SNIPPET].decode("utf-8", "replace")
                return Failure(f"HTTP {response.status} from {redact_url(url)}: {snippet}")
        except TimeoutError:
            return Failure(f"no answer from {redact_url(url)} within {self.config.timeout_ms} ms")
        except aiohttp.ClientError as exc:
            # The error's text can quote the URL, credentials included: name its type, show the URL masked.
            return Failure(f"request to {redact_url(url)} failed: {type(exc).__name__}: {_masked(exc, url)}")


def _masked(exc: BaseException, url: str) -> str:
    """``exc``'s text with ``url`` (and so its password) shown masked."""
    return str(exc).replace(url, redact_url(url))
