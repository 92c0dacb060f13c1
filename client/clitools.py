"""The CLIs' shared helpers: :mod:`ddmq.protocol.clitools` (shared with the proxy), kept importable here."""

from ddmq.protocol.clitools import (
    ENV_ADMIN_TOKEN,
    ENV_HTTP,
    ENV_REDIS,
    ENV_SERVERS,
    FAILURE,
    INTERRUPTED,
    USAGE_ERROR,
    CliError,
    Parser,
    add_version,
    detach_stdout,
    env_option,
    run_command,
    stdout_closed,
    version,
)

__all__ = [
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
    "env_option",
    "run_command",
    "stdout_closed",
    "version",
]
