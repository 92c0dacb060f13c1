"""The consumer groups Redis knows, and removing one: read and written from Redis directly.

Every proxy records, at each heartbeat of a group it serves, the topic it consumes for that group and
the time (``ddmq:group:{<g>}:topics``, in the slot of the group's member set), and adds the group to the
registry set ``ddmq:groups``. So a group is listed as long as its keys are there, whether or not a proxy
serves it now; ``ddmq groups`` reads this, and removes a group with :func:`delete_group`.

A group that only an older proxy (from before the registry) has served has committed offsets but no
registry entry: ``ddmq status --group G`` still shows it, and :func:`delete_group` still removes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddmq.protocol.errors import DdmqError
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import SyncRedis, server_time_ms
from ddmq.protocol.redis.status import DEFAULT_MEMBER_TTL_MS

__all__ = ["DeletedGroup", "GroupHeld", "GroupSummary", "delete_group", "group_keys", "group_names", "group_summary"]


@dataclass(frozen=True)
class GroupSummary:
    group: str
    #: topic -> when a proxy consuming it for the group last heartbeated (ms since the epoch)
    topics: dict[str, int]
    #: live members (heartbeat within the member TTL) -> ms since their last heartbeat
    members: dict[str, int]
    #: members whose heartbeat is older than the member TTL
    expired: list[str]

    @property
    def last_seen_ms(self) -> int | None:
        return max(self.topics.values()) if self.topics else None


def group_names(client: SyncRedis) -> list[str]:
    return sorted(name.decode() for name in client.smembers(keys.groups()))


def group_summary(client: SyncRedis, group: str, member_ttl_ms: int = DEFAULT_MEMBER_TTL_MS) -> GroupSummary:
    now = server_time_ms(client)
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.group_topics(group))
    pipe.zrange(keys.members(group), 0, -1, withscores=True)
    raw_topics, heartbeats = pipe.execute()
    topics = {topic.decode(): int(ms) for topic, ms in raw_topics.items()}
    ages = {member.decode(): now - int(score) for member, score in heartbeats}
    alive = {member: age for member, age in ages.items() if age <= member_ttl_ms}
    return GroupSummary(group, dict(sorted(topics.items())), alive, sorted(set(ages) - set(alive)))


class GroupHeld(DdmqError):
    """A proxy holds a lease on a queue of the group: it is being consumed. Retriable: once its
    consumers stopped, the same call goes through."""

    retriable = True

    def __init__(self, group: str, holders: dict[str, list[str]]) -> None:
        self.holders = holders  # owner -> ["topic#qid", ...]
        held = "; ".join(f"{owner}: {', '.join(queues[:5])}{' ...' if len(queues) > 5 else ''}"
                         for owner, queues in sorted(holders.items()))
        super().__init__(f"group {group!r} is being consumed (leases held by {held})")


@dataclass
class DeletedGroup:
    group: str
    topics: list[str]
    keys_deleted: int = 0
    dead_letters_deleted: int = 0
    #: queues whose lease a proxy held (deleted anyway: ``force``)
    leases_broken: list[str] = field(default_factory=list)


def _group_topics(client: SyncRedis, group: str) -> dict[str, int]:
    """topic -> its number of queues, for every topic the group may have keys in: the registry's and
    every topic with metadata (an older proxy left no registry entry)."""
    names = set(client.hgetall(keys.group_topics(group)).keys()) | set(client.smembers(keys.topics()))
    ordered = sorted(name.decode() for name in names)
    pipe = client.pipeline(transaction=False)
    for topic in ordered:
        pipe.hget(keys.topic_meta(topic), "queues")
    return {topic: int(raw) for topic, raw in zip(ordered, pipe.execute(), strict=True) if raw is not None}


def group_keys(topic: str, queues: int, group: str, with_dead_letters: bool = True,
               with_terms: bool = True) -> list[str]:
    """Every key of ``group`` under ``topic`` (per queue: committed offset, finished set, fetch position,
    lease, lease term, rollbacks, replayed dead letters, expired counts; per topic: the console's lag
    history, dead letters and their claims)."""
    found = []
    for qid in range(queues):
        found += [keys.committed(group, topic, qid), keys.finished(group, topic, qid),
                  keys.fetch_position(group, topic, qid), keys.lease(group, topic, qid),
                  keys.rollbacks(group, topic, qid), keys.replayed(group, topic, qid),
                  keys.expired(group, topic, qid)]
        if with_terms:
            found.append(keys.lease_term(group, topic, qid))
    found += [keys.lag_history(group, topic), keys.local_history(group, topic)]
    if with_dead_letters:
        found += [keys.dead_letters(group, topic), keys.dead_letter_claims(group, topic)]
    return found


def delete_group(client: SyncRedis, group: str, *, force: bool = False,
                 keep_dead_letters: bool = False) -> DeletedGroup:
    """Remove ``group``'s keys from Redis: its offsets, finished sets, fetch positions, leases, rollback
    records, member set, registry entries and (unless ``keep_dead_letters``) its dead letters.

    Raises :class:`GroupHeld` while a proxy holds a lease on one of its queues, unless ``force``. With
    ``force`` the lease term counters stay: a proxy still running keeps fencing tokens that only grow
    (its next commit or renewal finds its lease gone and it lets the queue go). A proxy that still
    serves the group registers it again at its next heartbeat: stop it, or remove the group from its
    config, first.
    """
    keys.check_name("group", group)
    topics = _group_topics(client, group)
    holders: dict[str, list[str]] = {}
    for topic, queues in topics.items():
        pipe = client.pipeline(transaction=False)
        for qid in range(queues):
            pipe.get(keys.lease(group, topic, qid))
        for qid, lease in enumerate(pipe.execute()):
            if lease is not None:
                owner = lease.decode().rpartition(" ")[0]
                holders.setdefault(owner, []).append(f"{topic}#{qid}")
    if holders and not force:
        raise GroupHeld(group, holders)
    report = DeletedGroup(group, sorted(topics), leases_broken=sorted(q for qs in holders.values() for q in qs))
    pipe = client.pipeline(transaction=False)
    for topic in topics:
        pipe.xlen(keys.dead_letters(group, topic))
    report.dead_letters_deleted = 0 if keep_dead_letters else sum(pipe.execute())
    doomed = [key for topic, queues in topics.items()
              for key in group_keys(topic, queues, group, not keep_dead_letters, with_terms=not holders)]
    doomed += [keys.members(group), keys.group_topics(group), keys.member_events(group)]
    for start in range(0, len(doomed), 1000):
        pipe = client.pipeline(transaction=False)
        for key in doomed[start:start + 1000]:
            pipe.delete(key)  # one key per command: any Redis Cluster slot layout
        report.keys_deleted += sum(pipe.execute())
    client.srem(keys.groups(), group)
    return report
