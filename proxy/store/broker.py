"""Redis Streams access for the proxy: reading queues, offsets, dead letters, topic metadata.

Every Redis error leaves this module as :class:`BrokerError`, so the engine deals with one retriable
error type: the proxy's client raises it (:mod:`ddmq.proxy.store.client`), and :func:`map_redis_errors`
says what the broker was doing (on a reader's own connection too, which is no client's). Entries are
read (and dead letters written) in the producer's format, :mod:`ddmq.protocol.redis.stream_entry`.

Queue reads are the proxy's busiest Redis call. redis-py's XREAD callback turns every entry's field
list into a dict before we look at it; :class:`Broker` wraps that callback on its client so that its
own reads (and only those, marked with an option) get the server's reply as it is, and
:func:`decode_fields` builds each message straight from the flat field list.

A queue whose blocking read came back empty waits in the broker's :class:`~ddmq.proxy.store.idle_watch.IdleWatcher`
(one blocking read over all idle queues, on one server) before it reads again.

On a Redis Cluster (:mod:`ddmq.protocol.redis.connection`) every command here names keys of one slot, except
the reads over many queues and the multi-key reads of offsets: those are split per slot
(:meth:`Broker.read_many`, :meth:`Broker.get_many`) and sent to the masters concurrently.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.typing import EncodableT, FieldT

from ddmq.protocol.redis import keys, stream_entry
from ddmq.protocol.redis.connection import REDIS_FAILURES, AsyncRedis, eval_script
from ddmq.protocol.redis.queues import ProduceError, repair_queue
from ddmq.protocol.redis.scripts import CHECK_STREAM_LUA, RAISE_SEQUENCE_LUA
from ddmq.protocol.redis.stream_entry import KEY, PRODUCE_TIME, PROPERTIES, TAG, VALUE
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.core.types import StoredMessage
from ddmq.proxy.store.idle_watch import IdleWatcher
from ddmq.proxy.store.read_link import ReadLink, ReadLinks

# Final: in the compiled build these are C statics; a plain global (or a name imported from a module
# that is not compiled) is a dict lookup on every use, and decode_fields runs once per message read.
_EMPTY_PROPERTIES: Final[dict[str, str]] = {}
_VALUE: Final = VALUE
_KEY: Final = KEY
_TAG: Final = TAG
_PROPERTIES: Final = PROPERTIES
_PRODUCE_TIME: Final = PRODUCE_TIME
#: ``StoredMessage(*fields)`` without the generated ``__new__``'s Python frame (once per message read).
_new_message: Final[Callable[[tuple[int, bytes, str, str, dict[str, str], int]], StoredMessage]] = functools.partial(
    tuple.__new__, StoredMessage
)
#: A command option that makes the XREAD callback hand back the unparsed reply.
_RAW_REPLY: Final = "ddmq_raw_reply"
#: Queues opened at once by the whole proxy (:attr:`Broker.opening`).
OPENING_AT_ONCE = 32


@contextmanager
def map_redis_errors(what: str) -> Iterator[None]:
    """A Redis failure inside, redis-py's own (a connection used directly, a client not built by
    :func:`~ddmq.proxy.store.client.broker_client`) or that client's BrokerError, leaves as one
    BrokerError that says what was being done. For the store's modules only: everything above calls
    the client, which maps its failures itself."""
    try:
        yield
    except REDIS_FAILURES as exc:
        raise _failed_while(what, exc) from exc
    except BrokerError as exc:
        cause = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
        raise _failed_while(what, cause) from cause


def _failed_while(what: str, cause: Exception) -> BrokerError:
    error = BrokerError(f"redis failed while {what}: {cause}")
    error.__cause__ = cause  # set here too: compiled, ``raise ... from`` in a generator leaves it unset
    return error


class ForeignEntry(Exception):
    """The next entry of a queue was not written by the ddmq producer (a plain ``XADD``): its id is
    not ``0-<offset>`` (``offset`` is None), or its fields are not the producer's."""

    def __init__(self, stream: str, entry_id: bytes, fields: dict[bytes, bytes], reason: str) -> None:
        super().__init__(f"{stream}: entry {entry_id!r} was not written by the ddmq producer ({reason})")
        self.entry_id = entry_id
        self.fields = fields
        try:
            self.offset: int | None = keys.offset_of(entry_id)
        except ValueError:
            self.offset = None

    def as_message(self) -> StoredMessage:
        """The entry as a message to dead-letter: its ``v`` as the body when it has one, else its
        fields as a JSON object, so nothing of it is lost."""
        fields = self.fields
        value = fields.get(stream_entry.VALUE)
        if value is None:
            value = json.dumps({k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in fields.items()},
                               ensure_ascii=False).encode()
        return StoredMessage(self.offset or 0, value, "", "", _EMPTY_PROPERTIES, 0)


def decode_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> StoredMessage:
    value, ts = fields.get(stream_entry.VALUE), fields.get(stream_entry.PRODUCE_TIME)
    if value is None or ts is None:
        raise ValueError("the entry lacks the producer's v and ts fields")
    properties = stream_entry.decode_properties(fields.get(stream_entry.PROPERTIES))
    return StoredMessage(
        offset=keys.offset_of(entry_id),
        value=value,
        key=fields.get(stream_entry.KEY, b"").decode("utf-8", "replace"),
        tag=fields.get(stream_entry.TAG, b"").decode("utf-8", "replace"),
        properties=properties,
        produce_ms=int(ts),
    )


def _field_dict(fields: Any) -> dict[bytes, bytes]:
    if isinstance(fields, dict):
        return fields
    if isinstance(fields, list):
        return dict(zip(fields[::2], fields[1::2], strict=False))
    return {}


def decode_fields(entry_id: bytes, fields: list[bytes] | None) -> StoredMessage:
    """One entry from XREAD's flat ``[name, value, ...]`` list; ValueError when it cannot be read."""
    if fields is None:
        raise ValueError("the entry has no fields")
    n = len(fields)
    if ((n == 8 or (n == 10 and fields[6] == _PROPERTIES)) and fields[0] == _VALUE and fields[2] == _KEY
            and fields[4] == _TAG and fields[n - 2] == _PRODUCE_TIME):
        # The producer's layout (``v k t [p] ts``): no dict needed. Properties (a trace context on every
        # message of a traced producer) are the one JSON parse left.
        if entry_id[:2] != b"0-":
            raise ValueError(f"stream entry {entry_id!r} was not written by the ddmq producer")
        ts = fields[n - 1]
        return _new_message(
            (
                int(entry_id[2:]),
                fields[1],
                fields[3].decode("utf-8", "replace"),
                fields[5].decode("utf-8", "replace"),
                _EMPTY_PROPERTIES if n == 8 else stream_entry.decode_properties(fields[7]),
                int(ts) if ts else 0,
            )
        )
    return decode_entry(entry_id, dict(zip(fields[::2], fields[1::2], strict=True)))


def read_mark(n: int, message: StoredMessage | None) -> list[str | int]:
    """The ``n, ts, sha`` arguments of :data:`~ddmq.protocol.redis.scripts.STREAM_INTACT_LUA` for a reader
    whose last read entry is ``message`` (None: nothing read yet, only the queue's end is checked against ``n``)."""
    if message is None:
        return [n, "0", ""]
    return [message.offset, message.produce_ms, hashlib.sha1(message.value).hexdigest()]


class ConnectionCounter:
    """Counts the connections redis-py opens (``redis_connect_func``). Every command after a Redis
    restart runs on a new connection, so a reader that sees the count change knows Redis may have
    restarted, and possibly lost its last writes, since it last looked."""

    def __init__(self) -> None:
        self.count = 0

    async def on_connect(self, connection: AbstractConnection) -> None:
        self.count += 1
        # Without the health check redis-py's own handshake skips: ``on_connect()`` pings before the first
        # handshake command, and a connection lost during that ping is made again inside it, handshake
        # and ping included, so a link that resets every new connection recursed until the stack ran out.
        handshake = getattr(connection, "on_connect_check_health", None)
        if handshake is None:  # an older redis-py, whose handshake has no health check
            await connection.on_connect()
        else:
            await handshake(check_health=False)


def _xread_callback(parse: Callable[..., Any]) -> Callable[..., Any]:
    def callback(response: Any, **options: Any) -> Any:
        if options.pop(_RAW_REPLY, False):
            return response
        return parse(response, **options)

    return callback


async def get_many(redis: AsyncRedis, names: list[str]) -> list[bytes | None]:
    """GET of many string keys: one MGET on a single server, one MGET per slot (pipelined per master)
    on a cluster, which refuses an MGET across slots."""
    if not names:
        return []
    if isinstance(redis, RedisCluster):
        return list(await redis.mget_nonatomic(names))
    return list(await redis.mget(names))


class Broker:
    """The proxy's view of Redis. ``redis`` must return bytes (``decode_responses=False``)."""

    def __init__(self, redis: AsyncRedis, connections: ConnectionCounter | None = None) -> None:
        self.redis = redis
        self.cluster = isinstance(redis, RedisCluster)
        #: Connections opened so far (0 forever when the client was made without the counter).
        self.connections = connections or ConnectionCounter()
        self._raw_reads = redis.get_connection_kwargs().get("protocol") in (None, 2, "2")
        #: Reads on a reader's own connection (:mod:`~ddmq.proxy.store.read_link`): one server, RESP2.
        self._linked_reads = self._raw_reads and not self.cluster
        self.links = ReadLinks(None if isinstance(redis, RedisCluster) else redis.connection_pool)
        if self._raw_reads:
            parse = redis.response_callbacks["XREAD"]
            redis.set_response_callback("XREAD", _xread_callback(parse))
        #: Watches idle queues with one blocking read; None on a cluster (one slot per queue: nothing to
        #: group), where a reader blocks on its own stream.
        self.idle: IdleWatcher | None = None if isinstance(redis, RedisCluster) else IdleWatcher(redis)
        #: Queues this proxy wrote a commit point on since the trimmer last took them (:meth:`take_commits`).
        self._committed_on: set[tuple[str, int]] = set()
        #: Held while a consumer reads its topic's metadata and while a queue is opened (its lease
        #: claimed, its offsets and parked keys loaded: up to three connections at once). The client's
        #: pool keeps every connection it ever opened, so 1,000 consumers starting all at once would
        #: leave 2,000-3,000 idle connections behind (about 20 MB of the proxy's memory with 8,000 queues);
        #: a few dozen at a time keep Redis as busy.
        self.opening = asyncio.Semaphore(OPENING_AT_ONCE)

    def note_commit(self, topic: str, qid: int) -> None:
        """A commit point of this proxy was written on the queue: the trimmer looks at it again at its
        next round (a commit may let it trim), whatever its pace."""
        self._committed_on.add((topic, qid))

    def take_commits(self) -> set[tuple[str, int]]:
        """The queues noted by :meth:`note_commit` since the last call (one caller: the trimmer)."""
        taken, self._committed_on = self._committed_on, set()
        return taken

    async def close(self) -> None:
        """Stop watching idle queues (after the readers stopped; before the client closes)."""
        if self.idle is not None:
            await self.idle.close()
        await self.links.close()

    def wait_for_entries(self, topic: str, qid: int, after: int) -> Awaitable[None]:
        """Wait, with the other idle queues, until the queue holds an entry after offset ``after``;
        at once on a cluster. BrokerError when Redis failed meanwhile.

        Returns the watcher's wait itself rather than awaiting it in a coroutine of its own: an idle
        queue's reader waits in it for long, and each frame of that chain is kept per queue."""
        if self.idle is None:
            return asyncio.sleep(0)
        return self.idle.wait(keys.stream(topic, qid), after)

    async def topic_queues(self, topic: str) -> int | None:
        with map_redis_errors(f"reading metadata of topic {topic}"):
            raw = await self.redis.hget(keys.topic_meta(topic), "queues")
        return int(raw) if raw is not None else None

    async def read(
        self, topic: str, qid: int, after: int, count: int, block_ms: int | None, link: ReadLink | None = None
    ) -> list[StoredMessage]:
        """Up to ``count`` messages with offset > ``after``, waiting up to ``block_ms`` for the first
        (None: not at all); on ``link``'s connection when given (and on one server)."""
        stream = keys.stream(topic, qid)
        with map_redis_errors(f"reading {topic}#{qid}"):
            if self._raw_reads:
                block = () if block_ms is None else ("BLOCK", block_ms)
                args = ("COUNT", count, *block, "STREAMS", stream, keys.stream_id_after(after))
                if link is not None and self._linked_reads:
                    reply: Any = await self.links.xread(link, args)
                else:
                    reply = await self.redis.execute_command("XREAD", *args, **{_RAW_REPLY: True})
            else:
                reply = await self.redis.xread({stream: keys.stream_id_after(after)}, count=count, block=block_ms)
        if not reply:
            return []
        entries = reply[0][1]
        decode = decode_fields if self._raw_reads else decode_entry
        messages: list[StoredMessage] = []
        for entry_id, fields in entries:
            try:
                messages.append(decode(entry_id, fields))
            except (ValueError, AttributeError, TypeError) as exc:
                if messages:
                    break  # deliver what precedes it; the next read stops right here
                raise ForeignEntry(stream, entry_id, _field_dict(fields), str(exc)) from exc
        return messages

    async def stream_intact(self, topic: str, qid: int, n: int, message: StoredMessage | None) -> bool:
        """False when the queue no longer holds what was read up to offset ``n`` (``message``: the entry
        read there, if any): Redis rolled back. See :data:`~ddmq.protocol.redis.scripts.STREAM_INTACT_LUA`."""
        with map_redis_errors(f"checking {topic}#{qid} against what was read"):
            keys_ = [keys.stream(topic, qid), keys.sequence(topic, qid)]
            return bool(await eval_script(self.redis, CHECK_STREAM_LUA, keys_, read_mark(n, message)))

    async def raise_sequence(self, topic: str, qid: int, offset: int) -> int:
        """Make producers continue after ``offset`` at least; returns the queue's last offset."""
        with map_redis_errors(f"raising the sequence of {topic}#{qid}"):
            return int(await eval_script(self.redis, RAISE_SEQUENCE_LUA, [keys.sequence(topic, qid)], [offset]))

    async def record_rollback(
        self, group: str, topic: str, qid: int, owner: str, read_upto: int, stream_end: int
    ) -> None:
        """Note a detected rollback where ``ddmq status`` and the admin API show it."""
        key = keys.rollbacks(group, topic, qid)
        with map_redis_errors(f"recording a rollback of {topic}#{qid}"):
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.hincrby(key, "count", 1)
                pipe.hset(key, mapping={"at_ms": int(time.time() * 1000), "read_upto": read_upto,
                                        "stream_end": stream_end, "owner": owner})
                await pipe.execute()

    async def repair_queue(self, topic: str, qid: int) -> int:
        """Let producers append again after foreign entries (see :func:`ddmq.protocol.redis.queues.repair_queue`);
        returns the next offset to be produced."""
        try:
            return await repair_queue(self.redis, topic, qid)
        except ProduceError as exc:
            raise BrokerError(str(exc)) from exc

    async def read_many(
        self, streams: dict[str, str], count: int, block_ms: int | None
    ) -> dict[str, tuple[list[StoredMessage], int]]:
        """Up to ``count`` entries per stream after each given id (one slot per stream): per stream, the
        messages and the offset of the last entry looked at. Entries not written by the producer are
        left out (the ordered path dead-letters them); one with a time-based id ends the page, as it has
        no offset until the next produce renumbers it.

        One XREAD on a single server. On a cluster, where one XREAD may only name keys of one slot,
        one XREAD per stream: pipelined per master when not blocking; when blocking, all at once and
        answered as soon as one of them has messages (the others are cancelled).
        """
        with map_redis_errors(f"reading {len(streams)} queue(s)"):
            if not self.cluster or len(streams) == 1:
                reply: Any = await self.redis.xread(streams, count=count, block=block_ms)
            elif block_ms is None:
                pipe = self.redis.pipeline(transaction=False)
                for stream, after in streams.items():
                    pipe.xread({stream: after}, count=count)
                reply = [page for answer in await pipe.execute() for page in answer or ()]
            else:
                reply = await self._first_answer(streams, count, block_ms)
        pages: dict[str, tuple[list[StoredMessage], int]] = {}
        for raw_stream, entries in reply or ():
            stream = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
            messages: list[StoredMessage] = []
            seen = 0
            for entry_id, fields in entries:
                try:
                    seen = keys.offset_of(entry_id)
                except ValueError:
                    break
                try:
                    messages.append(decode_entry(entry_id, fields))
                except (ValueError, AttributeError, TypeError):
                    continue
            pages[stream] = (messages, seen)
        return pages

    async def _first_answer(self, streams: dict[str, str], count: int, block_ms: int) -> list[Any]:
        reads = {
            asyncio.ensure_future(self.redis.xread({stream: after}, count=count, block=block_ms))
            for stream, after in streams.items()
        }
        pages: list[Any] = []
        try:
            while reads and not pages:
                done, reads = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
                for read in done:
                    pages.extend(read.result() or ())
        finally:
            for read in reads:
                read.cancel()
            if reads:
                await asyncio.wait(reads)
        return pages

    async def get_many(self, names: list[str]) -> list[bytes | None]:
        """See :func:`get_many`."""
        return await get_many(self.redis, names)

    async def committed_offset(self, group: str, topic: str, qid: int) -> int | None:
        with map_redis_errors(f"reading the offset of {group}/{topic}#{qid}"):
            raw = await self.redis.get(keys.committed(group, topic, qid))
        return int(raw) if raw is not None else None

    async def finished_offsets(self, group: str, topic: str, qid: int) -> str:
        """The ranges of offsets a previous owner finished past the committed offset."""
        with map_redis_errors(f"reading finished offsets of {group}/{topic}#{qid}"):
            raw = await self.redis.get(keys.finished(group, topic, qid))
        return raw.decode() if raw else ""

    async def next_produce_offset(self, topic: str, qid: int) -> int:
        with map_redis_errors(f"reading the produce offset of {topic}#{qid}"):
            raw = await self.redis.get(keys.sequence(topic, qid))
        return int(raw) + 1 if raw is not None else 1

    async def first_offset(self, topic: str, qid: int) -> int:
        """The offset of the queue's first entry; when it is empty, the next one to be produced (1 for a
        queue that never had one, or whose first entry was not written by the producer)."""
        # The sequence first (one slot, so one pipeline in order on a cluster too): an entry produced
        # after it was read has a higher offset, so an empty stream then means nothing up to that
        # sequence is left to read.
        with map_redis_errors(f"reading the first offset of {topic}#{qid}"):
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.get(keys.sequence(topic, qid))
                pipe.xrange(keys.stream(topic, qid), "-", "+", count=1)
                sequence, entries = await pipe.execute()
        if not entries:
            return int(sequence) + 1 if sequence is not None else 1
        try:
            return keys.offset_of(entries[0][0])
        except ValueError:
            return 1

    async def produce_offsets(self, topic: str, queues: int) -> list[int]:
        """Next offset to be produced, per qid."""
        with map_redis_errors(f"reading produce offsets of {topic}"):
            raws = await self.get_many([keys.sequence(topic, qid) for qid in range(queues)])
        return [int(raw) + 1 if raw is not None else 1 for raw in raws]

    async def init_offset(self, group: str, topic: str, qid: int, offset: int) -> int:
        """Store ``offset`` as the group's starting point unless one exists; returns the one in force."""
        key = keys.committed(group, topic, qid)
        with map_redis_errors(f"initialising the offset of {group}/{topic}#{qid}"):
            await self.redis.set(key, offset, nx=True)
            raw = await self.redis.get(key)
        return int(raw) if raw is not None else offset

    async def dead_letter(
        self, group: str, topic: str, qid: int, message: StoredMessage, attempts: int, error: str
    ) -> None:
        entry = stream_entry.encode_entry(
            message.value, message.key, message.tag, message.properties, message.produce_ms
        )
        fields: dict[FieldT, EncodableT] = dict(zip(entry[::2], entry[1::2], strict=True))
        fields.update({
            "qid": qid,
            "offset": message.offset,
            "attempts": attempts,
            "error": error[:1000],
            "dead_ms": int(time.time() * 1000),
        })
        with map_redis_errors(f"dead-lettering {group}/{topic}#{qid}@{message.offset}"):
            await self.redis.xadd(keys.dead_letters(group, topic), fields)
