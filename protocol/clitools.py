"""What every ``ddmq`` and ``ddmq-proxy`` command shares: one error style, environment defaults for
the common flags, ``--version``, and a quiet end when stdout is a pipe whose reader went away.

Error style: ``<prog>: <message>`` on stderr (``ddmq status: group 'x' is unknown ...``); exit status 2
for usage errors (bad or missing flags), 1 for failures, 130 after Ctrl-C. A command reports a failure by
raising :class:`CliError`; :func:`run_command` prints it.

A closed stdout (``ddmq status --json | head -1``) ends the command with status 1 and no traceback, as
the Python documentation's note on SIGPIPE recommends: stdout is pointed at ``/dev/null`` so that the
interpreter's final flush has somewhere to go.
"""

from __future__ import annotations

import argparse
import os
import re
import select
import sys
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any, Final, NoReturn

from ddmq.protocol.errors import DdmqError

__all__ = [
    "EMBEDDED_REDIS_URL_FILE",
    "ENV_ADMIN_TOKEN",
    "ENV_HTTP",
    "ENV_REDIS",
    "ENV_SERVERS",
    "FAILURE",
    "INTERRUPTED",
    "USAGE_ERROR",
    "CliError",
    "Parser",
    "add_version",
    "detach_stdout",
    "embedded_redis_url",
    "env_option",
    "plain",
    "run_command",
    "stdout_closed",
    "table",
    "utc_time",
    "version",
]

ENV_REDIS: Final = "DDMQ_REDIS"
ENV_SERVERS: Final = "DDMQ_SERVERS"
ENV_HTTP: Final = "DDMQ_HTTP"
ENV_ADMIN_TOKEN: Final = "DDMQ_ADMIN_TOKEN"

USAGE_ERROR: Final = 2
FAILURE: Final = 1
INTERRUPTED: Final = 130


class CliError(DdmqError):
    """A command failed: ``message`` is printed as ``<prog>: <message>`` and the exit status is ``status``.
    Not retriable unless its raiser says so: a command reports its failure to whoever ran it."""

    retriable = False

    def __init__(self, message: str, status: int = FAILURE, retriable: bool | None = None) -> None:
        super().__init__(message)
        self.status = status
        if retriable is not None:
            self.retriable = retriable


#: reST markup of the docstrings that serve as help texts: roles (``:class:`X` ``), literals and
#: references, a paragraph ending in ``::`` (a literal block follows).
_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``|`([^`]+)`_?")
_BLOCK = re.compile(r"::$", re.MULTILINE)


def plain(text: str) -> str:
    """A docstring as a terminal shows it: reST markup removed, the words kept."""
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(lambda m: m.group(1) or m.group(2), text)
    return _BLOCK.sub(":", text)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors read ``<prog>: <message>`` (exit 2), whose help is plain
    text, whose missing-flag errors name the environment variable that would have supplied the flag,
    and whose commands remember their own ``prog`` (``ddmq offsets reset``) for :func:`run_command`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: flag -> the environment variable it defaults to (see :func:`env_option`)
        self.env_names: dict[str, str] = {}

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required:"):
            for flag, env in self.env_names.items():
                message = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", f"{flag} (or set ${env})", message)
        self.exit(USAGE_ERROR, f"{self.prog}: {message} (see '{self.prog} --help')\n")

    def format_help(self) -> str:
        return plain(super().format_help())

    def set_defaults(self, **kwargs: Any) -> None:
        if "func" in kwargs:
            kwargs.setdefault("prog", self.prog)
        super().set_defaults(**kwargs)


def version() -> str:
    try:
        return metadata.version("ddmq-proxy")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")


#: Where a proxy with ``redis: embedded`` and the default ``embedded_redis.data_dir`` writes its Redis
#: URL while it runs (tests/client/test_cli_basics.py keeps this in step with the proxy's side).
EMBEDDED_REDIS_URL_FILE: Final = os.path.join("ddmq-data", "redis.url")


def embedded_redis_url() -> str | None:
    """The URL of the embedded Redis of a proxy running in the current directory, if there is one."""
    try:
        with open(EMBEDDED_REDIS_URL_FILE, encoding="utf-8") as file:
            return file.read().strip() or None
    except OSError:
        return None


def env_option(
    parser: argparse.ArgumentParser, flag: str, env: str, help: str, *aliases: str, **kwargs: Any
) -> None:
    """``flag`` (and its ``aliases``) defaults to the environment variable ``env``; it is required when
    that is unset or empty. ``--redis`` falls back to the embedded Redis of a proxy started in the
    current directory (``ddmq-data/redis.url``), so the README's walkthrough needs no export."""
    default = os.environ.get(env) or None
    if default is None and env == ENV_REDIS:
        default = embedded_redis_url()
        help += f" (default: ${env}, else the URL in ./{EMBEDDED_REDIS_URL_FILE} of a proxy running here)"
    else:
        help += f" (default: ${env})"
    if isinstance(parser, Parser):
        parser.env_names[flag] = env
    parser.add_argument(
        flag, *aliases, default=default, required=default is None, help=help, **kwargs
    )


def table(header: list[str], rows: list[list[Any]]) -> str:
    """Left-aligned columns two spaces apart, the header first."""
    cells = [header, *([str(cell) for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def utc_time(ms: int | None) -> str:
    """A time in ms since the epoch as the CLIs print it: ISO 8601 in UTC, to the second; '-' for none."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def stdout_closed() -> bool:
    """True when stdout is a pipe or socket whose reading end has gone, found without writing to it
    (a consumer that has nothing to print would otherwise never notice)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are reported whatever the mask
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def detach_stdout() -> None:
    """Point stdout at /dev/null, so that nothing more is written to a closed pipe (or raises)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def run_command(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a parsed command with the shared error handling; returns the exit status."""
    prog = getattr(args, "prog", "ddmq")
    try:
        return func(args)
    except CliError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return exc.status
    except BrokenPipeError:
        detach_stdout()
        return FAILURE
    except KeyboardInterrupt:
        return INTERRUPTED
