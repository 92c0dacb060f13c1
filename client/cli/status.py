"""``ddmq status``: who owns each queue of a group, and how far behind it is, read from Redis.

It reads Redis directly (not a proxy), so it works while proxies are down or moving queues::

    ddmq status --redis redis://127.0.0.1:6379/0 --group cg_rides

A group is known when a proxy heartbeats for it or it has a committed offset in some topic; the
command fails (status 1) on a group that is neither, and on a ``--topic`` that does not exist. The
time lag is the age of the first message the group has not finished (``?`` when that entry is gone
from the stream). A member whose last heartbeat is older than
``--member-ttl-ms`` (the proxies' ``leases.ttl_ms``) is shown as expired: its proxy stopped without
leaving the group, and the others have already taken or will take its queues. ``stored`` is what
the queue holds in Redis now, ``expired`` what the group never received because it was trimmed first
(docs/retention.md); below the table, the group holding each topic's retention back, and Redis memory.
With ``--http`` (a proxy's HTTP API), also each topic's end-to-end latency as that proxy measured it
since it started: p50 / p99 from produce to first delivery and to ack, and the attempts at ack; and
the keys at their ``key_buffer`` cap on the queues that proxy reads, with the messages they left in
Redis, per queue (docs/consuming.md, "A burst of one key").
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from typing import Any

from ddmq.client.cli import patience
from ddmq.client.cli.admin import client_for, quote
from ddmq.client.cli.pause import describe
from ddmq.protocol import clitools
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import redact_url
from ddmq.protocol.redis.pauses import pauses
from ddmq.protocol.redis.status import DEFAULT_MEMBER_TTL_MS, GroupStatus, QueueStatus, group_status

__all__ = ["DEFAULT_MEMBER_TTL_MS", "GroupStatus", "QueueStatus", "add_cli", "format_status", "group_status"]



def format_status(status: GroupStatus) -> str:
    def member(name: str, age: int) -> str:
        return f"{name} ({'EXPIRED: ' if name in status.expired else ''}heartbeat {age} ms ago)"

    members = ", ".join(member(name, age) for name, age in sorted(status.members.items()))
    if not members:
        members = "no members: nothing is consuming"
    elif len(status.expired) == len(status.members):
        members += " -- no live member: nothing is consuming"
    lines = [f"group {status.group}: {members}"]
    lines.append(
        f"{'topic':<20} {'qid':>4} {'owner':<24} {'term':>5} {'lease ms':>9} "
        f"{'committed':>10} {'produced':>10} {'lag':>8} {'time lag':>9} {'rollbacks':>9} {'stored':>8} {'expired':>8}"
    )
    for row in status.queues:
        lines.append(
            f"{row.topic:<20} {row.qid:>4} {row.owner or '-':<24} {row.term or '-':>5} "
            f"{row.lease_expires_in_ms if row.lease_expires_in_ms is not None else '-':>9} "
            f"{row.committed if row.committed is not None else '-':>10} {row.produced:>10} {row.lag:>8} "
            f"{_age(row.lag_ms):>9} {row.rollbacks:>9} {row.stored:>8} {row.expired:>8}"
        )
    rolled = [row for row in status.queues if row.last_rollback_ms]
    if rolled:
        last = max(rolled, key=lambda row: row.last_rollback_ms or 0)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((last.last_rollback_ms or 0) / 1000))
        lines.append(f"Redis rolled back under {len(rolled)} queue(s), last under {last.topic}#{last.qid} at {when}: "
                     "messages it lost are lost; see the proxy's log")
    lost = [row for row in status.queues if row.expired]
    if lost:
        lines.append(f"EXPIRED: {sum(row.expired for row in lost)} message(s) of {len(lost)} queue(s) were trimmed "
                     "before the group read them (retention cap, idle group or a producer's maxlen)")
    now = int(time.time() * 1000)
    for holder in status.retention:
        age = _age(max(0, now - holder.oldest_ms) if holder.oldest_ms is not None else None)
        lines.append(f"retention of {holder.topic}: held back by group {holder.group}, "
                     f"{holder.retained} message(s) kept for it, oldest {age}")
    if status.maxmemory:
        lines.append(f"redis memory: {_mb(status.used_memory)} of maxmemory {_mb(status.maxmemory)} "
                     f"({100 * status.used_memory / status.maxmemory:.0f}%)")
    else:
        lines.append(f"redis memory: {_mb(status.used_memory)} (no maxmemory)")
    if not status.queues:
        lines.append("(no queues: the group has not consumed any topic yet)")
    return "\n".join(lines)


def _mb(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def _age(ms: int | None) -> str:
    """A time lag in the unit that reads best: 0, 850ms, 12.5s, 7m03s, 2h05m; '?' when unknown."""
    if ms is None:
        return "?"
    if ms < 1000:
        return f"{ms}ms" if ms else "0"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    minutes, seconds = divmod(ms // 1000, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "status", help="owners, lease expiry, committed and produced offsets, lag in messages and time, rollbacks, "
        "stored and expired messages, who holds the retention back, Redis memory",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    clitools.env_option(
        parser, "--redis", clitools.ENV_REDIS,
        "the broker's URL, e.g. redis://127.0.0.1:6379/0 (add ?cluster=true for a Redis Cluster)",
    )
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", action="append", help="only this topic (repeatable)")
    parser.add_argument(
        "--member-ttl-ms", type=int, default=DEFAULT_MEMBER_TTL_MS, metavar="MS",
        help=f"a member silent for longer is expired: the proxies' leases.ttl_ms (default {DEFAULT_MEMBER_TTL_MS})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--http", metavar="URL", help="also show each topic's end-to-end latency as this proxy "
                        "measured it (its HTTP API, e.g. http://127.0.0.1:9714; $DDMQ_ADMIN_TOKEN is sent when set)")
    patience.add_timeout(parser)
    parser.set_defaults(func=_status_command)


def format_latency(base: str, topics: list[dict[str, Any]]) -> list[str]:
    """Each topic's end-to-end quantiles from a proxy's group view (``GET /admin/groups/G``)."""
    def figures(row: dict[str, Any], scale: float = 1.0, unit: str = "", digits: int = 1) -> str:
        if not row["count"]:
            return "-"
        return (f"p50 {row['p50'] * scale:.{digits}f}{unit} p99 {row['p99'] * scale:.{digits}f}{unit} "
                f"({row['count']})")

    lines = [f"end to end at {base} (since it started; produce times are the producers' clocks):"]
    for topic in topics:
        latency = topic["end_to_end"]
        lines.append(f"  {topic['topic']}: to first delivery {figures(latency['delivered'], 1000, 'ms', 0)}, "
                     f"to ack {figures(latency['acked'], 1000, 'ms', 0)}, "
                     f"attempts at ack {figures(topic['attempts']['acked'])}")
    return lines


def format_held(topics: list[dict[str, Any]], queues: list[dict[str, Any]]) -> list[str]:
    """A line per topic with keys at their ``key_buffer`` cap on the proxy asked: how many, and the messages
    they left in Redis, per queue (its group view's topics and queue rows)."""
    lines = []
    for topic in topics:
        if not topic["keys_at_cap"]:
            continue
        per_queue = ", ".join(f"#{q['qid']}: {q['held_in_redis']:,}" for q in queues
                              if q["topic"] == topic["topic"] and q.get("held_in_redis"))
        why = "at their key_buffer cap" if topic.get("tenants") is None else "at their key_buffer cap or behind " \
            "their tenant's share"
        lines.append(f"  {topic['topic']}: {topic['keys_at_cap']:,} key(s) {why}, "
                     f"{topic['held_in_redis']:,} message(s) held in Redis to read again ({per_queue})")
    return lines


def format_tenants(topics: list[dict[str, Any]], shown: int = 5) -> list[str]:
    """A line per topic with tenants (``fair_key``) on the proxy asked: the ``shown`` with the most
    messages there, each with its messages in memory, its share of the window and its held keys."""
    lines = []
    for topic in topics:
        tenants = topic.get("tenants")
        if not tenants:
            continue
        listed = "; ".join(
            f"{row['tenant'] or '(none)'}: {row['in_memory']:,} in memory of a share of {row['share']:,}"
            + (f", {row['held_keys']:,} key(s) held in Redis" if row["held_keys"] else "")
            + (f", weight {row['weight']:g}" if row["weight"] != 1 else "")
            for row in tenants[:shown]
        )
        more = f" (and {len(tenants) - shown} more)" if len(tenants) > shown else ""
        lines.append(f"  {topic['topic']}: {listed}{more}")
    return lines


def open_breakers(status: GroupStatus, shown: dict[bytes, bytes], topics: list[str] | None) -> list[dict[str, Any]]:
    """The breakers that hold a topic of the group, as live proxies show them in Redis (each proxy
    judges the queues it serves; an expired member's entries are left out)."""
    found = []
    for field, raw in sorted(shown.items()):
        try:
            proxy, topic = json.loads(field)
            state = json.loads(raw)
        except ValueError:
            continue
        if proxy in status.members and proxy not in status.expired and (not topics or topic in topics):
            found.append({"proxy": proxy, "topic": topic, "state": state.get("state"), "why": state.get("why", "")})
    return found


def describe_breaker(breaker: dict[str, Any]) -> str:
    state = "OPEN" if breaker["state"] == "open" else "HALF-OPEN (probing)"
    return (f"BREAKER {state}: topic {breaker['topic']} on {breaker['proxy']}: {breaker['why']}; it hands out "
            "only probes and counts no attempts until they succeed (docs/failures.md#the-breaker)")


def _status_command(args: argparse.Namespace) -> int:
    status, (now_ms, paused), shown = patience.read_redis(args, lambda client: (
        group_status(client, args.group, args.topic, args.member_ttl_ms), pauses(client, args.group),
        client.hgetall(keys.breakers(args.group))))
    held = open_breakers(status, shown, args.topic)
    pause_rows = [p.as_json() for p in paused]
    notes = [*(describe(p, now_ms) for p in paused), *map(describe_breaker, held)]
    if status.missing_topics:
        raise clitools.CliError(
            f"no topic {', '.join(map(repr, status.missing_topics))} in {redact_url(args.redis)}"
            " (a topic exists once a proxy serving it started or a producer wrote to it)"
        )
    if not status.known:
        raise clitools.CliError(
            f"group {args.group!r} is unknown to {redact_url(args.redis)}: "
            "no proxy has served it and it has no committed offset"
        )
    topics: list[dict[str, Any]] = []
    queues: list[dict[str, Any]] = []
    if args.http:
        client = client_for(args)
        wanted = set(args.topic or ())
        view = client.call("GET", f"/admin/groups/{quote(args.group)}")
        topics = [topic for topic in view["topics"] if not wanted or topic["topic"] in wanted]
        queues = view["queues"]
    if args.json:
        proxy = {
            "end_to_end": {t["topic"]: {"end_to_end": t["end_to_end"], "attempts": t["attempts"]} for t in topics},
            "keys_at_cap": {t["topic"]: {
                "keys": t["keys_at_cap"], "held_in_redis": t["held_in_redis"],
                "per_queue": {str(q["qid"]): q["held_in_redis"] for q in queues
                              if q["topic"] == t["topic"] and q.get("held_in_redis")},
            } for t in topics},
            "tenants": {t["topic"]: t["tenants"] for t in topics if t.get("tenants") is not None},
        } if args.http else {}
        print(json.dumps({**asdict(status), "paused": pause_rows, "breakers": held, **proxy}, indent=2))
    else:
        proxy_lines = []
        if args.http:
            proxy_lines = format_latency(client.base_url, topics)
            at_cap = format_held(topics, queues)
            if at_cap:
                proxy_lines += [f"keys at their key_buffer cap at {client.base_url} (the queues it reads):", *at_cap]
            tenant_lines = format_tenants(topics)
            if tenant_lines:
                proxy_lines += [f"tenants with the most messages at {client.base_url}:", *tenant_lines]
        print("\n".join([*notes, format_status(status), *proxy_lines]))
    return 0
