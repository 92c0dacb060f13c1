"""``ddmq-proxy --log-format json`` on a real proxy process: every line it writes to stderr and stdout is
one JSON object (time, level, logger, message; group, topic and qid where a line is about one), the
start-up export line included as a field, and a Redis password stays out of every line."""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from ddmq.proxy.ops.logs import JsonFormatter

from ..support import ProxyProcess, produce_keyed, until

SECRET = "s3cret-pw"


class JsonProxy(ProxyProcess):
    ARGS = ("--log-format", "json")


def objects(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (a line that is not one fails the test, saying which)."""
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise AssertionError(f"not a JSON line: {line!r}") from exc
        assert isinstance(value, dict) and {"time", "level", "logger", "message"} <= value.keys(), line
        out.append(value)
    return out


async def test_every_line_of_a_proxy_run_is_a_json_object_with_the_secret_masked(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    # A user with a password: the proxy's URL carries a secret, which no line may show.
    await redis_client.execute_command("ACL", "SETUSER", "logs-test", "on", f">{SECRET}", "~*", "&*", "+@all")
    secret_url = redis_url.replace("redis://", f"redis://logs-test:{SECRET}@")
    proxy = JsonProxy(tmp_path, secret_url, {"g": {"t": {"order_key": "KEY"}}}, {"t": {"queues": 2}})
    try:
        proxy.start()
        produce_keyed(redis_url, 20, {}, random.Random(1), keys=5)
        await until("a queue read", lambda: "reading from offset" in proxy.log(), 20)
        assert proxy.stop() == 0
    finally:
        proxy.stop()
        await redis_client.execute_command("ACL", "DELUSER", "logs-test")
    text = proxy.log()
    assert SECRET not in text
    lines = objects(text)
    export = [line for line in lines if "export" in line]
    assert len(export) == 1 and export[0]["export"].startswith("export DDMQ_SERVERS=127.0.0.1:")
    assert "DDMQ_REDIS" in export[0]["note"] and "***" in export[0]["note"]
    opened = [line for line in lines if line["message"].startswith("g/t#")]
    assert opened and {(line["group"], line["topic"]) for line in opened} == {("g", "t")}
    assert {line["qid"] for line in opened} == {0, 1}
    assert {"ddmq.proxy", "ddmq.proxy.cluster.ownership"} <= {line["logger"] for line in lines}
    assert [line["message"] for line in lines][-1] == "stopped"
    assert all(line["time"].endswith("Z") and line["level"] in ("INFO", "WARNING") for line in lines)


def test_the_command_s_own_lines_are_json_too(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups: {g: {t: {max_retry: -1}}}\n")
    run = subprocess.run([sys.executable, "-m", "ddmq.proxy", "--config", str(bad), "--log-format", "json"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stdout == ""
    (error,) = objects(run.stderr)
    assert error["level"] == "ERROR" and "max_retry" in error["message"]
    good = tmp_path / "good.yaml"
    good.write_text("redis: redis://127.0.0.1:1/0\ngroups: {g: {t: {}}}\n")
    run = subprocess.run([sys.executable, "-m", "ddmq.proxy", "--config", str(good), "--log-format", "json",
                          "--check"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stderr == ""
    (ok,) = objects(run.stdout)
    assert ok["level"] == "INFO" and ok["message"].endswith("ok (1 groups, 0 topics)") and "group" not in ok


def test_fields_given_by_the_call_win_and_exceptions_are_kept() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord("ddmq.x", logging.WARNING, __file__, 1, "%s: lost", ("g/t#3",), None)
    assert json.loads(formatter.format(record)) | {"time": ""} == {
        "time": "", "level": "WARNING", "logger": "ddmq.x", "message": "g/t#3: lost", "group": "g", "topic": "t",
        "qid": 3}
    record.qid = 4
    assert json.loads(formatter.format(record))["qid"] == 4
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("ddmq.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    line = json.loads(formatter.format(record))
    assert "group" not in line and "RuntimeError: boom" in line["exception"]
    assert keys.check_name("group", "g.1-x_y")  # the names the message prefix is read with
