"""``ddmq keys``: a group's order keys on one topic, and an operator's hand on one key.

``list`` shows the keys with unfinished messages, the stuck ones (parked, failing) first, with the
count of keys in each state; ``retry``, ``skip``, ``park`` and ``resume`` act on one key through the
proxy's admin API (``POST /admin/groups/{group}/topics/{topic}/keys/{action}``), recording the local
user name as who asked::

    ddmq keys list --group cg_rides --topic rides [--state parked] [--key r42]
    ddmq keys retry --group cg_rides --topic rides --key r42    # deliver the head now, attempts reset
    ddmq keys skip --group cg_rides --topic rides --key r42     # dead-letter the head, move the key on
    ddmq keys park --group cg_rides --topic rides --key r42     # hold the key after its in-flight message
    ddmq keys resume --group cg_rides --topic rides --key r42
    ddmq keys explain --group cg_rides --topic rides --key r42  # why it is stuck, what comes next

``explain`` (``GET .../keys/explain?key=K``) says, per queue where the key has something unfinished or
parked: its state and since when, the head's offset and attempts, the client holding the head and its
ack deadline, the last reason, what the proxy does next and when, and the command that acts on it.
"""

from __future__ import annotations

import argparse
import getpass
import time
from typing import Any, Final

from ddmq.client.cli.admin import client_for, common_options, print_answer, quote, table
from ddmq.protocol import clitools

__all__ = ["ACTIONS", "STATES", "add_cli", "explain_text", "stuck_first"]

#: Key states, the stuck ones first: the order ``list`` shows them in.
STATES: Final = ("parked", "failing", "in_flight", "waiting")
ACTIONS: Final = {
    "retry": "deliver the key's parked or failing head now, its attempts reset",
    "skip": "dead-letter the key's head and move the key on (recording who asked)",
    "park": "hold the key after its in-flight message: nothing more of it is delivered until resume",
    "resume": "let a parked key go on from where it stopped",
}


def stuck_first(keys: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keys ordered parked, failing, in flight, waiting (states unknown to this client last), keeping
    the proxy's order within a state."""
    rank = {state: index for index, state in enumerate(STATES)}
    return sorted(keys, key=lambda key: rank.get(key.get("state") or "", len(STATES)))


def _path(args: argparse.Namespace) -> str:
    return f"/admin/groups/{quote(args.group)}/topics/{quote(args.topic)}/keys"


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name and no USER/LOGNAME (a bare container)
        return None


def _list(args: argparse.Namespace) -> int:
    query = {"state": args.state, "key": args.key, "offset": args.offset or None}
    answer = client_for(args).call("GET", _path(args), query)
    rows = [[key["key"], key["qid"], key["state"].replace("_", " "), key["head_offset"], key["attempts"],
             key.get("waiting", 0), key.get("parked_by") or "-", (key.get("reason") or "").replace("\n", " ")[:60]]
            for key in stuck_first(answer["keys"])]
    header = ["key", "qid", "state", "head offset", "attempts", "waiting", "parked by", "reason"]
    counts = answer.get("counts") or {}
    summary = ", ".join(f"{counts.get(state, 0)} {state.replace('_', ' ')}" for state in STATES)
    more = f"; next page: --offset {answer['next_offset']}" if answer.get("next_offset") is not None else ""
    text = f"{table(header, rows)}\nkeys of {answer['group']}/{answer['topic']}: {summary}{more}"
    print_answer(args, answer, text)
    return 0


def _act(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"key": args.key}
    if args.qid is not None:
        body["qid"] = args.qid
    user = _user()
    if user:
        body["by"] = user
    answer = client_for(args).call("POST", f"{_path(args)}/{args.action}", body=body)
    applied = answer.get("applied") or []
    if not applied:
        print_answer(args, answer, f"{args.action}: key {args.key!r} has nothing to {args.action} on "
                                   f"{args.group}/{args.topic} at this proxy")
        return clitools.FAILURE
    where = ", ".join(f"qid {item['qid']}: {str(item['state']).replace('_', ' ')}" for item in applied)
    print_answer(args, answer, f"{args.action} {args.key!r} on {args.group}/{args.topic}: {where}")
    return 0


def _when(ms: int | None) -> str:
    if ms is None:
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d} UTC"


def explain_text(answer: dict[str, Any]) -> str:
    """The explanation as lines for a terminal, a block per queue."""
    blocks = []
    for entry in answer.get("queues") or []:
        state = str(entry.get("state")).replace("_", " ")
        read_by = entry.get("read_by") or "no proxy"
        since = f" since {_when(entry['since_ms'])}" if entry.get("since_ms") else ""
        lines = [f"key {answer['key']!r} of {answer['group']}/{answer['topic']}, qid {entry['qid']} "
                 f"(read by {read_by}): {state}{since}"]
        if entry.get("head_offset") is not None:
            lines.append(f"  head offset {entry['head_offset']}, attempt {entry.get('attempts')} of "
                         f"{entry.get('max_attempts')}; {entry.get('waiting') or 0} waiting behind it, "
                         f"{entry.get('held_in_redis') or 0} held in Redis")
        client = entry.get("client")
        if client:
            who = f"{client['protocol']} {client['peer']}"
            if client.get("client_id"):
                who += f" ({client['client_id']})"
            lines.append(f"  held by client {who} until {_when(entry.get('deadline_ms'))}")
        if entry.get("parked_by"):
            lines.append(f"  parked by {entry['parked_by']}")
        if entry.get("topic_hold"):
            lines.append(f"  topic held: {entry['topic_hold']}")
        if entry.get("reason"):
            lines.append("  reason: " + str(entry["reason"]).replace("\n", " ")[:200])
        lines.append(f"  next: {entry.get('next')}")
        if entry.get("command"):
            lines.append(f"  act: {entry['command']}")
        blocks.append("\n".join(lines))
    return "\n".join(blocks) or f"key {answer.get('key')!r}: nothing known"


def _explain(args: argparse.Namespace) -> int:
    answer = client_for(args).call("GET", f"{_path(args)}/explain", {"key": args.key, "qid": args.qid})
    print_answer(args, answer, explain_text(answer))
    return 0


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser("keys", help="list a topic's keys by state; retry, skip, park or resume one (HTTP admin API)",
                          description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="keys with unfinished messages, stuck ones (parked, failing) first, with counts per state",
        description="Keys of a group on a topic with unfinished messages: parked (held by the park policy "
                    "or an operator), failing (the head failed at least once), in flight (the head is "
                    "delivered), waiting (backlog only). Stuck keys come first; the last line counts the "
                    "keys in each state. Any proxy of the group answers for all of them: the one at --http "
                    "asks the others, and adds the parked keys of queues nobody reads from Redis.",
    )
    common_options(listing, topic_required=True)
    listing.add_argument("--state", choices=STATES, help="only keys in this state")
    listing.add_argument("--key", help="only this key")
    listing.add_argument("--offset", type=int, default=0, help="skip this many keys (the previous page's next)")
    listing.set_defaults(func=_list)
    explain = actions.add_parser(
        "explain", help="why a key is stuck: its state, head, client, deadline, reason, what comes next",
        description="ddmq keys explain: for each queue where the key has an unfinished or parked message, its "
                    "state and since when, the head's offset and attempts, the client holding the head (its "
                    "address and version or User-Agent) and its ack deadline, the last reason, what the proxy "
                    "does next and when, and the command that acts on the key. A queue another proxy reads "
                    "is named with that proxy: ask it (--http its address).",
    )
    common_options(explain, topic_required=True)
    explain.add_argument("--key", required=True, help="the order key")
    explain.add_argument("--qid", type=int, default=None, help="only this queue")
    explain.set_defaults(func=_explain)
    for name, what in ACTIONS.items():
        action = actions.add_parser(
            name, help=what,
            description=f"ddmq keys {name}: {what}. Any proxy of the group takes it and passes it to the one "
                        "reading the key's queue; a key no proxy knows is an error (status 1).",
        )
        common_options(action, topic_required=True)
        action.add_argument("--key", required=True, help="the order key")
        action.add_argument("--qid", type=int, default=None, help="only on this queue (default: wherever the key is)")
        action.set_defaults(func=_act)
