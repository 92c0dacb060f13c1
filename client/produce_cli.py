"""``ddmq produce``: JSON lines from stdin into a topic, through :class:`~ddmq.client.producer.Producer`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from typing import IO

from ddmq.protocol import clitools
from ddmq.protocol.producer import MESSAGE_FIELDS, OutgoingMessage, ProduceError, Producer

__all__ = ["add_cli", "produce_lines"]


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
    unknown = set(data) - MESSAGE_FIELDS
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
