"""Every Redis key the project uses is built here, and only here.

Per-queue keys carry the Redis Cluster hash tag ``{<topic>:<qid>}`` so that a queue's stream, its
sequence counter, and each group's committed offset and lease live in one slot: the Lua scripts that
touch them together (produce, fenced commit) stay single-slot, and queues spread across a cluster
(docs/design/redis.md, "Redis Cluster", says why each group-level key is placed as it is).

================================  ========  ===================================================
key                               type      holds
================================  ========  ===================================================
``ddmq:topics``                   set       names of known topics
``ddmq:topic:<t>``                hash      topic metadata: ``queues``
``ddmq:{<t>:<q>}:q``              stream    the queue; entry id ``0-<offset>``
``ddmq:{<t>:<q>}:seq``            string    last offset assigned by the producer script
``ddmq:{<t>:<q>}:pid:<p>``        hash      producer p's applied calls on the queue: ``s`` (its last
                                            sequence number) and ``<seq>`` → the offsets it was given;
                                            PX expiry (docs/design/redis.md, "Idempotent produce")
``ddmq:{<t>:<q>}:dd:<id>``        string    the offset of the message produced with dedup id ``id``;
                                            PX expiry (the producer's dedup window)
``ddmq:{<t>:<q>}:off:<g>``        string    group g's committed offset (next offset to consume)
``ddmq:{<t>:<q>}:done:<g>``       string    offsets past it already finished, as ranges ``a-b,c``
``ddmq:{<t>:<q>}:fetch:<g>``      string    group g's low-level ``ack`` position (next offset to fetch)
``ddmq:{<t>:<q>}:lease:<g>``      string    group g's lease on the queue: ``<owner> <term>``, PX expiry
``ddmq:{<t>:<q>}:term:<g>``       string    group g's lease term counter (the fencing token source)
``ddmq:{<t>:<q>}:rollback:<g>``   hash      rollbacks of the queue group g's proxy detected: ``count``,
                                            ``at_ms``, ``read_upto``, ``stream_end``, ``owner``
``ddmq:{<t>:<q>}:expired:<g>``    hash      entries group g never saw because they were trimmed first:
                                            ``count``, ``first``, ``last`` (latest range), ``at_ms``
``ddmq:{<t>:<q>}:trim``           string    the queue's trimmer: ``<owner>``, PX expiry
``ddmq:dlq:{<g>:<t>}``            stream    group g's dead letters for topic t
``ddmq:dlq:{<g>:<t>}:claimed``    stream    dead letters taken out for a replay under way (field
                                            ``dlq_id`` + the entry's fields) until produced
``ddmq:{<t>:<q>}:replayed:<g>``   zset      dead-letter ids of group g produced into the queue
                                            by a replay, scored by time (kept 7 days)
``ddmq:members:{<g>}``            zset      proxies serving group g, scored by last heartbeat (ms)
``ddmq:groups``                   set       names of the groups a proxy has served (the registry)
``ddmq:lag:{<g>:<t>}``            stream    the console's lag samples of group g on topic t, id = the
                                            sample's interval start (ms); capped (720 entries)
``ddmq:group:{<g>}:topics``       hash      topic → last heartbeat (ms) of a proxy consuming it for g
``ddmq:parked:{<g>:<t>}``         hash      ``<qid> <key>`` → JSON of a parked (or sequenced) key of
                                            group g on topic t (docs/failures.md)
``ddmq:keycmd:{<g>:<t>}``         stream    operator key actions for the proxies holding the queues;
                                            capped (1000 entries)
``ddmq:keycmd:{<g>:<t>}:r:<id>``  list      the holders' answers to key action ``id``; short expiry
``ddmq:actions``                  stream    the record of operator actions (pause, replay, key actions,
                                            offset resets, breakers ...), every group; capped (1000)
================================  ========  ===================================================
"""

from __future__ import annotations

import re

__all__ = [
    "PREFIX",
    "actions",
    "breakers",
    "check_name",
    "committed",
    "dead_letter_claims",
    "dead_letters",
    "dedup_id",
    "expired",
    "fetch_position",
    "finished",
    "group_topics",
    "groups",
    "key_command_replies",
    "key_commands",
    "lag_history",
    "lease",
    "lease_term",
    "members",
    "offset_of",
    "parked_keys",
    "producer_state",
    "replayed",
    "rollbacks",
    "sequence",
    "stream",
    "stream_id",
    "stream_id_after",
    "topic_meta",
    "topics",
    "trimmer",
]

PREFIX = "ddmq"

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")


def check_name(kind: str, name: str) -> str:
    """Reject names that would break key layout (hash tags, separators) or be unreadable in logs."""
    if not _NAME.match(name):
        raise ValueError(f"invalid {kind} name {name!r}: use 1-200 of A-Z a-z 0-9 _ . -")
    return name


def topics() -> str:
    return f"{PREFIX}:topics"


def topic_meta(topic: str) -> str:
    return f"{PREFIX}:topic:{topic}"


def _queue_tag(topic: str, qid: int) -> str:
    return f"{PREFIX}:{{{topic}:{qid}}}"


def stream(topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:q"


def sequence(topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:seq"


def producer_state(topic: str, qid: int, producer_id: str) -> str:
    return f"{_queue_tag(topic, qid)}:pid:{producer_id}"


def dedup_id(topic: str, qid: int, dedup: str) -> str:
    return f"{_queue_tag(topic, qid)}:dd:{dedup}"


def committed(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:off:{group}"


def finished(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:done:{group}"


def fetch_position(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:fetch:{group}"


def lease(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:lease:{group}"


def lease_term(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:term:{group}"


def rollbacks(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:rollback:{group}"


def expired(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:expired:{group}"


def trimmer(topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:trim"


#: How long a member may stay silent before the others drop it, unless ``leases.ttl_ms`` says otherwise;
#: the config's default and what ``ddmq status`` assumes of a proxy it cannot ask.
DEFAULT_MEMBER_TTL_MS = 30_000


def members(group: str) -> str:
    return f"{PREFIX}:members:{{{group}}}"


def paused(group: str) -> str:
    """A group's pauses (hash): a topic, or ``*`` for every topic, -> the pause as JSON."""
    return f"{PREFIX}:paused:{{{group}}}"


def breakers(group: str) -> str:
    """A group's breakers that hold a topic (hash): ``["<instance>", "<topic>"]`` (JSON) -> the breaker's
    state as JSON, written by the proxy whose breaker it is and deleted when it closes."""
    return f"{PREFIX}:breakers:{{{group}}}"


def member_events(group: str) -> str:
    # A short stream of joins and leaves, so the other proxies rebalance at once (the members' hash tag).
    return f"{PREFIX}:member-events:{{{group}}}"


def groups() -> str:
    return f"{PREFIX}:groups"


def group_topics(group: str) -> str:
    # The members' hash tag: a heartbeat writes both in one slot.
    return f"{PREFIX}:group:{{{group}}}:topics"


def dead_letters(group: str, topic: str) -> str:
    return f"{PREFIX}:dlq:{{{group}:{topic}}}"


def lag_history(group: str, topic: str) -> str:
    return f"{PREFIX}:lag:{{{group}:{topic}}}"


def local_history(group: str, topic: str) -> str:
    """The console's samples of what each proxy alone knows (its keys by state, its end-to-end
    latency), one capped stream per group and topic, each entry naming its proxy."""
    return f"{PREFIX}:lagl:{{{group}:{topic}}}"


def parked_keys(group: str, topic: str) -> str:
    return f"{PREFIX}:parked:{{{group}:{topic}}}"


def key_commands(group: str, topic: str) -> str:
    return f"{PREFIX}:keycmd:{{{group}:{topic}}}"


def key_command_bell() -> str:
    """One stream for every group and topic: each key command is posted here too (with its group and
    topic), so a proxy watches one stream, blocking, instead of polling one per (group, topic)."""
    return f"{PREFIX}:keycmd:bell"


def key_command_replies(group: str, topic: str, command_id: str) -> str:
    return f"{key_commands(group, topic)}:r:{command_id}"


def actions() -> str:
    """The record of operator actions (:mod:`ddmq.protocol.redis.actions`): one key, so one slot on a
    Cluster, written a few times a minute at most."""
    return f"{PREFIX}:actions"


def dead_letter_claims(group: str, topic: str) -> str:
    return f"{dead_letters(group, topic)}:claimed"


def replayed(group: str, topic: str, qid: int) -> str:
    return f"{_queue_tag(topic, qid)}:replayed:{group}"


def replay_lease(group: str, lease_id: str) -> str:
    """What a replay lease handed out (a hash: ``"<qid> <topic>"`` -> offset ranges). Every command
    names this one key, so no hash tag is needed on a Cluster."""
    return f"{PREFIX}:replaylease:{group}:{lease_id}"


def stream_id(offset: int) -> str:
    """The stream entry id of an offset. Offsets map to ids ``0-<offset>`` exactly (offset >= 1)."""
    return f"0-{offset}"


def stream_id_after(offset: int) -> str:
    """The id to pass to XREAD to read entries with an offset greater than ``offset``."""
    return f"0-{offset}" if offset > 0 else "0-0"


def offset_of(entry_id: bytes | str) -> int:
    """Inverse of :func:`stream_id`."""
    if isinstance(entry_id, bytes):
        entry_id = entry_id.decode()
    ms, _, seq = entry_id.partition("-")
    if ms != "0":
        raise ValueError(f"stream entry {entry_id!r} was not written by the ddmq producer")
    return int(seq)
