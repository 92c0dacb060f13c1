"""Why is this key stuck: one order key of a (group, topic) explained, queue by queue.

For each queue where the key has an unfinished or parked message, the answer says the key's state (the
names of :data:`~ddmq.proxy.engine.parking.KEY_STATES`, the same the keys view, the CLI, the console and
``ddmq_keys{state}`` use) and since when, its head's offset and attempts, the client holding the head
(its address, and the version or client id it sent) and the ack deadline, the last reason, what the
proxy will do next and when, and the command that acts on the key. The engine is read once, in the
event loop; nothing here changes it.

The proxy explains the queues it reads itself; for a queue another proxy reads it names that proxy
(ask its admin API), and for a queue nobody reads it shows the park stored in Redis, if any.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from typing import Any, Final

from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.parking import KEY_STATES, SEQUENCED, key_text
from ddmq.proxy.engine.redelivery import TICK_S
from ddmq.proxy.engine.tenants import shown_name
from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer
from ddmq.proxy.store.key_commands import ParkRecord, ParkStore

__all__ = ["EXPLAIN_STATES", "MAX_REASON_CHARS", "HolderLookup", "explain_key"]

#: The states an explanation names: the keys view's, then ``sequenced`` (its dead letters hold the
#: key), ``idle`` (nothing unfinished) and ``elsewhere`` (another proxy reads the queue).
EXPLAIN_STATES: Final = (*KEY_STATES, "sequenced", "idle", "elsewhere")
#: Longest reason quoted (a client's fail reason is its own text): keeps the answer bounded.
MAX_REASON_CHARS: Final = 500
#: (group, topic, qid, offset) -> (protocol, peer, version or client id, ack deadline in epoch ms).
HolderLookup = Callable[[str, str, int, int], tuple[str, str, str | None, int] | None]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _command(consumer: TopicConsumer, actions: str, key: str) -> str:
    return (f"ddmq keys {actions} --group {shlex.quote(consumer.group)} --topic {shlex.quote(consumer.topic)} "
            f"--key {shlex.quote(key)}")


def _reason(text: str | None) -> str | None:
    return text[:MAX_REASON_CHARS] if text else None


async def explain_key(
    group: ConsumerGroup, consumer: TopicConsumer, leases: LeaseStore, key: str, qid: int | None,
    holder: HolderLookup | None = None,
) -> dict[str, Any]:
    """The explanation of ``key`` (on queue ``qid`` only, when given): one entry per queue where the key
    has something unfinished or parked; the queue its messages hash to when it has nothing anywhere."""
    if qid is not None and not 0 <= qid < max(consumer.queues, 1):
        raise BadRequestError(f"qid must be 0..{consumer.queues - 1}, got {qid}")
    heads = {job.qid: job for k, job in consumer.blocking_queue.heads() if key_text(k) == key}
    wanted = range(consumer.queues) if qid is None else [qid]
    held = set(consumer.held)
    entries: list[dict[str, Any]] = []
    for q in wanted:
        record = consumer.parking.records.get(q, {}).get(key)
        if q in held and (q in heads or record is not None):
            entries.append(_local(group, consumer, key, q, heads.get(q), record, holder))
    others = [q for q in wanted if q not in held]
    if others:
        entries.extend(await _not_read_here(consumer, leases, key, others))
    if not entries:
        home = qid if qid is not None else queue_for_key(key, consumer.queues) if consumer.queues else 0
        entries.append(_idle(consumer, key, home, "this proxy" if home in held else None))
    return {"group": consumer.group, "topic": consumer.topic, "key": key, "now_ms": _now_ms(), "queues": entries}


def _entry(consumer: TopicConsumer, key: str, qid: int, read_by: str | None) -> dict[str, Any]:
    return {
        "qid": qid, "read_by": read_by, "state": "idle", "since_ms": None, "head_offset": None, "attempts": None,
        "max_attempts": consumer.config.max_retry + 1, "client": None, "deadline_ms": None, "reason": None,
        "waiting": 0, "held_in_redis": 0, "parked_by": None, "topic_hold": None, "next": "", "command": None,
    }


def _idle(consumer: TopicConsumer, key: str, qid: int, read_by: str | None) -> dict[str, Any]:
    entry = _entry(consumer, key, qid, read_by)
    entry["next"] = "nothing unfinished or parked for the key here: its next message is delivered as it comes"
    entry["command"] = _command(consumer, "park", key)
    return entry


def _topic_hold(group: ConsumerGroup, topic: str) -> str | None:
    """What holds the whole topic on this proxy: an operator's pause or its breaker."""
    if group.pause_watch.paused_s(topic) > 0:
        return "paused"
    breaker = group.breakers.state(topic)
    if breaker in ("open", "half_open"):
        return f"breaker {breaker.replace('_', '-')}"
    return None


def _local(
    group: ConsumerGroup, consumer: TopicConsumer, key: str, qid: int, job: UpstreamJob | None,
    record: ParkRecord | None, holder: HolderLookup | None,
) -> dict[str, Any]:
    entry = _entry(consumer, key, qid, "this proxy")
    entry["topic_hold"] = _topic_hold(group, consumer.topic)
    if job is None:  # a hold with nothing read yet, or a sequenced key's mark
        assert record is not None
        return _from_record(consumer, key, entry, record, "the key stops at its next message read")
    entry.update(state=consumer.parking.state_of(qid, key), head_offset=job.offset, attempts=job.attempts,
                 reason=_reason(job.last_error or (record.reason if record is not None else None)),
                 waiting=max(consumer.blocking_queue.chain_length(job.order_key) - 1, 0),
                 held_in_redis=consumer.jobs.held.held_of(job.order_key),
                 since_ms=job.message.produce_ms or None)
    if job.state is JobState.PARKED:
        return _from_record(consumer, key, entry, record, "parked")
    entry["next"], entry["command"] = _next_step(consumer, key, job, entry, holder)
    if entry["topic_hold"] is not None:
        entry["next"] += f"; the topic is held ({entry['topic_hold']}): nothing of it goes out until that ends"
    if entry["held_in_redis"]:
        tenants, tenant = consumer.jobs.tenants, consumer.jobs.held.tenant_of.get(job.order_key)
        behind = f"the key's cap (key_buffer {consumer.config.key_buffer})"
        if tenants is not None and tenant is not None:
            behind += (f" or its tenant's share ({shown_name(tenant) or '(none)'}: "
                       f"{tenants.linked.get(tenant, 0)} in memory of {tenants.share(tenant)})")
        entry["next"] += f"; held: {entry['held_in_redis']} messages wait in Redis behind {behind}"
    return entry


def _from_record(
    consumer: TopicConsumer, key: str, entry: dict[str, Any], record: ParkRecord | None, what: str
) -> dict[str, Any]:
    if record is not None and record.parked_by == SEQUENCED:
        entry.update(state="sequenced", head_offset=entry["head_offset"] or record.offset,
                     reason=_reason(record.reason), since_ms=record.parked_at_ms)
        entry["next"] = (f"sequenced: offset {record.offset} is in the dead letters, so every later message of "
                         "the key goes there too, in order, until its dead letters are replayed or purged")
        entry["command"] = (f"ddmq dead-letters replay --group {shlex.quote(consumer.group)} "
                            f"--topic {shlex.quote(consumer.topic)} --key {shlex.quote(key)}")
        return entry
    entry["state"] = "parked"
    if record is not None:
        entry.update(since_ms=record.parked_at_ms, reason=entry["reason"] or _reason(record.reason),
                     parked_by=record.parked_by)
        if entry["head_offset"] is None:
            entry["head_offset"] = record.offset
    entry["next"] = f"{what} until an operator acts: retry or skip the head, or resume the key"
    entry["command"] = _command(consumer, "retry|skip|resume", key)
    return entry


def _after_failure(consumer: TopicConsumer, attempts: int) -> str:
    config = consumer.config
    if attempts <= config.max_retry:
        return (f"retried {config.retry_delay_ms(attempts)} ms after it (attempt {attempts + 1} of "
                f"{config.max_retry + 1})")
    return {"park": "the key parks on it", "dead_letter_key": "dead-lettered, and the key's later messages after it"
            }.get(config.on_exhausted, "dead-lettered, and the key moves on")


def _next_step(
    consumer: TopicConsumer, key: str, job: UpstreamJob, entry: dict[str, Any], holder: HolderLookup | None
) -> tuple[str, str | None]:
    state, attempts = job.state, job.attempts
    if state is JobState.IN_FLIGHT:
        found = holder(consumer.group, consumer.topic, job.qid, job.offset) if holder is not None else None
        deadline_ms = _now_ms() + int((job.deadline * TICK_S - time.monotonic()) * 1000)
        entry["deadline_ms"] = deadline_ms
        who = "a client"
        if found is not None:
            protocol, peer, client_id, _ = found
            entry["client"] = {"protocol": protocol, "peer": peer, "client_id": client_id}
            entry["since_ms"] = found[3] - consumer.config.timeout_ms
            who = f"{protocol} client {peer}" + (f" ({client_id})" if client_id else "")
        return (f"waiting for the ack of offset {job.offset} from {who} until {_iso(deadline_ms)}; if it fails "
                f"or times out: {_after_failure(consumer, attempts)}", _command(consumer, "park", key))
    if state is JobState.RETRY_WAIT:
        if attempts > consumer.config.max_retry:
            return "being written to the dead letters; then the key moves on", None
        return (f"retry {consumer.config.retry_delay_ms(attempts)} ms after its last failure (attempt "
                f"{attempts + 1} of {consumer.config.max_retry + 1}); if that fails: "
                f"{_after_failure(consumer, attempts + 1)}", _command(consumer, "retry|skip|park", key))
    if state is JobState.READY:
        return (f"ready: offset {job.offset} goes to the next pull of queue {job.qid} (attempt {attempts + 1} of "
                f"{consumer.config.max_retry + 1})", _command(consumer, "park", key))
    return (f"offset {job.offset} is on its way down the chain ({state.name.lower()}) to the pull buffer",
            _command(consumer, "park", key))


async def _not_read_here(
    consumer: TopicConsumer, leases: LeaseStore, key: str, qids: list[int]
) -> list[dict[str, Any]]:
    """Queues this proxy does not read: name the proxy that does, or show the park kept in Redis."""
    holders = await asyncio.gather(*(leases.holder(consumer.group, consumer.topic, q) for q in qids))
    free = [q for q, h in zip(qids, holders, strict=True) if h is None]
    records = {r.qid: r for r in await ParkStore(consumer.broker.redis, consumer.group, consumer.topic).all()
               if r.key == key and r.qid in free} if free else {}
    entries: list[dict[str, Any]] = []
    home = queue_for_key(key, consumer.queues) if consumer.queues else 0
    for q, lease in zip(qids, holders, strict=True):
        if lease is not None and (q == home or len(qids) == 1):
            entry = _entry(consumer, key, q, lease.owner)
            entry["state"] = "elsewhere"
            entry["next"] = f"queue {q} is read by proxy {lease.owner}: ask its admin API (ddmq --http <its address>)"
            entries.append(entry)
        elif q in records:
            entry = _from_record(consumer, key, _entry(consumer, key, q, None), records[q],
                                 f"no proxy reads queue {q} now; parked again when one does, and")
            entries.append(entry)
    return entries
