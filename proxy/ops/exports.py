"""The shell lines a proxy prints on stderr when it is ready, so that the ``ddmq`` commands of the same
user's shell reach it without copying addresses from its config or its ``ddmq-data/redis.url``::

    export DDMQ_REDIS=redis://127.0.0.1:38757/0 DDMQ_SERVERS=127.0.0.1:9713 DDMQ_HTTP=http://127.0.0.1:9714

A Redis URL that carries a password is never printed (nor logged): the lines then leave
``DDMQ_REDIS`` out and say to set it by hand.
"""

from __future__ import annotations

import shlex

from ddmq.protocol import clitools
from ddmq.protocol.redis.connection import redact_url

__all__ = ["export_lines"]

#: A wildcard listen address is no address to connect to: the commands use loopback instead.
_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def _address(host: str, port: int) -> str:
    host = _ANY.get(host, host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def export_lines(redis_url: str, thrift_host: str, thrift_port: int, http_host: str | None,
                 http_port: int | None) -> list[str]:
    """What to paste into a shell: one ``export`` line, and a note when the Redis URL is secret."""
    exports = []
    secret = redact_url(redis_url) != redis_url
    if not secret:
        exports.append(f"{clitools.ENV_REDIS}={shlex.quote(redis_url)}")
    exports.append(f"{clitools.ENV_SERVERS}={shlex.quote(_address(thrift_host, thrift_port))}")
    if http_host is not None and http_port is not None:
        exports.append(f"{clitools.ENV_HTTP}={shlex.quote('http://' + _address(http_host, http_port))}")
    lines = ["# for the ddmq commands of this shell: paste", "export " + " ".join(exports)]
    if secret:
        lines.append(f"# and set {clitools.ENV_REDIS} to the Redis URL yourself (it holds a password: "
                     f"{redact_url(redis_url)})")
    return lines
