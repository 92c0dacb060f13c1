"""``ddmq dead-letters``, ``ddmq blocked-keys``, ``ddmq in-flight``: a proxy's admin API from the shell.

They call the proxy's HTTP API (``http.enabled: true`` in its config), at ``--http`` or ``$DDMQ_HTTP``
(e.g. ``http://127.0.0.1:9714``), sending ``Authorization: Bearer $DDMQ_ADMIN_TOKEN`` when that variable
is set (the token is never a flag, so it stays out of shell history and ``ps``). Without a token the
proxy answers loopback clients only. Tables by default, the API's JSON with ``--json``::

    ddmq dead-letters list --http http://127.0.0.1:9714 --group cg_rides --topic rides
    ddmq dead-letters replay --group cg_rides --topic rides --id 1763776220123-0
    ddmq dead-letters replay --group cg_rides --topic rides --key r42   # one key's, in their order
    ddmq dead-letters replay --group cg_rides --topic rides --all --rate 200   # at most 200 a second
    ddmq dead-letters purge --group cg_rides --topic rides --all --dry-run   # what it would delete
    ddmq blocked-keys --group cg_rides [--all] [--offset 20]
    ddmq in-flight --group cg_rides --topic rides --limit 50

In-flight messages and blocked keys live in one proxy's memory: ask each proxy of the group.
``ddmq keys`` (:mod:`ddmq.client.cli.keys`) acts on one key through the same API.
"""

from __future__ import annotations

import argparse
import getpass
import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Final

from ddmq.protocol import clitools

__all__ = ["AdminClient", "add_cli", "client_for", "common_options", "print_answer", "quote", "table"]

DEFAULT_TIMEOUT_S: Final = 10.0
#: How long a paced replay's answer may take: the proxy refuses one that would take over 900 s.
PACED_TIMEOUT_S: Final = 960.0


class AdminClient:
    """A small blocking client of ``/admin/...``; failures raise :class:`clitools.CliError` with the
    proxy's own message."""

    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        parsed = urllib.parse.urlsplit(base_url if "://" in base_url else f"http://{base_url}")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise clitools.CliError(f"--http must be a URL like http://127.0.0.1:9714, got {base_url!r}",
                                    clitools.USAGE_ERROR)
        self.base_url = f"{parsed.scheme}://{parsed.netloc}"
        self._token = token
        self._timeout_s = timeout_s

    def call(self, method: str, path: str, query: dict[str, Any] | None = None,
             body: dict[str, Any] | None = None) -> dict[str, Any]:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as exc:
            raise clitools.CliError(f"{method} {url}: {_error_message(exc)}") from exc
        except (http.client.RemoteDisconnected, ConnectionResetError, http.client.BadStatusLine) as exc:
            raise clitools.CliError(
                f"{self.base_url} closed the connection without an HTTP answer: is it the proxy's Thrift port? "
                "--http takes the address of its HTTP API (http.port, default 9714)"
            ) from exc
        except urllib.error.URLError as exc:
            raise clitools.CliError(
                f"cannot reach {self.base_url}: {exc.reason} (is the proxy's HTTP API on? http.enabled: true)"
            ) from exc
        except (OSError, ValueError) as exc:  # timeouts; a body that is not JSON
            raise clitools.CliError(f"{method} {url}: {exc}") from exc


def _error_message(exc: urllib.error.HTTPError) -> str:
    """The proxy's ``{"code", "message"}`` error body, or the bare HTTP status."""
    try:
        error = json.loads(exc.read())
        return f"{error['message']} (code {error['code']}, HTTP {exc.code})"
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {exc.code} {exc.reason}"


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _letters_path(args: argparse.Namespace) -> str:
    return f"/admin/groups/{_quote(args.group)}/topics/{_quote(args.topic)}/dead-letters"


def _client(args: argparse.Namespace, timeout_s: float = DEFAULT_TIMEOUT_S) -> AdminClient:
    return AdminClient(args.http, os.environ.get(clitools.ENV_ADMIN_TOKEN) or None, timeout_s)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def _short(text: str | None, most: int = 60) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= most else text[: most - 1] + "…"


def _print(args: argparse.Namespace, answer: dict[str, Any], table: str) -> None:
    print(json.dumps(answer, indent=2, ensure_ascii=False) if args.json else table)


def _letters_list(args: argparse.Namespace) -> int:
    answer = _client(args).call("GET", _letters_path(args), {"limit": args.limit, "after": args.after})
    rows = [[e["id"], e["qid"], e["offset"], e["key"], e["attempts"], _short(e["error"], 40),
             _short(e["value_text"] if e["value_text"] is not None else "(binary)", 40)] for e in answer["entries"]]
    table = _table(["id", "qid", "offset", "key", "attempts", "error", "value"], rows)
    # A page stops early when its answer would pass the proxy's cap: `more` says so; an answer without
    # `more` is paged by its count.
    paged = answer.get("more", answer["total"] > len(rows)) and answer["next_after"]
    more = f"; next page: --after {answer['next_after']}" if paged else ""
    _print(args, answer, f"{table}\n{len(rows)} of {answer['total']} dead letters of "
                         f"{answer['group']}/{answer['topic']}{more}")
    return 0


def _selection(args: argparse.Namespace) -> dict[str, Any]:
    chosen: dict[str, Any]
    if getattr(args, "key", None) is not None:
        chosen = {"key": args.key}
    else:
        chosen = {"all": True} if args.all else {"ids": args.ids}
    if getattr(args, "rate", None) is not None:
        chosen["rate"] = args.rate
    if args.dry_run:
        return {**chosen, "dry_run": True}
    try:
        return {**chosen, "by": getpass.getuser()}
    except (OSError, KeyError):  # no login name and no USER/LOGNAME (a bare container)
        return chosen


def _rate(text: str) -> int:
    if not (text.isdigit() and 1 <= int(text) <= 100_000):
        raise argparse.ArgumentTypeError(f"a whole number of messages a second, 1..100000, got {text!r}")
    return int(text)


def _letters_replay(args: argparse.Namespace) -> int:
    client = _client(args, PACED_TIMEOUT_S if args.rate is not None else DEFAULT_TIMEOUT_S)
    answer = client.call("POST", _letters_path(args) + "/replay", body=_selection(args))
    lines = []
    if answer.get("dry_run"):
        lines.append(f"dry run: would replay {answer['would_replay']} dead letter(s) of {answer['keys']} key(s) "
                     f"into {args.topic}, lifting the mark of {answer['lifted']} key(s) first; nothing changed")
    else:
        lifted = f" ({answer['lifted']} key(s) resumed first)" if answer.get("lifted") else ""
        lines.append(f"replayed {answer['replayed']} dead letter(s) into {args.topic}{lifted}")
    for refused in answer.get("refused", ()):
        lines.append(f"refused {refused['dead_letters']} dead letter(s) of key {refused['key']}: {refused['reason']}")
    more = answer.get("refused_keys", 0) - len(answer.get("refused", ()))
    if more > 0:
        lines.append(f"... and {more} more refused key(s) (--json lists the first ones)")
    if answer["missing"]:
        lines.append(f"not found: {', '.join(answer['missing'])}")
    _print(args, answer, "\n".join(lines))
    return 1 if answer["missing"] or answer.get("refused_keys") else 0


def _letters_purge(args: argparse.Namespace) -> int:
    answer = _client(args).call("POST", _letters_path(args) + "/purge", body=_selection(args))
    if answer.get("dry_run"):
        text = (f"dry run: would purge {answer['would_purge']} dead letter(s) of {answer['keys']} key(s) of "
                f"{args.group}/{args.topic}; nothing changed")
    else:
        text = f"purged {answer['purged']} dead letter(s) of {args.group}/{args.topic}"
    if answer.get("missing"):
        text += f"\nnot found: {', '.join(answer['missing'])}"
    _print(args, answer, text)
    return 1 if answer.get("missing") else 0


def _job_row(job: dict[str, Any]) -> list[Any]:
    return [job["topic"], job["qid"], job["offset"], job["order_key"] or "-", job["state"], job["attempts"],
            _short(job["last_error"], 40)]


_JOB_HEADER: Final = ["topic", "qid", "offset", "order key", "state", "attempts", "last error"]


def _in_flight(args: argparse.Namespace) -> int:
    path = f"/admin/groups/{_quote(args.group)}/in-flight"
    client = _client(args)
    answer = client.call("GET", path, {"topic": args.topic, "limit": args.limit})
    rows = [_job_row(job) for job in answer["jobs"]]
    _print(args, answer, f"{_table(_JOB_HEADER, rows)}\n{len(rows)} of {answer['total']} unfinished messages "
                         f"of {answer['group']} on {client.base_url}")
    return 0


_KEY_STATE_TEXT: Final = {"failing": "failing", "in_flight": "in flight", "waiting": "waiting"}


def _blocked_keys(args: argparse.Namespace) -> int:
    path = f"/admin/groups/{_quote(args.group)}/blocked-keys"
    query = {"topic": args.topic, "limit": args.limit, "offset": args.offset, "state": None if args.all else "failing"}
    answer = _client(args).call("GET", path, query)
    rows = []
    for key in answer["keys"]:
        _, qid, offset, _, _, attempts, error = _job_row(key["head"])
        state = key.get("state")  # a proxy older than the field has no state
        rows.append([key["topic"], key["order_key"], _KEY_STATE_TEXT.get(state, state or "-"), key["chain_length"],
                     key["head_age_ms"], qid, offset, attempts, error])
    header = ["topic", "order key", "state", "messages", "head age ms", "qid", "head offset", "attempts", "last error"]
    what = "keys with unfinished messages" if args.all else "stuck keys (head failing)"
    more = f"; next page: --offset {answer['next_offset']}" if answer.get("next_offset") is not None else ""
    summary = f"{len(rows)} of {answer['total']} {what} of {answer['group']}{more}"
    if not args.all and answer["total"] == 0:
        summary += " (--all lists the keys that merely have a backlog)"
    _print(args, answer, f"{_table(header, rows)}\n{summary}")
    return 0


def _common(parser: argparse.ArgumentParser, topic_required: bool) -> None:
    clitools.env_option(parser, "--http", clitools.ENV_HTTP, "the proxy's HTTP API, e.g. http://127.0.0.1:9714")
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=topic_required, help=None if topic_required else "only this topic")
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    letters = sub.add_parser("dead-letters", help="list, replay or purge a group's dead letters (HTTP admin API)",
                             description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = letters.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="show dead letters, oldest first")
    _common(listing, topic_required=True)
    listing.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    listing.add_argument("--after", help="start after this dead-letter id (the previous page's last)")
    listing.set_defaults(func=_letters_list)
    for name, func, what in (("replay", _letters_replay, "produce them into the topic again and remove them"),
                             ("purge", _letters_purge, "remove them for good")):
        action = actions.add_parser(name, help=what)
        _common(action, topic_required=True)
        chosen = action.add_mutually_exclusive_group(required=True)
        chosen.add_argument("--id", dest="ids", action="append", help="a dead-letter id (repeatable)")
        chosen.add_argument("--all", action="store_true", help="every dead letter of the group and topic")
        if name == "replay":
            chosen.add_argument("--key", help="every dead letter of this key, put back in their original order")
            action.add_argument("--rate", type=_rate, metavar="N",
                                help="at most N messages a second (1..100000; the proxy paces it, and refuses a "
                                     "replay that would take over 15 minutes; default: as fast as it goes)")
        action.add_argument("--dry-run", action="store_true", help=f"say what the {name} would touch, touch nothing")
        action.set_defaults(func=func)

    for name, func, what, default, details in (
        ("in-flight", _in_flight, "messages a proxy holds unfinished: in flight, waiting, retrying", 100,
         "Each row is a message the proxy has read and not finished: delivered and awaiting its ack (in\n"
         "flight, with its deadline), ready behind its key's head (waiting), or failed and due again later\n"
         "(retrying, with its attempt count and last error)."),
        ("blocked-keys", _blocked_keys, "order keys stuck behind a failing head message, oldest first", 20,
         "Each row is an order key with unfinished messages: its state, how many messages its chain\n"
         "holds (head included), how long ago its head was produced, and the head's offset, attempts and\n"
         "last error. A key is failing (its head failed or timed out at least once: stuck), in flight (the\n"
         "head is delivered and awaits its answer) or waiting (the head is not delivered yet: backlog).\n"
         "By default only the failing keys are listed; --all lists every key. The last line reads\n"
         "'N of TOTAL'; --offset pages through the rest."),
    ):
        description = (
            f"ddmq {name}: {what}.\n\n{details}\n\n"
            "The answer comes from one proxy's memory (its HTTP admin API at --http or $DDMQ_HTTP, with\n"
            "http.enabled: true): ask each proxy of the group. $DDMQ_ADMIN_TOKEN, when set, is sent as the\n"
            "bearer token; without one the proxy answers loopback clients only."
        )
        parser = sub.add_parser(name, help=f"{what} (HTTP admin API)", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
        _common(parser, topic_required=False)
        parser.add_argument("--limit", type=int, default=default, help=f"at most this many (default {default})")
        if name == "blocked-keys":
            parser.add_argument("--offset", type=int, default=0, help="skip this many keys (the previous page's)")
            parser.add_argument("--all", action="store_true",
                                help="every key with unfinished messages, not only the failing ones")
        parser.set_defaults(func=func)


# The parts `ddmq keys` (keys_cli) shares with these commands: one way to connect, print and quote.
client_for = _client
common_options = _common
print_answer = _print
table = _table
quote = _quote
