"""What every ``ddmq`` command shares, through the real executable: ``--version``, the usage error
style, and a quiet end on a closed stdout (``ddmq-proxy``'s side: tests/proxy/test_cli_basics.py)."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from ddmq.protocol.produce.producer import Producer

from ..support import debian_tool

DDMQ = [sys.executable, "-m", "ddmq.client.cli"]


def test_version() -> None:
    result = subprocess.run([*DDMQ, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    assert result.stdout.strip() == f"ddmq {metadata.version('ddmq-proxy')}"


@pytest.mark.parametrize(("args", "prefix"), [
    (["status", "--group", "g"], "ddmq status: the following arguments are required: --redis"),
    (["consume", "--servers", "h:1", "--group", "g", "--count", "0"], "ddmq consume: --count must be positive"),
    (["consume", "--servers", "h:99999", "--group", "g"], "ddmq consume: bad port in server address"),
    (["dead-letters", "list", "--http", "ftp://x", "--group", "g", "--topic", "t"], "ddmq dead-letters list: --http"),
    (["nosuch"], "ddmq: argument COMMAND: invalid choice: 'nosuch'"),
])
def test_usage_errors_exit_2_in_one_style(args: list[str], prefix: str, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin"}  # no DDMQ_* defaults from the caller's environment
    # (nor a ./ddmq-data/redis.url from a proxy the developer runs in the checkout)
    result = subprocess.run([*DDMQ, *args], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(prefix), result.stderr
    assert result.stderr.count("\n") == 1


def test_a_closed_stdout_ends_the_command_quietly(redis_url: str) -> None:
    with Producer(redis_url) as producer:
        producer.ensure_topic("t", 2)
    command = [*DDMQ, "offsets", "reset", "--redis", redis_url, "--group", "g", "--topic", "t", "--to-latest"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the command prints
        assert proc.wait(timeout=60) == 1
        assert proc.stderr.read() == b""


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of a parser: (), ("status",), ("dead-letters", "list"), ..."""
    found = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _subcommands(child, (*prefix, name))
    return found


def test_every_help_is_plain_text_of_its_own() -> None:
    from ddmq.client.cli.main import build_parser

    helps: dict[tuple[str, ...], str] = {}
    for path in _subcommands(build_parser()):
        result = subprocess.run([*DDMQ, *path, "--help"], capture_output=True, text=True, timeout=60,
                                env={"PATH": "/usr/bin:/bin"})
        assert result.returncode == 0, (path, result.stderr)
        text = result.stdout
        assert "``" not in text and not re.search(r":[a-z]+:`", text) and not re.search(r"::$", text, re.M), path
        helps[path] = text.split("options:")[0].split("\n\n", 1)[-1]  # the description, after the usage
    assert helps[("in-flight",)] != helps[("dead-letters",)] != helps[("blocked-keys",)] != helps[("in-flight",)]


def test_a_missing_flag_names_its_environment_variable() -> None:
    result = subprocess.run([*DDMQ, "dead-letters", "list", "--topic", "t"], capture_output=True, text=True,
                            timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "--http (or set $DDMQ_HTTP), --group" in result.stderr, result.stderr


def test_bash_completion_completes_commands_and_flags() -> None:
    bash = debian_tool("bash")
    script = subprocess.run([*DDMQ, "completion", "bash"], capture_output=True, text=True, timeout=60, check=True)
    probe = (
        'source /dev/stdin; complete_line() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _shtab_ddmq;'
        ' echo "${COMPREPLY[*]}"; }; complete_line ddmq sta; complete_line ddmq status --gr;'
        ' complete_line ddmq dead-letters ""'
    )
    result = subprocess.run([bash, "-c", probe], input=script.stdout, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    commands, flags, actions = result.stdout.splitlines()
    assert commands == "status" and flags == "--group"
    assert set(actions.split()) >= {"list", "replay", "purge"}


def test_zsh_completion_is_valid_and_names_every_command() -> None:
    zsh = debian_tool("zsh")
    script = subprocess.run([*DDMQ, "completion", "zsh"], capture_output=True, text=True, timeout=60, check=True)
    assert script.stdout.startswith("#compdef ddmq")
    checked = subprocess.run([zsh, "-n"], input=script.stdout, capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    from ddmq.client.cli.main import build_parser

    for path in _subcommands(build_parser())[1:]:
        assert re.search(rf"^\s+{re.escape(path[-1])}:'", script.stdout, re.MULTILINE), path


def test_redis_defaults_to_the_embedded_redis_of_a_proxy_running_in_this_directory(
    tmp_path: Path, redis_url: str
) -> None:
    from ddmq.config.schema import EmbeddedRedisConfig
    from ddmq.protocol.clitools import EMBEDDED_REDIS_URL_FILE
    from ddmq.proxy.store.embedded import URL_FILE

    # The proxy's side: the default data_dir and the file it writes its URL into.
    assert Path(EMBEDDED_REDIS_URL_FILE) == Path(EmbeddedRedisConfig().data_dir) / URL_FILE
    env = {"PATH": "/usr/bin:/bin"}
    missing = subprocess.run([*DDMQ, "topics", "list"], capture_output=True, text=True, timeout=60, env=env,
                             cwd=tmp_path)
    assert missing.returncode == 2 and "--redis (or set $DDMQ_REDIS)" in missing.stderr
    with Producer(redis_url) as producer:
        producer.ensure_topic("rides", 2)
    (tmp_path / "ddmq-data").mkdir()
    (tmp_path / EMBEDDED_REDIS_URL_FILE).write_text(redis_url + "\n")
    found = subprocess.run([*DDMQ, "topics", "list"], capture_output=True, text=True, timeout=60, env=env,
                           cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[1].split() == ["rides", "2", "0", "0"]
