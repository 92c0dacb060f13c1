"""Redis URLs and connection deadlines, without redis-py: what a config check needs of Redis.

``ddmq-proxy --check`` validates the ``redis:`` URL and the client deadlines; importing redis-py for
that would cost the check a quarter of its time. :mod:`ddmq.protocol.redis.connection` builds clients
from these and re-exports every name.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "DEFAULT_DEADLINES",
    "LONGEST_BLOCK_MS",
    "ClusterUrl",
    "Deadlines",
    "check_url",
    "is_cluster_url",
    "redact_url",
]

#: The longest any command of the project blocks in Redis (``XREAD BLOCK``, ``BLPOP``): a read
#: timeout must exceed it, or an idle blocking read would count as a silent connection.
LONGEST_BLOCK_MS = 1000


@dataclass(frozen=True)
class Deadlines:
    """How long a Redis call may take before its connection counts as dead, and how dead connections
    are found while idle. Every client of the project gets these (the proxy: from its config)."""

    #: A reply (or a write) that takes longer fails the call and closes its connection. At least
    #: :data:`LONGEST_BLOCK_MS` plus a margin, as blocking reads wait that long for nothing.
    timeout_ms: int = 5_000
    connect_timeout_ms: int = 5_000
    #: TCP keepalive: probes after this much silence on an idle connection, 3 of them a third of it apart.
    keepalive_idle_ms: int | None = 10_000
    #: ``PING`` before a command on a connection unused for this long (0: never).
    health_check_interval_ms: int = 10_000

    def options(self) -> dict[str, Any]:
        """redis-py's connection keyword arguments for these deadlines."""
        options: dict[str, Any] = {
            "socket_timeout": self.timeout_ms / 1000,
            "socket_connect_timeout": self.connect_timeout_ms / 1000,
            "health_check_interval": self.health_check_interval_ms / 1000,
        }
        if self.keepalive_idle_ms is not None:
            idle_s = max(1, self.keepalive_idle_ms // 1000)
            options["socket_keepalive"] = True
            options["socket_keepalive_options"] = _keepalive_options(idle_s)
        return options


def _keepalive_options(idle_s: int) -> dict[int, int]:
    """The platform's TCP keepalive knobs that exist here (Linux has all three)."""
    wanted = {"TCP_KEEPIDLE": idle_s, "TCP_KEEPINTVL": max(1, idle_s // 3), "TCP_KEEPCNT": 3}
    return {getattr(socket, name): value for name, value in wanted.items() if hasattr(socket, name)}


#: What a client gets when its caller says nothing of deadlines.
DEFAULT_DEADLINES = Deadlines()

#: A URL's ``user:password@`` part (the password ends at the last ``@`` before the host list).
_CREDENTIALS = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:@/?#]*):(?P<password>[^/?#]*)@")
_SECRET_QUERY = frozenset({"password", "ssl_password"})


def redact_url(url: str) -> str:
    """``url`` as it may be shown: the password (in ``user:password@`` or a ``password=`` query
    parameter) replaced by ``***``, e.g. ``redis://:***@10.0.0.5:6379/0``. Every log line, error
    message and answer that names a Redis URL goes through here."""
    shown = _CREDENTIALS.sub(lambda m: f"{m['head']}:***@", url, count=1)
    if "?" in shown:
        base, _, query = shown.partition("?")
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(name in _SECRET_QUERY for name, _ in pairs):
            shown = base + "?" + "&".join(
                f"{name}=***" if name in _SECRET_QUERY else urlencode({name: value}) for name, value in pairs
            )
    return shown


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", ""})


class ClusterUrl:
    """A cluster URL split into redis-py's single-host URL and the other seeds."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        credentials, _, hosts = parts.netloc.rpartition("@")
        seeds = [seed.strip() for seed in hosts.split(",")]
        if not all(seeds):
            raise ValueError(f"Redis URL {redact_url(url)!r}: empty host in the seed list")
        query = [(name, value) for name, value in parse_qsl(parts.query, keep_blank_values=True) if name != "cluster"]
        netloc = f"{credentials}@{seeds[0]}" if credentials else seeds[0]
        self.first = urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))
        self.others: list[tuple[str, int]] = []
        for seed in seeds[1:]:
            host, _, port = seed.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"Redis URL {redact_url(url)!r}: seed {seed!r} is not host:port")
            self.others.append((host.strip("[]"), int(port)))
        if parts.path.strip("/") not in ("", "0"):
            raise ValueError(f"Redis URL {redact_url(url)!r}: a Redis Cluster has database 0 only")


def is_cluster_url(url: str) -> bool:
    """True when the URL's query says ``cluster=true`` (``1``, ``yes``, ``on`` too); ValueError on nonsense."""
    for name, value in parse_qsl(urlsplit(url).query, keep_blank_values=True):
        if name == "cluster":
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
            raise ValueError(f"Redis URL {redact_url(url)!r}: cluster={value!r} is neither true nor false")
    return False


def check_url(url: str) -> str:
    """``url`` if its cluster part makes sense (seeds as ``host:port``, database 0), else ValueError."""
    if is_cluster_url(url):
        ClusterUrl(url)
    return url
