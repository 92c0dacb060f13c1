"""Credentials stay out of sight: Redis URLs are shown with the password masked in the proxy's log,
its errors and the CLI's errors, and a Redis ACL user (``redis://user:password@...``) works end to end
against a real redis-server with that user set up."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from ddmq.protocol.net import free_port
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis.connection import redact_url
from ddmq.proxy.core.errors import BrokerError
from ddmq.proxy.service import ProxyService

from ..proxy.conftest import proxy_config
from ..proxy.servers.test_http_api import eventually
from ..support import ProxyProcess

PASSWORD = "s3cret-Passw0rd"
USER = "ddmq-proxy-test"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://app:s3cret@10.0.0.5:6379/2", "redis://app:***@10.0.0.5:6379/2"),
        ("rediss://app:p%40ss@redis.example:6380/0", "rediss://app:***@redis.example:6380/0"),
        ("redis://app:a:b@c@h:1,h2:2/0?cluster=true", "redis://app:***@h:1,h2:2/0?cluster=true"),
        ("redis://127.0.0.1:6379/0?password=s3cret&db=1", "redis://127.0.0.1:6379/0?password=***&db=1"),
        ("redis://app@127.0.0.1:6379/0", "redis://app@127.0.0.1:6379/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("unix://:s3cret@/run/redis.sock?db=0", "unix://:***@/run/redis.sock?db=0"),
    ],
)
def test_urls_are_shown_with_the_password_masked(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.fixture
def acl_url(redis_url: str) -> Iterator[str]:
    """The session's redis-server with an ACL user that may do what the proxy and producers do."""
    with redis.Redis.from_url(redis_url) as admin:
        admin.acl_setuser(USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["ddmq:*"], commands=["+@all"])
        try:
            yield redis_url.replace("redis://", f"redis://{USER}:{PASSWORD}@", 1)
        finally:
            admin.acl_deluser(USER)


async def test_an_acl_user_consumes_and_its_password_is_never_logged(
    acl_url: str, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from ..proxy.servers.test_http_api import http_proxy, pull

    with caplog.at_level(logging.DEBUG):
        async with http_proxy(acl_url, {"order_key": "KEY"}) as (service, api):
            async with AsyncProducer(acl_url) as producer:
                await producer.send_batch("t", [{"key": f"k{i % 3}", "value": f"v{i}"} for i in range(12)])
            seen: list[tuple[str, str]] = []
            while len(seen) < 12:
                body = await pull(api, max_batch=12)
                seen += [(m["key"], m["value_text"]) for m in body["messages"]]
                acks = [{"topic": "t", "qid": body["qid"], "success": [m["offset"] for m in body["messages"]]}]
                await api.call("POST", "/v1/ack", json={"group": "g", "results": acks})
            for key in ("k0", "k1", "k2"):
                values = [int(value[1:]) for k, value in seen if k == key]
                assert values == sorted(values) and len(values) == 4

            async def committed() -> bool:
                (row,) = await service.api.consume_stats("g", "t")
                return row.consume_offsets == row.produce_offsets

            await eventually(committed)
            # Every command ran as the ACL user.
            with redis.Redis.from_url(redis_url) as admin:
                clients = admin.client_list()
            assert any(client.get("user") == USER for client in clients)
    text = caplog.text
    assert PASSWORD not in text
    assert f"redis redis://{USER}:***@" in text  # the ready line names the user, not the password


async def test_a_wrong_password_fails_with_the_url_masked(acl_url: str) -> None:
    wrong = acl_url.replace(PASSWORD, "not-the-Passw0rd")
    service = ProxyService(proxy_config(wrong))
    with pytest.raises(BrokerError) as raised:
        await service.start()
    assert "not-the-Passw0rd" not in str(raised.value) and ":***@" in str(raised.value)


def test_cli_errors_show_the_url_masked(acl_url: str) -> None:
    wrong = acl_url.replace(PASSWORD, "not-the-Passw0rd")
    proc = subprocess.run(
        [sys.executable, "-m", "ddmq.client.cli", "status", "--redis", wrong, "--group", "g"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode != 0
    assert "not-the-Passw0rd" not in proc.stderr + proc.stdout
    assert f"{USER}:***@" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "ddmq.client.cli", "status", "--redis", acl_url, "--group", "nobody"],
        capture_output=True, text=True, timeout=60,
    )
    assert PASSWORD not in proc.stderr + proc.stdout and f"{USER}:***@" in proc.stderr



def test_a_proxy_process_takes_its_secrets_from_the_environment(
    acl_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``${VAR}`` in the config file: the Redis password and the admin token come from the environment;
    the log names neither."""
    token = "env-admin-token-0123456789"
    monkeypatch.setenv("DDMQ_TEST_REDIS_PASSWORD", PASSWORD)
    monkeypatch.setenv("DDMQ_TEST_ADMIN_TOKEN", token)
    port = free_port()
    templated = acl_url.replace(PASSWORD, "${DDMQ_TEST_REDIS_PASSWORD}")
    process = ProxyProcess(
        tmp_path, templated, {"g": {"t": {}}}, {"t": {"queues": 2}},
        http={"enabled": True, "port": port, "admin_token": "${DDMQ_TEST_ADMIN_TOKEN}"},
    ).start()
    try:
        assert "${DDMQ_TEST_REDIS_PASSWORD}" in process.config_path.read_text()  # the file holds no secret
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while "ready:" not in process.log():
            assert time.monotonic() < deadline, process.log()
            time.sleep(0.1)
        assert requests.get(base + "/admin/groups", timeout=5).status_code == 401
        answer = requests.get(base + "/admin/groups", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert answer.status_code == 200 and answer.json()["groups"][0]["group"] == "g"
        log = process.log()
        assert f"redis redis://{USER}:***@" in log
        assert PASSWORD not in log and token not in log
    finally:
        process.stop()
