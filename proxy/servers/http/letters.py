"""What a dead-letter replay or purge will touch, and a replay that does what it says.

Under ``on_exhausted: dead_letter_key`` a key with a dead letter is *sequenced*: every later message of
it is dead-lettered on arrival. A replayed message is a later message of its key (it is produced at the
end of its queue), so it is sequenced again unless the key's mark is lifted first. A replay here:

1. snapshots the selected entries (id, key, queue, offset), lifts the mark of every key among them
   (``resume`` on whichever proxy reads its queue, or in Redis for an unread queue), and snapshots
   again until no new key shows up, so a key sequenced meanwhile is lifted too;
2. refuses, with the reason, the entries of a key whose mark could not be lifted (a holder that did
   not answer) and, for a selection by id, the entries of a sequenced key that leave some of its dead
   letters behind (they go back together, in order, or not at all);
3. replays the rest in each key's order (queue, then offset).

The other policies need no lift; a selection by id or ``all`` replays as the store does. A dry run
does steps 1 and 2 without lifting or producing anything, and says what would be touched.

A replay with a ``rate`` produces its entries in steps of a tenth of the rate, each step starting a
tenth of a second after the previous one started at the earliest, so no second of the replay produces
more than ``rate`` messages plus one step, and a slow step delays the rest rather than bunching them.
The steps keep the plan's order, so each key's letters still go back in order. The call answers when
the replay is done: a replay that would take longer than :data:`MAX_PACED_S` at its rate is refused
before anything is touched (a higher rate, or a replay by key, splits it).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any, Final, NamedTuple

from ddmq.proxy.api.keys import key_action
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.core.errors import BadRequestError, DdmqError, UnknownEntryError
from ddmq.proxy.engine.parking import SEQUENCED
from ddmq.proxy.groups.group import TopicConsumer
from ddmq.proxy.store.dead_letters import MAX_PAGE, DeadLetters, ReplayResult
from ddmq.proxy.store.key_commands import ParkStore

__all__ = ["MAX_LISTED", "MAX_PACED_S", "MAX_RATE", "ReplayPlan", "check_pace", "plan_purge", "plan_replay",
           "run_replay"]

#: Most refused keys (and keys to lift) an answer lists by name; the counts cover all of them.
MAX_LISTED: Final = 100
#: Key marks lifted at the same time (each asks the other proxies and waits for their answers).
_LIFTS_AT_ONCE: Final = 32
#: Rounds of "snapshot, lift the new keys" before a replay goes on with what it has.
_ROUNDS: Final = 5
#: Highest ``rate`` (messages a second) a paced replay takes; above it, leave the rate out.
MAX_RATE: Final = 100_000
#: Longest a paced replay may take (its entries over its rate), so a call answers in bounded time.
MAX_PACED_S: Final = 900
#: Steps a second of a paced replay.
_STEPS_PER_S: Final = 10


class Entry(NamedTuple):
    qid: int
    offset: int
    id: str
    key: str


class ReplayPlan(NamedTuple):
    #: Entries to replay, in each key's order.
    entries: list[Entry]
    #: Keys whose mark is lifted (or would be) before the replay.
    lifts: list[str]
    #: key -> (entries, reason) that are not replayed.
    refused: dict[str, tuple[int, str]]
    #: Asked-for ids not in the stream.
    missing: list[str]
    #: The selection: ids (None: all of them, or of ``key``).
    ids: list[str] | None = None
    key: str | None = None


async def snapshot(letters: DeadLetters, ids: list[str] | None, key: str | None) -> tuple[list[Entry], list[str]]:
    """The selected entries present now, in key order (queue, then offset), and asked-for ids not found."""
    wanted = set(ids) if ids is not None else None
    found: list[Entry] = []
    after: str | None = None
    while True:
        page = await letters.read(after, MAX_PAGE, 1)
        found += [Entry(letter.qid, letter.offset, letter.id, letter.key) for letter in page.entries
                  if (wanted is None or letter.id in wanted) and (key is None or letter.key == key)]
        if not page.entries or not page.more:
            break
        after = page.entries[-1].id
    found.sort()
    present = {entry.id for entry in found}
    return found, [entry_id for entry_id in ids or () if entry_id not in present]


async def _marks(consumer: TopicConsumer) -> dict[str, set[int]]:
    """Sequenced keys as Redis holds them: key -> its queues."""
    marks: dict[str, set[int]] = defaultdict(set)
    for record in await ParkStore(consumer.broker.redis, consumer.group, consumer.topic).all():
        if record.parked_by == SEQUENCED:
            marks[record.key].add(record.qid)
    return marks


async def plan_replay(letters: DeadLetters, consumer: TopicConsumer, ids: list[str] | None,
                      key: str | None) -> ReplayPlan:
    """What a replay of ``ids`` (None: all; or every entry of ``key``) touches, lifting nothing."""
    entries, missing = await snapshot(letters, ids, key)
    if consumer.config.on_exhausted != "dead_letter_key":
        return ReplayPlan(entries, [], {}, missing, ids, key)
    refused: dict[str, tuple[int, str]] = {}
    if ids is not None:
        marks = await _marks(consumer)
        selected = _counts(entries)
        every, _ = await snapshot(letters, None, None)
        for name, count in _counts(every).items():
            if name in marks and name in selected and selected[name] < count:
                refused[name] = (selected[name], f"key {name!r} is sequenced (on_exhausted: dead_letter_key) "
                                 f"and has {count} dead letters: they go back together and in order, or the rest "
                                 f"would be dead-lettered again; replay --key {name} or --all")
        entries = [entry for entry in entries if entry.key not in refused]
    lifts = sorted({entry.key for entry in entries if entry.key})
    return ReplayPlan(entries, lifts, refused, missing, ids, key)


async def _produce(letters: DeadLetters, ids: list[str], rate: int | None) -> ReplayResult:
    """Replay ``ids`` in their order, at most ``rate`` a second (None: at once)."""
    if rate is None:
        return await letters.replay(ids)
    step = max(1, rate // _STEPS_PER_S)
    clock = asyncio.get_running_loop().time
    replayed, missing = 0, list[str]()
    next_at = clock()
    for start in range(0, len(ids), step):
        await asyncio.sleep(max(0.0, next_at - clock()))
        next_at = clock() + step / rate  # from this step's start: a late step never makes the next one early
        done = await letters.replay(ids[start:start + step])
        replayed, missing = replayed + done.replayed, missing + done.missing
    return ReplayResult(replayed, missing)


def check_pace(plan: ReplayPlan, rate: int | None) -> None:
    """Refuse a paced replay that would take longer than :data:`MAX_PACED_S`."""
    if rate is not None and len(plan.entries) > rate * MAX_PACED_S:
        raise BadRequestError(f"{len(plan.entries)} dead letters at {rate}/s take longer than {MAX_PACED_S} s: "
                              "raise the rate, or replay by key or by ids")


async def run_replay(plan: ReplayPlan, letters: DeadLetters, consumer: TopicConsumer, leases: LeaseStore,
                     by: str, rate: int | None = None) -> dict[str, Any]:
    """Lift the plan's marks, refuse what could not be lifted, replay the rest (at most ``rate`` a
    second); the answer."""
    check_pace(plan, rate)
    if consumer.config.on_exhausted != "dead_letter_key":
        result = await _produce(letters, [entry.id for entry in plan.entries], rate)
        return answer(result.replayed, plan, result.missing)
    refused = dict(plan.refused)
    lifted: set[str] = set()
    entries = plan.entries
    for _ in range(_ROUNDS):
        new = sorted({entry.key for entry in entries if entry.key} - lifted - set(refused))
        if not new:
            break
        failed = await _lift(consumer, leases, new, by)
        refused.update(failed)
        lifted.update(name for name in new if name not in failed)
        if plan.ids is not None:
            break  # a selection by id is the entries asked for, read once
        # what was dead-lettered meanwhile (a key sequenced since, a later message of a lifted key)
        entries, _ = await snapshot(letters, None, plan.key)
    counts = _counts(entries)
    refused = {name: (counts.get(name, count), reason) for name, (count, reason) in refused.items()}
    chosen = [entry for entry in entries if entry.key not in refused]
    done = await _produce(letters, [entry.id for entry in chosen], rate) if chosen else None
    final = plan._replace(entries=chosen, lifts=sorted(lifted), refused=refused)
    return answer(done.replayed if done else 0, final, done.missing if done else [])


async def _lift(consumer: TopicConsumer, leases: LeaseStore, names: list[str], by: str) -> dict[str, tuple[int, str]]:
    """Lift the marks of ``names``; the keys whose mark stays, with the reason."""
    marks = await _marks(consumer)
    refused: dict[str, tuple[int, str]] = {}

    async def lift(name: str) -> None:
        try:
            answer_ = await key_action(consumer, leases, "resume", name, None, by)
        except UnknownEntryError:
            answer_ = {"applied": []}  # no proxy knows the key: nothing holds it
        except DdmqError as exc:
            refused[name] = (0, f"the mark of key {name!r} could not be lifted ({exc}): nothing of it replayed")
            return
        left = marks.get(name, set()) - {entry["qid"] for entry in answer_["applied"]}
        if left:
            refused[name] = (0, f"the mark of key {name!r} on queue(s) {sorted(left)} was not lifted (the proxy "
                             "reading it did not answer in time): nothing of it replayed; try again")

    for start in range(0, len(names), _LIFTS_AT_ONCE):
        await asyncio.gather(*(lift(name) for name in names[start:start + _LIFTS_AT_ONCE]))
    return refused


async def plan_purge(letters: DeadLetters, ids: list[str] | None) -> dict[str, Any]:
    """A purge's dry run: what it would delete."""
    entries, missing = await snapshot(letters, ids, None)
    return {"dry_run": True, "purged": 0, "would_purge": len(entries), "keys": _keys(entries),
            "missing": missing}


def answer(replayed: int, plan: ReplayPlan, missing: list[str], dry_run: bool = False) -> dict[str, Any]:
    """A replay's answer (or its dry run's): counts, and the first keys by name."""
    refused = sorted(plan.refused.items())
    out: dict[str, Any] = {
        "replayed": replayed,
        "missing": sorted(set(plan.missing) | set(missing)),
        "keys": _keys(plan.entries),
        "lifted": len(plan.lifts),
        "refused": [{"key": key, "dead_letters": count, "reason": reason}
                    for key, (count, reason) in refused[:MAX_LISTED]],
        "refused_keys": len(refused),
    }
    if dry_run:
        out.update(dry_run=True, would_replay=len(plan.entries), lifts=plan.lifts[:MAX_LISTED])
    return out


def _by_key(entries: list[Entry]) -> dict[str, list[Entry]]:
    grouped: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        grouped[entry.key].append(entry)
    return grouped


def _keys(entries: list[Entry]) -> int:
    """Order keys among ``entries`` (a message without one has none)."""
    return len({entry.key for entry in entries if entry.key})


def _counts(entries: list[Entry]) -> dict[str, int]:
    return {key: len(group) for key, group in _by_key(entries).items()}
