"""Operator endpoints: ``/metrics``, ``/healthz``, ``/readyz`` and the ``/admin/...`` JSON views.

The handlers decode the query, call one function of :mod:`ddmq.proxy.ops.views`,
:mod:`ddmq.proxy.store.dead_letters` or :mod:`ddmq.protocol.redis.status`, and encode the answer. Who may
call ``/admin/...`` is decided before, by :mod:`ddmq.proxy.servers.http.guard`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import Field

from ddmq.protocol.redis.status import QueueStatus
from ddmq.proxy.api.explain import explain_key
from ddmq.proxy.api.keys import key_action, list_keys
from ddmq.proxy.api.requests import MAX_QID, REQUEST_BOUNDS
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.core.errors import (
    BadRequestError,
    BrokerError,
    UnavailableError,
    UnknownEntryError,
)
from ddmq.proxy.core.types import StoredMessage
from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer
from ddmq.proxy.ops.views import KEY_STATES, blocked_keys, group_view, in_flight, queue_counts
from ddmq.proxy.servers.http.actions_api import ActionsApi, record
from ddmq.proxy.servers.http.letters import MAX_RATE, check_pace, plan_purge, plan_replay, run_replay
from ddmq.proxy.servers.http.letters import answer as replay_answer
from ddmq.proxy.servers.http.lookup import find_group, find_topic, query_int
from ddmq.proxy.servers.http.pause_api import PauseApi
from ddmq.proxy.servers.http.pull_api import WHOLE, BodyReader, JsonBody, message_json, parse
from ddmq.proxy.store.dead_letters import MAX_PAGE, DeadLetter, DeadLetters, check_id
from ddmq.proxy.store.status import group_owners

if TYPE_CHECKING:
    from ddmq.proxy.servers.http.view import ProxyView

log = logging.getLogger(__name__)
_KEY = REQUEST_BOUNDS["key"]

#: Room kept in an answer for the fields around its list.
ANSWER_RESERVE: Final = 16 * 1024
#: Largest ``offset`` of a paged view (far beyond any group's ``concurrency``).
MAX_OFFSET: Final = 10_000_000
#: How long /readyz waits for Redis to answer a PING.
READY_PING_S: Final = 1.0


def _next_offset(offset: int, shown: int, total: int) -> int | None:
    return offset + shown if offset + shown < total else None


def _offset(request: web.Request, name: str = "offset") -> int:
    value = query_int(request, name, 0, MAX_OFFSET)
    return 0 if value is None else value


def _limit(request: web.Request, default: int, most: int = MAX_PAGE) -> int:
    value = query_int(request, "limit", 1, most)
    return default if value is None else value


def _key_states(request: web.Request) -> frozenset[str] | None:
    """``state=failing,in_flight``: only keys in those states; none given: every key."""
    raw = request.query.get("state")
    if raw is None:
        return None
    states = frozenset(raw.split(","))
    if not states or not states <= set(KEY_STATES):
        raise BadRequestError(f"state must be a comma-separated list of {', '.join(KEY_STATES)}, got {raw[:100]!r}")
    return states


class SelectionIn(JsonBody):
    """``{"ids": [...]}``, ``{"all": true}`` or (replay) ``{"key": K}``; ``dry_run``, ``by`` (who)."""

    ids: list[str] | None = None
    all: bool = False
    key: Annotated[str, Field(min_length=_KEY.low, max_length=_KEY.high)] | None = None
    #: Say what the call would touch, touch nothing.
    dry_run: bool = False
    #: Replay at most this many messages a second (none: as fast as Redis takes them).
    rate: Annotated[int, Field(ge=1, le=MAX_RATE), WHOLE] | None = None
    by: Annotated[str, Field(max_length=200)] | None = None


class KeyActionIn(JsonBody):
    """``{"key": K, "qid": optional, "by": optional}``: an operator's action on one key."""

    key: Annotated[str, Field(min_length=_KEY.low, max_length=_KEY.high)]
    qid: Annotated[int, Field(ge=0, le=MAX_QID), WHOLE] | None = None
    by: Annotated[str, Field(max_length=200)] | None = None


def _chosen(body: SelectionIn) -> list[str] | None:
    """The ids selected (None: all)."""
    if body.all == (body.ids is not None):
        raise BadRequestError('give either "ids": [...] or "all": true')
    if body.ids is not None:
        if len(body.ids) > MAX_PAGE:
            raise BadRequestError(f"at most {MAX_PAGE} ids per call")
        return [check_id(entry_id) for entry_id in body.ids]
    return None


def dead_letter_json(letter: DeadLetter) -> dict[str, Any]:
    """A dead letter as the API shows it; a cut value keeps its text up to the last whole character."""
    message = message_json(
        StoredMessage(letter.offset, letter.value, letter.key, letter.tag, letter.properties, letter.produce_ms)
    )
    if letter.value_truncated and message["value_text"] is None:
        message["value_text"] = _text_prefix(letter.value)
    return {
        "id": letter.id,
        "qid": letter.qid,
        **message,
        "value_bytes": letter.value_bytes,
        "value_truncated": letter.value_truncated,
        "attempts": letter.attempts,
        "error": letter.error,
        "dead_ms": letter.dead_ms,
    }


def _text_prefix(value: bytes) -> str | None:
    """``value`` as text when it is UTF-8 cut inside a character (at most 3 bytes of it lost)."""
    for drop in range(1, 4):
        try:
            return value[:-drop].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return None


def json_size(value: Any) -> int:
    """Bytes of ``value`` as ``web.json_response`` encodes it."""
    return len(json.dumps(value))


def fit(items: list[dict[str, Any]], budget: int) -> list[dict[str, Any]]:
    """The longest prefix of ``items`` whose JSON fits ``budget`` bytes; at least one item."""
    used = 0
    for count, item in enumerate(items):
        used += json_size(item) + 2  # the separator
        if count and used > budget:
            return items[:count]
    return items


def _queue_of(consumer: TopicConsumer, qid: int | None) -> int | None:
    """``qid`` when the topic has that queue; past its queues (yet within any topic's bound, which the
    document gives) a 404: no such queue."""
    if qid is not None and qid >= max(consumer.queues, 1):
        raise UnknownEntryError(f"topic {consumer.topic!r} has queues 0..{consumer.queues - 1}, not {qid}")
    return qid


class OperatorApi:
    def __init__(self, service: ProxyView, read_body: BodyReader) -> None:
        self._service = service
        self._read_body = read_body
        http = service.config.http
        #: Bytes an answer's list may take: the cap less room for the fields around it.
        self._list_bytes = http.max_answer_bytes - ANSWER_RESERVE
        self._max_answer = http.max_answer_bytes
        self._value_cut = http.max_listed_value_bytes
        #: One replay or purge at a time per (group, topic) here, so a key's dead letters go back in order
        #: (the claims in Redis keep calls of several proxies from producing an entry twice).
        self._letter_locks: dict[tuple[str, str], asyncio.Lock] = {}

    def add_routes(self, app: web.Application) -> None:
        router = app.router
        router.add_get("/metrics", self.metrics)
        router.add_get("/healthz", self.healthz)
        router.add_get("/readyz", self.readyz)
        router.add_get("/admin/groups", self.groups)
        router.add_get("/admin/groups/{group}", self.group)
        router.add_get("/admin/groups/{group}/in-flight", self.in_flight)
        router.add_get("/admin/groups/{group}/blocked-keys", self.blocked_keys)
        router.add_get("/admin/groups/{group}/clients", self.clients)
        letters = "/admin/groups/{group}/topics/{topic}/dead-letters"
        router.add_get(letters, self.dead_letters)
        router.add_post(letters + "/replay", self.replay)
        router.add_post(letters + "/purge", self.purge)
        router.add_get(letters + "/{id}", self.dead_letter)
        keys_path = "/admin/groups/{group}/topics/{topic}/keys"
        router.add_get(keys_path, self.keys)
        router.add_get(keys_path + "/explain", self.explain_key)
        # "explain" is a GET route's: a POST to it is a 405 with Allow, not a key action to refuse.
        router.add_post(keys_path + "/{action:(?!explain$)[^{}/]+}", self.key_action)
        PauseApi(self._service, self._read_body).add_routes(app)
        ActionsApi(self._service, fit, self._list_bytes).add_routes(app)

    # health ----------------------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        metrics = self._service.metrics
        await metrics.refresh()
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "instance_id": self._service.config.instance_id})

    async def readyz(self, request: web.Request) -> web.Response:
        service = self._service
        running = service.running
        redis_ok = False
        if running and service.redis is not None:
            try:
                redis_ok = bool(await asyncio.wait_for(service.redis.ping(), READY_PING_S))
            except (BrokerError, TimeoutError) as exc:  # the client's, and this wait's own deadline
                log.info("readyz: redis does not answer: %s", exc)
        ready = running and redis_ok
        return web.json_response(
            {"status": "ready" if ready else "not ready", "checks": {"running": running, "redis": redis_ok}},
            status=200 if ready else 503,
        )

    # views -----------------------------------------------------------------------------------

    def _group(self, request: web.Request) -> ConsumerGroup:
        return find_group(self._service, request)

    def _topic(self, group: ConsumerGroup, topic: str | None) -> str | None:
        return find_topic(group, topic)

    async def groups(self, request: web.Request) -> web.Response:
        views = [asdict(group_view(group)) for _, group in sorted(self._service.groups.items())]
        return web.json_response({"groups": views})

    async def group(self, request: web.Request) -> web.Response:
        group = self._group(request)
        first = _offset(request, "queue_offset")
        view = asdict(group_view(group))
        topics = sorted(group.consumers)
        status, dead = await asyncio.to_thread(group_owners, self._service.redis_url, group.name, topics)
        answer: dict[str, Any] = {
            **view,
            "dead_letters": dead,
            "members": status.members,
            "member_ttl_ms": self._service.config.leases.ttl_ms,
            "retention": [asdict(holder) for holder in status.retention],
            "redis_memory": {"used_bytes": status.used_memory, "max_bytes": status.maxmemory},
            "queue_offset": first,
        }
        # Thousands of queues over several topics could pass the cap: the queue rows are paged.
        rows = fit(await self._queue_rows(group, status.queues[first:]), self._list_bytes - json_size(answer))
        answer["queues"] = rows
        answer["next_queue_offset"] = _next_offset(first, len(rows), len(status.queues))
        return web.json_response(answer)

    async def _queue_rows(self, group: ConsumerGroup, queues: list[QueueStatus]) -> list[dict[str, Any]]:
        """``ddmq status``'s rows (time lag included), and this proxy's job counts for queues it holds."""
        counts = queue_counts(group)
        empty = {"in_flight": None, "ready": None, "retry_wait": None, "keys_at_cap": None, "held_in_redis": None}
        return [{**asdict(row), **(asdict(counts[row.topic, row.qid]) if (row.topic, row.qid) in counts else empty)}
                for row in queues]

    async def in_flight(self, request: web.Request) -> web.Response:
        group = self._group(request)
        topic = self._topic(group, request.query.get("topic"))
        offset = _offset(request)
        total, jobs = in_flight(group, topic, _limit(request, 100), offset)
        shown = fit([asdict(job) for job in jobs], self._list_bytes)
        return web.json_response(
            {"group": group.name, "total": total, "offset": offset, "jobs": shown,
             "next_offset": _next_offset(offset, len(shown), total)}
        )

    async def blocked_keys(self, request: web.Request) -> web.Response:
        group = self._group(request)
        topic = self._topic(group, request.query.get("topic"))
        offset = _offset(request)
        states = _key_states(request)
        total, keys = blocked_keys(group, topic, _limit(request, 20), offset, states=states)
        shown = fit([asdict(key) for key in keys], self._list_bytes)
        return web.json_response(
            {"group": group.name, "total": total, "offset": offset, "keys": shown,
             "next_offset": _next_offset(offset, len(shown), total)}
        )

    async def clients(self, request: web.Request) -> web.Response:
        """The clients pulling the group from this proxy, most recent pull first."""
        group = self._group(request)
        found = self._service.clients.clients(group.name)
        shown = fit([asdict(client) for client in found[:_limit(request, 100)]], self._list_bytes)
        return web.json_response({"group": group.name, "total": len(found), "clients": shown})

    # dead letters ----------------------------------------------------------------------------

    def _letters(self, request: web.Request) -> DeadLetters:
        group = self._group(request)
        topic = self._topic(group, request.match_info["topic"])
        if self._service.redis is None:
            raise UnavailableError("the proxy is not started")
        assert topic is not None
        # Redis reads are bounded below the answer's cap (JSON adds a third for base64, more for text).
        return DeadLetters(self._service.redis, group.name, topic, max_bytes=self._list_bytes // 3)

    async def dead_letters(self, request: web.Request) -> web.Response:
        letters = self._letters(request)
        after = request.query.get("after")
        page = await letters.read(after, _limit(request, 100), self._value_cut)
        entries = [dead_letter_json(letter) for letter in page.entries]
        shown = fit(entries, self._list_bytes)
        return web.json_response(
            {
                "group": letters.group,
                "topic": letters.topic,
                "total": await letters.count(),
                "entries": shown,
                "next_after": shown[-1]["id"] if shown else None,
                "more": page.more or len(shown) < len(entries),
            }
        )

    async def dead_letter(self, request: web.Request) -> web.Response:
        """One dead letter with as much of its value as the answer's cap allows (all of it below that)."""
        if request.match_info["id"] in ("replay", "purge"):  # POST routes that this route matches for a GET
            raise web.HTTPMethodNotAllowed(request.method, ["POST"])
        letters = self._letters(request)
        entry_id = check_id(request.match_info["id"])
        letter = await letters.get(entry_id, self._list_bytes * 3 // 4)  # base64 takes 4 bytes per 3
        if letter is None:
            raise UnknownEntryError(f"dead letter {entry_id} of {letters.group}/{letters.topic} is not in the stream")
        answer = dead_letter_json(letter)
        if json_size(answer) > self._max_answer:
            answer["value_text"] = None  # the text doubles the value: value_base64 alone fits
        return web.json_response(answer)

    async def replay(self, request: web.Request) -> web.Response:
        """Replay a selection (``ids``, ``all`` or one ``key``), lifting sequenced keys' marks first
        (:mod:`ddmq.proxy.servers.http.letters`); ``dry_run`` says what it would touch."""
        letters = self._letters(request)
        body = parse(SelectionIn, await self._read_body(request))
        consumer = self._consumer(request)
        if body.key is not None and (body.ids is not None or body.all):
            raise BadRequestError('give one of "ids": [...], "all": true or "key": K')
        ids = None if body.key is not None else _chosen(body)
        async with self._letter_lock(letters):
            plan = await plan_replay(letters, consumer, ids, body.key)
            check_pace(plan, body.rate)
            if body.dry_run:
                return web.json_response(replay_answer(0, plan, [], dry_run=True))
            answer = await run_replay(plan, letters, consumer, self._leases(), body.by or "replay", body.rate)
        log.info("replayed %d dead letters of %s/%s%s (%d keys resumed first; %d keys refused)", answer["replayed"],
                 letters.group, letters.topic, f" of key {body.key!r}" if body.key is not None else "",
                 answer["lifted"], answer["refused_keys"])
        selection = {"key": body.key} if body.key is not None else {"all": True} if body.all else {"ids": body.ids}
        await record(self._service, request, "replay", letters.group, letters.topic,
                     {**selection, "rate": body.rate, "replayed": answer["replayed"],
                      "refused_keys": answer["refused_keys"]}, body.by)
        return web.json_response(answer)

    # keys --------------------------------------------------------------------------------------

    def _consumer(self, request: web.Request) -> TopicConsumer:
        group = self._group(request)
        topic = self._topic(group, request.match_info["topic"])
        assert topic is not None
        return group.consumers[topic]

    def _leases(self) -> LeaseStore:
        leases = self._service.registry.leases
        if leases is None:
            raise UnavailableError("the proxy is not started")
        return leases

    async def keys(self, request: web.Request) -> web.Response:
        """Keys of a (group, topic) over every proxy, stuck ones first (``state``, ``key`` filter)."""
        consumer = self._consumer(request)
        key = request.query.get("key")
        if key is not None and len(key) > _KEY.high:
            raise BadRequestError(f"key: at most {_KEY.high} characters, got {len(key)}")
        answer = await list_keys(consumer, self._leases(), _key_states(request), key, _offset(request))
        shown = fit(answer["keys"], self._list_bytes)
        if len(shown) < len(answer["keys"]):
            answer["next_offset"] = _offset(request) + len(shown)
        answer["keys"] = shown
        return web.json_response(answer)

    async def explain_key(self, request: web.Request) -> web.Response:
        """Why one key (``key``, on queue ``qid`` when given) is where it is, and what comes next."""
        consumer = self._consumer(request)
        key = request.query.get("key") or ""
        if not 0 < len(key) <= _KEY.high:
            raise BadRequestError(f"key: 1 to {_KEY.high} characters, got {len(key)}")
        qid = _queue_of(consumer, query_int(request, "qid", 0, MAX_QID))
        holder = self._service.clients.holder
        answer = await explain_key(self._group(request), consumer, self._leases(), key, qid, holder)
        return web.json_response({**answer, "queues": fit(answer["queues"], self._list_bytes)})

    async def key_action(self, request: web.Request) -> web.Response:
        consumer = self._consumer(request)
        body = parse(KeyActionIn, await self._read_body(request))
        _queue_of(consumer, body.qid)
        action = request.match_info["action"]
        answer = await key_action(consumer, self._leases(), action, body.key, body.qid, body.by or "admin api")
        log.info("%s of key %r of %s/%s by %s: %s", action, body.key, consumer.group, consumer.topic,
                 body.by or "admin api", answer["applied"])
        await record(self._service, request, f"key {action}", consumer.group, consumer.topic,
                     {"key": body.key, "qid": body.qid, "applied": len(answer["applied"])}, body.by)
        shown = fit(answer["applied"], self._list_bytes)
        return web.json_response({**answer, "applied": shown})

    def _letter_lock(self, letters: DeadLetters) -> asyncio.Lock:
        return self._letter_locks.setdefault((letters.group, letters.topic), asyncio.Lock())

    async def purge(self, request: web.Request) -> web.Response:
        letters = self._letters(request)
        body = parse(SelectionIn, await self._read_body(request))
        if body.key is not None or body.rate is not None:
            raise BadRequestError('"key" and "rate" are for a replay only')
        selection = _chosen(body)
        async with self._letter_lock(letters):
            if body.dry_run:
                return web.json_response(await plan_purge(letters, selection))
            purged = await letters.purge(selection)
        log.info("purged %d dead letters of %s/%s", purged, letters.group, letters.topic)
        await record(self._service, request, "purge", letters.group, letters.topic,
                     {**({"all": True} if selection is None else {"ids": selection}), "purged": purged}, body.by)
        return web.json_response({"purged": purged})
