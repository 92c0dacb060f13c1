"""``ddmq consume``: pull a group's messages through the proxies, print each as a JSON line, ack it
(or fail it with ``--fail-reason``).

The command is a :class:`~ddmq.client.consumer.PullConsumer` whose processor prints: what it does not
print (past ``--count``, or after the reader of a pipe went away, or at Ctrl-C) it gives back
(releases: delivered again at once, no attempt counted), never fails.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from ddmq.client.consumer import ConsumedMessage, ConsumerStats, NotProcessed, PullConsumer, Retry
from ddmq.client.keepalive import DEFAULT_GROUP_TIMEOUT_MS
from ddmq.client.thrift_client import ProxyClientError
from ddmq.protocol import clitools

__all__ = ["add_cli", "message_json"]

# The consumers' logger, so that `-v` shows the command's summary next to what its pullers log.
log = logging.getLogger("ddmq.client.consumer")


def add_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``ddmq consume``: print messages as JSON lines and ack them."""
    parser = sub.add_parser(
        "consume",
        help="pull messages from proxies and print them as JSON lines",
        description=(
            "Pull a consumer group's messages from one or more proxies, print each as a JSON line "
            "(value as text, or base64 under value_b64 when it is not UTF-8) and ack it (with --fail-reason: "
            "fail it, with that reason). Messages pulled but not printed (beyond --count, after the reader "
            "of a pipe went away, at Ctrl-C) are released: never acked nor failed, the proxy delivers them "
            "again at once and counts no attempt, so `ddmq consume | head -1` run again and again wears "
            "nothing out. "
            "An error that retrying cannot cure (unknown group or topic, an HTTP port) ends the command "
            "with status 1; a closed pipe ends it with status 1 too, quietly. "
            "Each line carries topic, qid and offset (integers), key, tag, properties, produce_ms (the "
            "produce time in ms since the epoch, null when unknown) and value. "
            "--timeout is an idle timeout: the command ends once that many seconds pass with no message "
            "printed (from the start, or since the last message). It ends with status 0 when it printed "
            "at least one message and --count was not given, else with status 1 and a message saying "
            "whether any proxy answered at all."
        ),
    )
    clitools.env_option(
        parser, "--servers", clitools.ENV_SERVERS, "proxy address(es): host:port[,host:port...]", "--server"
    )
    parser.add_argument("--group", required=True, help="consumer group")
    parser.add_argument("--topic", default=None, help="only this topic (default: every topic of the group)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many messages")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="puller threads in all, rounded up to the same number per server, at least one each (default 1)",
    )
    parser.add_argument("--batch-size", type=int, default=32, help="max messages per pull (default 32)")
    parser.add_argument("--linger-ms", type=int, default=1000, help="long-poll wait per pull (default 1000)")
    parser.add_argument(
        "--max-per-key",
        type=int,
        default=1,
        help="ordered runs: up to this many successive messages of one key per pull, printed in order (default 1)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, metavar="SECONDS",
        help="give up after SECONDS without a message (idle timeout; default: wait for ever)",
    )
    parser.add_argument(
        "--json-values", action="store_true",
        help="print a value that is valid JSON as JSON (an object, a number...) instead of as a string",
    )
    _add_failure_options(parser)
    parser.set_defaults(func=_consume_command)


def _add_failure_options(parser: argparse.ArgumentParser) -> None:
    """``--fail-reason``, ``--retry-after-ms`` and ``--group-timeout-ms``: what the command tells the
    proxy about the messages it prints."""
    parser.add_argument(
        "--fail-reason", default=None, metavar="TEXT",
        help="fail each printed message instead of acking it, with TEXT as the reason the proxy keeps "
             "(shown in dead letters, `ddmq keys list` and the console); it is retried, and past max_retry "
             "the group's on_exhausted policy applies",
    )
    parser.add_argument(
        "--retry-after-ms", type=int, default=None, metavar="MS",
        help="with --fail-reason: ask for the next delivery after MS milliseconds instead of the group's "
             "retry_intervals_ms (capped by the proxy)",
    )
    parser.add_argument(
        "--group-timeout-ms", type=int, default=DEFAULT_GROUP_TIMEOUT_MS, metavar="MS",
        help="the group's timeout_ms: messages held (say, behind a slow reader of stdout) for half of it "
             f"are extended so they are not redelivered meanwhile (default {DEFAULT_GROUP_TIMEOUT_MS}, the "
             "proxy's default)",
    )


def message_json(message: ConsumedMessage, json_values: bool = False) -> str:
    """One output line of ``ddmq consume``. The qid is an integer as in every other JSON answer (the
    wire carries it as a string); ``json_values`` embeds a value that parses as JSON as that JSON."""
    record: dict[str, Any] = {
        "topic": message.topic,
        "qid": int(message.qid) if message.qid.isdigit() else message.qid,
        "offset": message.offset,
        "key": message.key,
        "tag": message.tag,
        "properties": message.properties,
        "produce_ms": message.produce_ms or None,
    }
    try:
        text = message.value.decode("utf-8")
    except UnicodeDecodeError:
        record["value_b64"] = base64.b64encode(message.value).decode("ascii")
        return json.dumps(record, ensure_ascii=False)
    record["value"] = text
    if json_values:
        try:
            record["value"] = json.loads(text)
        except ValueError:
            pass  # not JSON (or JSON with NaN-like words json.loads accepts but strict JSON does not)
    return json.dumps(record, ensure_ascii=False)


class _Printer:
    """The CLI's processor: prints and acks (or fails, given a ``fail``) up to ``limit`` messages, then
    stops the consumer. A message it does not print (past the limit, or stdout closed) raises
    :class:`NotProcessed`: released, never failed."""

    def __init__(self, limit: int | None, json_values: bool = False, fail: Retry | None = None) -> None:
        self._limit = limit
        self._json_values = json_values
        self._fail = fail
        self.last_printed = time.monotonic()  # the start counts as the last message, for --timeout
        self._lock = threading.RLock()  # close_pipe() runs under it from __call__, or alone from the CLI
        self.printed = 0
        self.pipe_closed = False
        self.on_done: Callable[[], None] = lambda: None

    def __call__(self, message: ConsumedMessage) -> bool:
        with self._lock:
            if self.pipe_closed or (self._limit is not None and self.printed >= self._limit):
                raise NotProcessed
            try:
                sys.stdout.write(message_json(message, self._json_values) + "\n")
                sys.stdout.flush()
            except BrokenPipeError:
                self.close_pipe()
                raise NotProcessed from None
            self.printed += 1
            self.last_printed = time.monotonic()
            if self._limit is not None and self.printed >= self._limit:
                self.on_done()
            if self._fail is not None:
                raise Retry(self._fail.after_ms, self._fail.reason)
            return True

    def close_pipe(self) -> None:
        with self._lock:
            if self.pipe_closed:
                return
            self.pipe_closed = True
            clitools.detach_stdout()
        self.on_done()


def _consume_command(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise clitools.CliError("--count must be positive", clitools.USAGE_ERROR)
    if args.timeout is not None and not args.timeout > 0:
        raise clitools.CliError("--timeout must be positive", clitools.USAGE_ERROR)
    if args.retry_after_ms is not None and (args.fail_reason is None or args.retry_after_ms < 0):
        raise clitools.CliError("--retry-after-ms needs --fail-reason and must not be negative",
                                clitools.USAGE_ERROR)
    if args.group_timeout_ms < 1:
        raise clitools.CliError("--group-timeout-ms must be positive", clitools.USAGE_ERROR)
    batch_size = args.batch_size if args.count is None else min(args.batch_size, args.count)
    fail = None if args.fail_reason is None else Retry(args.retry_after_ms, args.fail_reason)
    printer = _Printer(args.count, args.json_values, fail)
    try:
        consumer = PullConsumer(
            args.servers,
            args.group,
            printer,
            topic=args.topic,
            threads=args.threads,
            batch_size=batch_size,
            linger_ms=args.linger_ms,
            on_error=lambda exc: None,  # the command reports it once, raised from wait() below
            max_per_key=args.max_per_key,
            group_timeout_ms=args.group_timeout_ms,
        )
    except ValueError as exc:
        raise clitools.CliError(str(exc), clitools.USAGE_ERROR) from exc
    printer.on_done = consumer.stop
    timed_out = False
    try:
        with consumer:
            while not consumer.wait(0.2):
                if clitools.stdout_closed():
                    printer.close_pipe()
                if args.timeout is not None and time.monotonic() - printer.last_printed >= args.timeout:
                    timed_out = True
                    consumer.stop()
    except ProxyClientError as exc:
        raise clitools.CliError(str(exc)) from exc
    stats = consumer.stats
    log.info("consumed %d messages (%d pulled, %d errors)", printer.printed, stats.pulled, stats.errors)
    if printer.pipe_closed:
        return clitools.FAILURE
    if timed_out and (printer.printed == 0 or args.count is not None):
        raise clitools.CliError(_timeout_message(args, printer.printed, stats, consumer.answered))
    return 0


def _timeout_message(args: argparse.Namespace, printed: int, stats: ConsumerStats, answered: int) -> str:
    if answered == 0:
        return (f"no proxy answered within {args.timeout:g} s ({stats.errors} failed pull(s) to {args.servers}; "
                "is the proxy running, and is that its Thrift port?)")
    if printed == 0:
        return f"no message within {args.timeout:g} s (the proxies answered, but had nothing for group {args.group!r})"
    return f"{printed} of --count {args.count} message(s) within {args.timeout:g} s of each other, then none"
