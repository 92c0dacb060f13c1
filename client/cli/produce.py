"""``ddmq produce``: JSON lines from stdin into a topic, through :class:`~ddmq.client.Producer`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Iterable
from typing import IO

from ddmq.client.cli import patience
from ddmq.protocol import clitools
from ddmq.protocol.produce import calls, tracing
from ddmq.protocol.produce.delivery import DEFAULT_DELIVERY_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS
from ddmq.protocol.produce.producer import (
    DEFAULT_DEDUP_WINDOW_S,
    MESSAGE_FIELDS,
    MessageTooLargeError,
    OutgoingMessage,
    ProduceError,
    Producer,
)
from ddmq.protocol.redis.connection import redact_url

__all__ = ["add_cli", "produce_lines"]


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``ddmq produce``: JSON lines from stdin into a topic."""
    parser = sub.add_parser(
        "produce",
        help="send JSON lines from stdin to a topic",
        description=(
            'Reads one JSON object per line from stdin: {"value": ..., "key": ..., "tag": ..., '
            '"properties": {...}, "qid": ..., "dedup_id": ...}; only "value" is required. A string value is '
            "sent as is, any other JSON value as its compact JSON text. Bad lines are reported and skipped. "
            "Redis failures (a failover, a restart) are retried until --delivery-timeout-ms; no message is "
            "written twice. Progress goes to stderr when it is a terminal; a summary line ends the run. "
            "A topic that does not exist yet (no proxy serving it has started, nothing created it) is "
            "refused, so that a typo does not make a new topic; --create creates it."
        ),
    )
    clitools.env_option(
        parser, "--redis", clitools.ENV_REDIS, "redis:// URL of the broker (add ?cluster=true for a Redis Cluster)"
    )
    parser.add_argument("--topic", required=True)
    parser.add_argument(
        "--queues", type=int, default=None,
        help="number of queues: creates the topic with it (with --create), or checks it (default: 8 for a new topic)",
    )
    parser.add_argument(
        "--create", action="store_true",
        help="create the topic if it does not exist (without it, an unknown topic is refused)",
    )
    parser.add_argument("--batch", type=int, default=100, help="messages per round trip (default 100)")
    parser.add_argument(
        "--delivery-timeout-ms", type=int, default=DEFAULT_DELIVERY_TIMEOUT_MS,
        help=f"how long one batch may keep retrying Redis failures (default {DEFAULT_DELIVERY_TIMEOUT_MS})",
    )
    parser.add_argument(
        "--max-message-bytes", type=int, default=None,
        help="refuse (report and skip) lines whose message is larger than this (default: no limit)",
    )
    parser.add_argument(
        "--dedup-window-s", type=float, default=DEFAULT_DEDUP_WINDOW_S,
        help=f"how long a line's dedup_id is remembered (default {DEFAULT_DEDUP_WINDOW_S})",
    )
    parser.set_defaults(func=_produce_command)


def _produce_command(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise clitools.CliError("--batch must be at least 1", clitools.USAGE_ERROR)
    if args.delivery_timeout_ms < 0:
        raise clitools.CliError("--delivery-timeout-ms must not be negative", clitools.USAGE_ERROR)
    if args.max_message_bytes is not None and args.max_message_bytes < 1:
        raise clitools.CliError("--max-message-bytes must be at least 1", clitools.USAGE_ERROR)
    if not args.dedup_window_s > 0:
        raise clitools.CliError("--dedup-window-s must be positive", clitools.USAGE_ERROR)
    waiting = _SayWaiting(args.delivery_timeout_ms)
    retries = logging.getLogger(calls.__name__)
    retries.addHandler(waiting)
    level, propagate = retries.level, retries.propagate
    if not retries.isEnabledFor(logging.DEBUG):  # not -v: the retries reach this handler and no other
        retries.setLevel(logging.DEBUG)
        retries.propagate = False
    # The client is built here, not by the producer, so that it retries nothing inside redis-py (see
    # patience.client): each failure is retried by the producer, whose first retry is said on stderr.
    seconds = DEFAULT_REQUEST_TIMEOUT_MS / 1000
    try:
        client = patience.connect(args.redis, args.delivery_timeout_ms / 1000, waiting.say,
                                  socket_timeout=seconds, socket_connect_timeout=seconds)
        with client, Producer(
            client, delivery_timeout_ms=args.delivery_timeout_ms, max_message_bytes=args.max_message_bytes,
            dedup_window_s=args.dedup_window_s,
        ) as producer:
            if not args.create:
                _check_topic_exists(producer, args.redis, args.topic)
            if args.queues is not None:
                producer.ensure_topic(args.topic, args.queues)
            with tracing.from_environment():  # TRACEPARENT: the sends join the caller's trace
                return produce_lines(producer, args.topic, sys.stdin.buffer, batch=args.batch, err=sys.stderr)
    except (ProduceError, ValueError) as exc:
        raise clitools.CliError(str(exc)) from exc
    finally:
        retries.removeHandler(waiting)
        retries.setLevel(level)
        retries.propagate = propagate


class _SayWaiting(logging.Handler):
    """Says on stderr, once, that Redis failed and the command keeps retrying (the producer logs each
    retry at DEBUG): a command that waits through a failover says why it waits."""

    def __init__(self, timeout_ms: int) -> None:
        super().__init__(logging.DEBUG)
        self.timeout_ms, self.said = timeout_ms, False

    def emit(self, record: logging.LogRecord) -> None:
        if not record.msg.startswith("producing to %r: retry"):
            return
        self.say(record.args[-1] if isinstance(record.args, tuple) and record.args else "?")

    def say(self, error: object) -> None:
        if self.said:
            return
        self.said = True
        print(f"ddmq produce: redis failed ({error}); retrying for up to {self.timeout_ms / 1000:g}s "
              "(--delivery-timeout-ms)", file=sys.stderr, flush=True)


def _check_topic_exists(producer: Producer, url: str, topic: str) -> None:
    """Refuse a topic Redis has no metadata for, naming the ones it has. Asked through the producer, so
    a failover under way is ridden out as the sends that follow would be (up to the delivery timeout)."""
    queues, known = producer.find_topic(topic)
    if queues is not None:
        return
    listed = ", ".join(known) if known else "none"
    raise clitools.CliError(
        f"no topic {topic!r} in {redact_url(url)} (existing topics: {listed}); "
        "check the name, or pass --create to create it"
    )


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
    key, tag, props, qid, dedup_id = (data.get(name) for name in ("key", "tag", "properties", "qid", "dedup_id"))
    for name, text in (("key", key), ("tag", tag), ("dedup_id", dedup_id)):
        if text is not None and not isinstance(text, str):
            raise ValueError(f"'{name}' must be a string")
    if props is not None and not (
        isinstance(props, dict) and all(isinstance(v, str) for v in props.values())
    ):
        raise ValueError("'properties' must be an object of strings")
    if qid is not None and (isinstance(qid, bool) or not isinstance(qid, int) or not 0 <= qid < queues):
        raise ValueError(f"'qid' must be an integer in 0..{queues - 1}")
    return OutgoingMessage(value, key, tag, props, qid, dedup_id)


class _Progress:
    """A line on a terminal that shows how far a long input has come, redrawn at most once a second."""

    def __init__(self, err: IO[str], topic: str) -> None:
        self.err, self.topic = err, topic
        self.shown = False
        self.next_at = time.monotonic() + 1.0
        try:
            self.live = err.isatty()
        except (AttributeError, ValueError):
            self.live = False

    def update(self, sent: int, bad: int, retries: int) -> None:
        if not self.live or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + 1.0
        self.err.write(f"\rsent {sent} message(s) to {self.topic!r}, {retries} retries, {bad} bad line(s) ...")
        self.err.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.err.write("\r\033[K")


def produce_lines(
    producer: Producer, topic: str, lines: Iterable[bytes], *, batch: int = 100, err: IO[str]
) -> int:
    """Send JSON lines in batches; report bad lines (by number) on ``err`` and skip them.

    Ends with one summary line on ``err``: messages, queues written to, retries, seconds, bad lines.
    Returns the exit status: 0 when every line was sent, 1 when some were bad. Raises
    :class:`ProduceError` when Redis keeps failing past the producer's deadline (what was sent before
    stays sent; the error says which messages of the failed batch were written).
    """
    started = time.monotonic()
    retries_before = producer.retries
    queues = producer.queue_count(topic)
    progress = _Progress(err, topic)
    pending: list[tuple[int, OutgoingMessage]] = []
    used: set[int] = set()
    sent = bad = 0

    def flush() -> int:
        # a message over max_message_bytes is a bad line: the rest of its batch still goes
        nonlocal bad
        good = []
        for lineno, message in pending:
            try:
                producer.check_message(message)
            except (MessageTooLargeError, ValueError, TypeError) as exc:
                bad += 1
                err.write(f"line {lineno}: {exc}; skipped\n")
                continue
            good.append(message)
        pending.clear()
        results = producer.send_batch(topic, good)
        used.update(result.qid for result in results)
        return len(results)

    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            pending.append((lineno, _line_message(raw, queues)))
        except ValueError as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            bad += 1
            err.write(f"line {lineno}: {exc}; skipped\n")
            continue
        if len(pending) >= batch:
            sent += flush()
            progress.update(sent, bad, producer.retries - retries_before)
    if pending:
        sent += flush()
    progress.done()
    retries = producer.retries - retries_before
    err.write(
        f"sent {sent} message(s) to {topic!r} over {len(used)} queue(s) in {time.monotonic() - started:.1f}s, "
        f"{retries} retr{'y' if retries == 1 else 'ies'}, {bad} bad line(s)\n"
    )
    return 0 if bad == 0 else 1
