"""``ddmq topics``: the topics in a Redis, and what each queue holds, read from Redis directly::

    ddmq topics list --redis redis://127.0.0.1:6379/0
    ddmq topics describe rides --redis redis://127.0.0.1:6379/0

A topic exists once a proxy serving it started or a producer wrote to it. ``list`` shows each topic's
queues, the messages ever produced into it and the entries its streams hold now; ``describe`` the same
per queue, with the first and last offsets still in the stream and their produce times (UTC).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

from ddmq.client.cli import patience
from ddmq.protocol import clitools
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import SyncRedis, redact_url

__all__ = ["QueueInfo", "TopicInfo", "add_cli", "topic_info"]



@dataclass(frozen=True)
class QueueInfo:
    qid: int
    produced: int  #: messages ever produced (the last offset given out)
    length: int  #: entries in the stream now
    first_offset: int | None  #: oldest entry still in the stream
    last_offset: int | None
    first_ms: int | None  #: produce times of those entries (ms since the epoch)
    last_ms: int | None


@dataclass(frozen=True)
class TopicInfo:
    topic: str
    queues: list[QueueInfo]

    @property
    def produced(self) -> int:
        return sum(q.produced for q in self.queues)

    @property
    def length(self) -> int:
        return sum(q.length for q in self.queues)


def topic_names(client: SyncRedis) -> list[str]:
    return sorted(t.decode() for t in client.smembers(keys.topics()))


def topic_info(client: SyncRedis, topic: str) -> TopicInfo | None:
    """What each queue of ``topic`` holds; None when the topic does not exist."""
    raw = client.hget(keys.topic_meta(topic), "queues")
    if raw is None:
        return None
    queues = int(raw)
    pipe = client.pipeline(transaction=False)
    for qid in range(queues):
        stream = keys.stream(topic, qid)
        pipe.get(keys.sequence(topic, qid))
        pipe.xlen(stream)
        pipe.xrange(stream, "-", "+", count=1)
        pipe.xrevrange(stream, "+", "-", count=1)
    replies = pipe.execute()
    rows = []
    for qid in range(queues):
        sequence, length, first, last = replies[4 * qid : 4 * qid + 4]
        rows.append(QueueInfo(qid, int(sequence or 0), int(length), _offset(first), _offset(last),
                              _produce_ms(first), _produce_ms(last)))
    return TopicInfo(topic, rows)


def _offset(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> int | None:
    if not entries:
        return None
    major, _, minor = entries[0][0].decode().partition("-")
    return int(minor) if major == "0" else None  # a foreign, time-based id carries no offset


def _produce_ms(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> int | None:
    raw = entries[0][1].get(b"ts") if entries else None
    return int(raw) if raw is not None and raw.isdigit() else None


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("topics", help="list the topics, or describe one's queues (read from Redis)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every topic: queues, messages produced, entries held")
    describe = actions.add_parser("describe", help="one topic, queue by queue")
    describe.add_argument("topic")
    for action, func in ((listing, _list), (describe, _describe)):
        clitools.env_option(action, "--redis", clitools.ENV_REDIS, "the broker's URL, e.g. redis://127.0.0.1:6379/0")
        action.add_argument("--json", action="store_true", help="print JSON instead of a table")
        patience.add_timeout(action)
        action.set_defaults(func=func)


def _read(args: argparse.Namespace, names: list[str] | None) -> list[TopicInfo]:
    def read(client: SyncRedis) -> list[TopicInfo | None]:
        return [topic_info(client, name) for name in (names if names is not None else topic_names(client))]

    found = patience.read_redis(args, read)
    if names is not None and None in found:
        raise clitools.CliError(f"no topic {names[0]!r} in {redact_url(args.redis)}")
    return [info for info in found if info is not None]


def _list(args: argparse.Namespace) -> int:
    infos = _read(args, None)
    if args.json:
        print(json.dumps([{"topic": i.topic, "queues": len(i.queues), "produced": i.produced, "length": i.length}
                          for i in infos], indent=2))
        return 0
    rows = [[i.topic, len(i.queues), i.produced, i.length] for i in infos]
    print(clitools.table(["topic", "queues", "produced", "entries held"], rows))
    print(f"{len(infos)} topic(s)")
    return 0


def _describe(args: argparse.Namespace) -> int:
    (info,) = _read(args, [args.topic])
    if args.json:
        print(json.dumps({"topic": info.topic, "queues": [asdict(q) for q in info.queues]}, indent=2))
        return 0
    rows = [[q.qid, q.produced, q.length, q.first_offset or "-", q.last_offset or "-", clitools.utc_time(q.first_ms),
             clitools.utc_time(q.last_ms)] for q in info.queues]
    header = ["qid", "produced", "entries", "first offset", "last offset", "first produced", "last produced"]
    print(clitools.table(header, rows))
    print(f"topic {info.topic}: {len(info.queues)} queue(s), {info.produced} produced, {info.length} held")
    return 0
