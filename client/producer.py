"""Produce messages into a topic's queues (Redis streams) with dense offsets.

>>> with Producer("redis://127.0.0.1:6379/0") as producer:
...     producer.send("rides", b'{"ride": 42}', key="rider-42")
SendResult(topic='rides', qid=0, offset=1)

Layout written here and read by the proxy (names from :mod:`ddmq.client.keys`):

- Topic metadata: hash ``keys.topic_meta(topic)`` with field ``queues`` (decimal), and the topic
  name in the set ``keys.topics()``. The first producer creates both (``HSETNX``) with its
  ``default_queues``; later producers use the stored number.
- Queue choice: an explicit ``qid``, else ``hashing.queue_for_key(key, queues)``, else round-robin
  per producer and topic.
- Offsets are dense per queue, starting at 1, and the entry id is exactly ``0-<offset>``. One Lua
  script call per queue and batch reads the last offset from ``keys.sequence(topic, qid)``, adds the
  entries, then stores the new last offset; the sequence only moves after the entries are written,
  so a failed call leaves no gap. Both keys share the queue's hash tag (single slot).
- Entry fields (all values bytes):

  ======  =====================================================================
  field   value
  ======  =====================================================================
  ``v``   the body, exactly as given (``str`` is encoded as UTF-8)
  ``k``   the key, UTF-8; ``""`` when there is none
  ``t``   the tag; ``""`` when there is none
  ``p``   properties as a compact JSON object of string to string; omitted when empty
  ``ts``  produce time, milliseconds since the epoch, decimal
  ======  =====================================================================

Redis failures surface as :class:`ProduceError`; wrong arguments as ``ValueError``/``TypeError``.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any, NamedTuple

from redis.commands.core import AsyncScript, Script
from redis.exceptions import NoScriptError

from ddmq.client import clitools, keys
from ddmq.client.connection import REDIS_ERRORS, AsyncRedis, SyncRedis, async_redis, eval_script, sync_redis
from ddmq.client.hashing import queue_for_key

__all__ = [
    "AsyncProducer",
    "OutgoingMessage",
    "ProduceError",
    "Producer",
    "SendResult",
    "TopicMismatchError",
    "add_cli",
    "ensure_topic",
    "repair_queue",
]

logger = logging.getLogger(__name__)

#: Messages per script call; bigger batches for one queue become several calls in the same round trip,
#: so one call never blocks Redis for long.
MAX_MESSAGES_PER_CALL = 1000

# KEYS[1] stream, KEYS[2] sequence. ARGV[1] message count, ARGV[2] MAXLEN ('' = no trimming), then per
# message: the number of field/value items that follow, and the items. Returns the first offset.
#
# Entries another writer added (``XADD *``, or an id past the sequence) would make every later XADD
# of ours fail. When the first XADD fails, or the sequence is missing, or no message is given (the
# proxy's repair call), ``repair()`` makes room: the last offset becomes the highest ``0-<n>`` id in
# the stream if that is above the sequence, and entries with time-based ids (all sorting after every
# ``0-<n>``) are renumbered to the next offsets, fields unchanged, so the proxy reads them in place
# and dead-letters them. The stream's last id is then set back to ``0-<last>``. At most 1000 such
# entries are renumbered per call (an error beyond: the script must stay short).
_PRODUCE_LUA = """
local n = tonumber(ARGV[1])
local raw = redis.call('GET', KEYS[2])
local last = tonumber(raw or '0')
local function repair()
  if redis.call('EXISTS', KEYS[1]) == 0 then return end
  local foreign = redis.call('XRANGE', KEYS[1], '1-0', '+', 'COUNT', 1000 + 1)
  if #foreign > 1000 then
    return 'ERR ' .. KEYS[1] .. ' holds more than 1000 entries with ids not of the form 0-<offset>'
  end
  for _, entry in ipairs(foreign) do redis.call('XDEL', KEYS[1], entry[1]) end
  local tail = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  if #tail > 0 then
    local top = tonumber(string.match(tail[1][1], '^0%-(%d+)$'))
    if top > last then last = top end
  end
  redis.call('XSETID', KEYS[1], string.format('0-%d', last))
  for _, entry in ipairs(foreign) do
    last = last + 1
    redis.call('XADD', KEYS[1], string.format('0-%d', last), unpack(entry[2]))
  end
end
if not raw or n == 0 then
  local err = repair()
  if err then return redis.error_reply(err) end
end
local head = {'XADD', KEYS[1]}
if ARGV[2] ~= '' then head = {'XADD', KEYS[1], 'MAXLEN', '~', ARGV[2]} end
local i = 3
for m = 1, n do
  local cmd = {unpack(head)}
  local id = #cmd + 1
  cmd[id] = string.format('0-%d', last + m)
  local count = tonumber(ARGV[i])
  for j = i + 1, i + count do cmd[#cmd + 1] = ARGV[j] end
  i = i + count + 1
  if m == 1 then
    local reply = redis.pcall(unpack(cmd))
    if type(reply) == 'table' and reply.err then
      local err = repair()
      if err then return redis.error_reply(err) end
      cmd[id] = string.format('0-%d', last + 1)
      redis.call(unpack(cmd))
    end
  else
    redis.call(unpack(cmd))
  end
end
redis.call('SET', KEYS[2], string.format('%d', last + n))
return last + 1
"""


class ProduceError(Exception):
    """Redis failed or holds data the producer cannot use. The message names the topic."""


class TopicMismatchError(ProduceError):
    """A topic exists with a different number of queues than declared.

    Changing the number of queues would move keys to other queues and break per-key order, so it is
    never done implicitly.
    """


class SendResult(NamedTuple):
    topic: str
    qid: int
    offset: int


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message for :meth:`Producer.send_batch`; a dict with the same keys works too.

    An empty key counts as no key (the entry cannot tell them apart), so the queue is round-robin.
    """

    value: bytes | str
    key: str | None = None
    tag: str | None = None
    properties: Mapping[str, str] | None = None
    qid: int | None = None


_MESSAGE_FIELDS = frozenset({"value", "key", "tag", "properties", "qid"})


def _as_message(item: OutgoingMessage | Mapping[str, Any]) -> OutgoingMessage:
    if isinstance(item, OutgoingMessage):
        return item
    if isinstance(item, Mapping):
        unknown = set(item) - _MESSAGE_FIELDS
        if unknown:
            raise ValueError(f"unknown message field(s) {sorted(unknown)}; known: {sorted(_MESSAGE_FIELDS)}")
        if "value" not in item:
            raise ValueError("a message needs a 'value'")
        return OutgoingMessage(**item)
    raise TypeError(f"expected OutgoingMessage or a mapping, not {type(item).__name__}")


def _entry_items(message: OutgoingMessage, now_ms: int) -> list[bytes]:
    """The entry's field/value items, flat, in the order the script passes them to XADD."""
    value = message.value
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif not isinstance(value, bytes):
        raise TypeError(f"value must be bytes or str, not {type(value).__name__}")
    for name, text in (("key", message.key), ("tag", message.tag)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{name} must be a str or None, not {type(text).__name__}")
    items = [
        b"v", value,
        b"k", (message.key or "").encode("utf-8"),
        b"t", (message.tag or "").encode("utf-8"),
    ]
    if message.properties:
        for pk, pv in message.properties.items():
            if not isinstance(pk, str) or not isinstance(pv, str):
                raise TypeError("properties must map str to str")
        props = json.dumps(dict(message.properties), separators=(",", ":"), ensure_ascii=False)
        items += [b"p", props.encode("utf-8")]
    items += [b"ts", str(now_ms).encode("ascii")]
    return items


class _Call(NamedTuple):
    """One script call: messages (by input position) for one queue."""

    qid: int
    positions: list[int]
    keys: tuple[str, str]
    args: list[bytes | int]


class _Planner:
    """Queue choice and script arguments; shared by the sync and async producers (no I/O here)."""

    def __init__(self, default_queues: int, maxlen: int | None) -> None:
        if default_queues < 1:
            raise ValueError("default_queues must be at least 1")
        if maxlen is not None and maxlen < 1:
            raise ValueError("maxlen must be at least 1 (or None for no trimming)")
        self.default_queues = default_queues
        self.maxlen = maxlen
        self.queues: dict[str, int] = {}
        self._next_rr: dict[str, int] = {}

    @staticmethod
    def check_qid(topic: str, qid: int | None, queues: int) -> None:
        if qid is not None and (isinstance(qid, bool) or not isinstance(qid, int) or not 0 <= qid < queues):
            raise ValueError(f"qid {qid!r} is out of range for topic {topic!r} with {queues} queues")

    def choose_qid(self, topic: str, message: OutgoingMessage, queues: int) -> int:
        if message.qid is not None:
            return message.qid
        if message.key:
            return queue_for_key(message.key, queues)
        # a random start, so many short-lived producers do not all begin at queue 0
        rr = self._next_rr.get(topic)
        if rr is None:
            rr = random.randrange(queues)
        self._next_rr[topic] = (rr + 1) % queues
        return rr % queues

    def plan(self, topic: str, messages: Sequence[OutgoingMessage], queues: int) -> list[_Call]:
        now_ms = time.time_ns() // 1_000_000
        by_queue: dict[int, list[tuple[int, list[bytes]]]] = {}
        # validate everything before choosing queues, so a bad message does not advance round-robin
        entries = [_entry_items(m, now_ms) for m in messages]
        for message in messages:
            self.check_qid(topic, message.qid, queues)
        for position, (message, items) in enumerate(zip(messages, entries, strict=True)):
            qid = self.choose_qid(topic, message, queues)
            by_queue.setdefault(qid, []).append((position, items))
        calls = []
        maxlen: bytes | int = b"" if self.maxlen is None else self.maxlen
        for qid, queued in by_queue.items():
            for start in range(0, len(queued), MAX_MESSAGES_PER_CALL):
                chunk = queued[start:start + MAX_MESSAGES_PER_CALL]
                args: list[bytes | int] = [len(chunk), maxlen]
                for _, items in chunk:
                    args.append(len(items))
                    args.extend(items)
                queue_keys = (keys.stream(topic, qid), keys.sequence(topic, qid))
                calls.append(_Call(qid, [p for p, _ in chunk], queue_keys, args))
        return calls

    @staticmethod
    def results(topic: str, total: int, calls: Sequence[_Call], firsts: Sequence[int]) -> list[SendResult]:
        results: list[SendResult | None] = [None] * total
        for call, first in zip(calls, firsts, strict=True):
            for i, position in enumerate(call.positions):
                results[position] = SendResult(topic, call.qid, first + i)
        return [r for r in results if r is not None]


def _parse_queues(topic: str, raw: object) -> int:
    try:
        queues = int(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError:
        queues = 0
    if queues < 1:
        meta = keys.topic_meta(topic)
        raise ProduceError(f"topic {topic!r}: {meta!r} holds a bad queues value {raw!r}")
    return queues


def _check_declared(topic: str, stored: int, declared: int) -> int:
    if stored != declared:
        raise TopicMismatchError(
            f"topic {topic!r} has {stored} queues in Redis but {declared} are declared; changing the "
            "number of queues would move keys between queues and break per-key order. Declare "
            f"queues: {stored}, or use a new topic."
        )
    return stored


def _check_queue_count(queues: int) -> None:
    if isinstance(queues, bool) or not isinstance(queues, int) or queues < 1:
        raise ValueError(f"a topic has at least one queue, not {queues!r}")


@contextmanager
def _redis_errors(topic: str) -> Iterator[None]:
    """Map redis-py errors into :class:`ProduceError` at the edge."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise ProduceError(f"producing to topic {topic!r} failed: {exc}") from exc


def _pipeline_outcome(
    topic: str, calls: Sequence[_Call], replies: Sequence[object]
) -> tuple[dict[int, int], list[int]]:
    """Split replies into first offsets (by call index) and the calls to repeat after NOSCRIPT."""
    firsts: dict[int, int] = {}
    retry: list[int] = []
    failed: list[str] = []
    cause: BaseException | None = None
    for index, reply in enumerate(replies):
        if isinstance(reply, NoScriptError):
            retry.append(index)  # the script did not run at all, so repeating is safe
        elif isinstance(reply, int):
            firsts[index] = reply
        else:
            failed.append(f"queue {calls[index].qid}: {reply}")
            if cause is None and isinstance(reply, BaseException):
                cause = reply
    if failed:
        written = sorted({calls[i].qid for i in firsts})
        raise ProduceError(
            f"producing to topic {topic!r} failed for {'; '.join(failed)}"
            + (f" (queues {written} were written)" if written else "")
        ) from cause
    return firsts, retry


class Producer:
    """Synchronous producer on a redis-py client.

    ``url_or_client`` is a URL (the producer owns and closes that client; ``?cluster=true`` for a Redis
    Cluster, see :mod:`ddmq.client.connection`) or an existing ``redis.Redis`` or
    ``redis.cluster.RedisCluster`` (left open by :meth:`close`). ``default_queues`` is used only when the
    topic does not exist yet; ``maxlen`` trims each queue approximately (``MAXLEN ~``) to that many entries.
    """

    def __init__(
        self, url_or_client: str | SyncRedis, /, *, default_queues: int = 8, maxlen: int | None = None
    ) -> None:
        self._planner = _Planner(default_queues, maxlen)
        if isinstance(url_or_client, str):
            try:
                self._redis: SyncRedis = sync_redis(url_or_client)
            except REDIS_ERRORS as exc:  # a cluster client reads the slot map at once
                raise ProduceError(f"cannot reach the Redis Cluster at {url_or_client}: {exc}") from exc
            self._owned = True
        else:
            self._redis = url_or_client
            self._owned = False
        self._script: Script = self._redis.register_script(_PRODUCE_LUA)

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._owned:
            self._redis.close()

    def queue_count(self, topic: str) -> int:
        """The topic's number of queues; creates the topic with ``default_queues`` if it is missing."""
        keys.check_name("topic", topic)
        cached = self._planner.queues.get(topic)
        if cached is None:
            cached = self._topic_queues(topic, self._planner.default_queues)
            self._planner.queues[topic] = cached
        return cached

    def ensure_topic(self, topic: str, queues: int) -> int:
        """Create the topic with ``queues`` queues, or check that it has that many.

        Raises :class:`TopicMismatchError` when it exists with a different number.
        """
        keys.check_name("topic", topic)
        _check_queue_count(queues)
        stored = _check_declared(topic, self._topic_queues(topic, queues), queues)
        self._planner.queues[topic] = stored
        return stored

    def _topic_queues(self, topic: str, queues: int) -> int:
        with _redis_errors(topic):
            pipe = self._redis.pipeline(transaction=False)
            pipe.hsetnx(keys.topic_meta(topic), "queues", queues)
            pipe.hget(keys.topic_meta(topic), "queues")
            pipe.sadd(keys.topics(), topic)
            _, raw, _ = pipe.execute()
        return _parse_queues(topic, raw)

    def send(
        self,
        topic: str,
        value: bytes | str,
        key: str | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        qid: int | None = None,
    ) -> SendResult:
        """Send one message; returns where it landed."""
        return self.send_batch(topic, [OutgoingMessage(value, key, tag, properties, qid)])[0]

    def send_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> list[SendResult]:
        """Send messages in one round trip (one script call per queue); results keep the input order."""
        batch = [_as_message(m) for m in messages]
        if not batch:
            return []
        calls = self._planner.plan(topic, batch, self.queue_count(topic))
        firsts: dict[int, int] = {}
        pending = list(range(len(calls)))
        with _redis_errors(topic):
            for command, script in (("EVALSHA", self._script.sha), ("EVAL", self._script.script)):
                pipe = self._redis.pipeline(transaction=False)
                for index in pending:
                    # the raw command: redis-py's cluster pipelines refuse evalsha(), yet route this one by its keys
                    pipe.execute_command(command, script, 2, *calls[index].keys, *calls[index].args)
                replies = pipe.execute(raise_on_error=False)
                done, retry = _pipeline_outcome(topic, [calls[i] for i in pending], replies)
                firsts.update({pending[i]: first for i, first in done.items()})
                pending = [pending[i] for i in retry]
                if not pending:
                    break
                # A restarted server, or a replica just promoted, has an empty script cache: EVAL sends the
                # script itself (and caches it there); SCRIPT LOAD would only reach the masters redis-py knew.
                logger.debug("produce script not cached on the server; sending it")
            else:
                raise ProduceError(f"producing to topic {topic!r} failed: the script could not be loaded")
        return _Planner.results(topic, len(batch), calls, [firsts[i] for i in range(len(calls))])


class AsyncProducer:
    """The asyncio twin of :class:`Producer`, on ``redis.asyncio``; same arguments and results.

    >>> async with AsyncProducer("redis://127.0.0.1:6379/0") as producer:
    ...     await producer.send("rides", b"hello", key="rider-42")
    """

    def __init__(
        self,
        url_or_client: str | AsyncRedis,
        /,
        *,
        default_queues: int = 8,
        maxlen: int | None = None,
    ) -> None:
        self._planner = _Planner(default_queues, maxlen)
        if isinstance(url_or_client, str):
            self._redis: AsyncRedis = async_redis(url_or_client)
            self._owned = True
        else:
            self._redis = url_or_client
            self._owned = False
        self._script: AsyncScript = self._redis.register_script(_PRODUCE_LUA)

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owned:
            await self._redis.aclose()

    async def queue_count(self, topic: str) -> int:
        """The topic's number of queues; creates the topic with ``default_queues`` if it is missing."""
        keys.check_name("topic", topic)
        cached = self._planner.queues.get(topic)
        if cached is None:
            cached = await _topic_queues(self._redis, topic, self._planner.default_queues)
            self._planner.queues[topic] = cached
        return cached

    async def ensure_topic(self, topic: str, queues: int) -> int:
        """See :func:`ensure_topic`."""
        stored = await ensure_topic(self._redis, topic, queues)
        self._planner.queues[topic] = stored
        return stored

    async def send(
        self,
        topic: str,
        value: bytes | str,
        key: str | None = None,
        tag: str | None = None,
        properties: Mapping[str, str] | None = None,
        qid: int | None = None,
    ) -> SendResult:
        return (await self.send_batch(topic, [OutgoingMessage(value, key, tag, properties, qid)]))[0]

    async def send_batch(
        self, topic: str, messages: Iterable[OutgoingMessage | Mapping[str, Any]]
    ) -> list[SendResult]:
        batch = [_as_message(m) for m in messages]
        if not batch:
            return []
        calls = self._planner.plan(topic, batch, await self.queue_count(topic))
        firsts: dict[int, int] = {}
        pending = list(range(len(calls)))
        with _redis_errors(topic):
            for command, script in (("EVALSHA", self._script.sha), ("EVAL", self._script.script)):
                pipe = self._redis.pipeline(transaction=False)
                for index in pending:
                    # the raw command: redis-py's cluster pipelines refuse evalsha(), yet route this one by its keys
                    pipe.execute_command(command, script, 2, *calls[index].keys, *calls[index].args)
                replies = await pipe.execute(raise_on_error=False)
                done, retry = _pipeline_outcome(topic, [calls[i] for i in pending], replies)
                firsts.update({pending[i]: first for i, first in done.items()})
                pending = [pending[i] for i in retry]
                if not pending:
                    break
                # A restarted server, or a replica just promoted, has an empty script cache: EVAL sends the
                # script itself (and caches it there); SCRIPT LOAD would only reach the masters redis-py knew.
                logger.debug("produce script not cached on the server; sending it")
            else:
                raise ProduceError(f"producing to topic {topic!r} failed: the script could not be loaded")
        return _Planner.results(topic, len(batch), calls, [firsts[i] for i in range(len(calls))])


async def _topic_queues(client: AsyncRedis, topic: str, queues: int) -> int:
    with _redis_errors(topic):
        pipe = client.pipeline(transaction=False)
        pipe.hsetnx(keys.topic_meta(topic), "queues", queues)
        pipe.hget(keys.topic_meta(topic), "queues")
        pipe.sadd(keys.topics(), topic)
        _, raw, _ = await pipe.execute()
    return _parse_queues(topic, raw)


async def ensure_topic(client: AsyncRedis, topic: str, queues: int) -> int:
    """Create ``topic`` with ``queues`` queues if it is missing; otherwise check the stored number.

    Returns the number of queues. Raises :class:`TopicMismatchError` when the topic exists with a
    different number, :class:`ProduceError` when Redis fails. The proxy calls this at start-up for
    every topic its config declares.
    """
    keys.check_name("topic", topic)
    _check_queue_count(queues)
    return _check_declared(topic, await _topic_queues(client, topic, queues), queues)


async def repair_queue(client: AsyncRedis, topic: str, qid: int) -> int:
    """Make a queue appendable again after another writer added entries the producer would not have
    (see the produce script): renumber time-based ids after the last offset, raise the sequence to the
    highest ``0-<n>`` id. Returns the next offset to be produced; ProduceError when Redis fails."""
    stream, sequence = keys.stream(topic, qid), keys.sequence(topic, qid)
    with _redis_errors(topic):
        return int(await eval_script(client, _PRODUCE_LUA, [stream, sequence], [0, b""]))


# --- the `ddmq produce` command --------------------------------------------------------------------


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``ddmq produce``: JSON lines from stdin into a topic."""
    parser = sub.add_parser(
        "produce",
        help="send JSON lines from stdin to a topic",
        description=(
            'Reads one JSON object per line from stdin: {"value": ..., "key": ..., "tag": ..., '
            '"properties": {...}, "qid": ...}; only "value" is required. A string value is sent as is, '
            "any other JSON value as its compact JSON text. Bad lines are reported and skipped."
        ),
    )
    clitools.env_option(
        parser, "--redis", clitools.ENV_REDIS, "redis:// URL of the broker (add ?cluster=true for a Redis Cluster)"
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--queues", type=int, default=None,
        help="number of queues: creates the topic with it, or checks it (default: 8 for a new topic)",
    )
    parser.add_argument("--batch", type=int, default=100, help="messages per round trip (default 100)")
    parser.set_defaults(func=_produce_command)


def _produce_command(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise clitools.CliError("--batch must be at least 1", clitools.USAGE_ERROR)
    try:
        with Producer(args.redis) as producer:
            if args.queues is not None:
                producer.ensure_topic(args.topic, args.queues)
            return produce_lines(producer, args.topic, sys.stdin.buffer, batch=args.batch, err=sys.stderr)
    except (ProduceError, ValueError) as exc:
        raise clitools.CliError(str(exc)) from exc


def _line_message(raw: bytes, queues: int) -> OutgoingMessage:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    unknown = set(data) - _MESSAGE_FIELDS
    if unknown:
        raise ValueError(f"unknown field(s) {sorted(unknown)}")
    if "value" not in data:
        raise ValueError("missing 'value'")
    value = data["value"]
    if not isinstance(value, str):
        value = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    key, tag, props, qid = (data.get(name) for name in ("key", "tag", "properties", "qid"))
    for name, text in (("key", key), ("tag", tag)):
        if text is not None and not isinstance(text, str):
            raise ValueError(f"'{name}' must be a string")
    if props is not None and not (
        isinstance(props, dict) and all(isinstance(v, str) for v in props.values())
    ):
        raise ValueError("'properties' must be an object of strings")
    if qid is not None and (isinstance(qid, bool) or not isinstance(qid, int) or not 0 <= qid < queues):
        raise ValueError(f"'qid' must be an integer in 0..{queues - 1}")
    return OutgoingMessage(value, key, tag, props, qid)


def produce_lines(
    producer: Producer, topic: str, lines: Iterable[bytes], *, batch: int = 100, err: IO[str]
) -> int:
    """Send JSON lines in batches; report bad lines (by number) on ``err`` and skip them.

    Returns the exit status: 0 when every line was sent, 1 when some were bad. Raises
    :class:`ProduceError` when Redis fails (what was sent before stays sent).
    """
    queues = producer.queue_count(topic)
    pending: list[OutgoingMessage] = []
    sent = bad = 0
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            pending.append(_line_message(raw, queues))
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            bad += 1
            err.write(f"line {lineno}: {exc}; skipped\n")
            continue
        if len(pending) >= batch:
            sent += len(producer.send_batch(topic, pending))
            pending.clear()
    if pending:
        sent += len(producer.send_batch(topic, pending))
    err.write(f"sent {sent} message(s) to {topic!r}, {bad} bad line(s)\n")
    return 0 if bad == 0 else 1
