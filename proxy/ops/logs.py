"""How the proxy's lines look on stderr and stdout: text (the default) or, with ``--log-format json``,
one JSON object a line for a log collector::

    {"time": "2026-12-02T12:20:01.123Z", "level": "INFO", "logger": "ddmq.proxy.cluster.ownership",
     "message": "g/t#3: handed off", "group": "g", "topic": "t", "qid": 3}

Every object has ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and ``message``;
``group``, ``topic`` and ``qid`` where the line is about one: given by the call (``extra``) or read
from the ``<group>/<topic>[#<qid>]:`` the proxy's messages start with; ``exception`` (the traceback)
when one is logged; and what the caller adds under ``fields`` (the start-up ``export`` line). The
messages are the text format's, so what they mask (a Redis URL's password) stays masked. In JSON mode
Python's warnings and an uncaught exception are logged the same way, so no line of the proxy's output
is anything but an object; ``--version`` and ``--help``, answered before anything runs, stay text.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from types import TracebackType
from typing import IO, Any, Final

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure", "json_line"]

#: The choices of ``--log-format``.
LOG_FORMATS: Final = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: ``<group>/<topic>`` or ``<group>/<topic>#<qid>`` followed by a colon, at the start of a message
#: (names are ``A-Z a-z 0-9 _ . -``: ``keys.check_name``).
_WHERE: Final = re.compile(r"^(?P<group>[\w.\-]{1,200})/(?P<topic>[\w.\-]{1,200})(?:#(?P<qid>\d+))?:")


def _utc(created: float) -> str:
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def json_line(level: str, logger: str, message: str, created: float | None = None, *, where: bool = False,
              **fields: Any) -> str:
    """One line of the JSON format (see the module's docstring); with ``where``, the group, topic and
    qid a log message starts with become fields."""
    out: dict[str, Any] = {"time": _utc(time.time() if created is None else created), "level": level,
                           "logger": logger, "message": message}
    found = _WHERE.match(message) if where else None
    if found is not None:
        out["group"], out["topic"] = found["group"], found["topic"]
        if found["qid"] is not None:
            out["qid"] = int(found["qid"])
    out.update((key, value) for key, value in fields.items() if value is not None)
    return json.dumps(out, ensure_ascii=False, default=str)


class JsonFormatter(logging.Formatter):
    """A log record as :func:`json_line`."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {name: getattr(record, name, None) for name in ("group", "topic", "qid")}
        fields.update(getattr(record, "fields", None) or {})
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        return json_line(record.levelname, record.name, record.getMessage(), record.created, where=True, **fields)


def _uncaught(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    logging.getLogger("ddmq.proxy").critical("uncaught exception", exc_info=(kind, error, trace))


def configure(level: str, log_format: str = "text", stream: IO[str] | None = None) -> None:
    """The process's logging: every record at ``level`` and above to ``stream`` (stderr) in ``log_format``."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r} (one of {', '.join(LOG_FORMATS)})")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level))
    if log_format == "json":
        logging.captureWarnings(True)
        sys.excepthook = _uncaught
