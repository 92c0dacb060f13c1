"""docker-compose.yml and the Dockerfile, checked without Docker: structure, start-up order, health
checks, and that every command, flag and file they reference exists in this repo."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from ddmq.client.cli import build_parser as ddmq_parser
from ddmq.config import load
from ddmq.proxy.cli import build_parser as proxy_parser

REPO = Path(__file__).resolve().parents[1]
APP = "/app"  # the Dockerfile's WORKDIR: the repo's files are copied there


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return data


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def in_repo(path: str) -> Path:
    assert path.startswith(APP + "/"), path
    return REPO / path.removeprefix(APP + "/")


def test_services_and_their_start_up_order(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"redis", "proxy", "producer", "spark"}
    assert "--appendonly" in services["redis"]["command"] and "yes" in services["redis"]["command"]
    assert any(volume.endswith(":/data") for volume in services["redis"]["volumes"])
    for name in ("redis", "proxy"):
        assert services[name]["healthcheck"]["test"][0] == "CMD"
    assert services["proxy"]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    for name in ("producer", "spark"):
        assert services[name]["depends_on"]["proxy"] == {"condition": "service_healthy"}
    declared = set(compose.get("volumes", {}))
    for service in services.values():
        for volume in service.get("volumes", []):
            assert volume.split(":")[0] in declared


def test_build_targets_exist_and_copy_files_that_exist(compose: dict[str, Any], dockerfile: str) -> None:
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.MULTILINE))
    for name, service in compose["services"].items():
        if "build" in service:
            assert service["build"]["context"] == "."
            assert service["build"]["target"] in stages, name
    assert re.search(r"^WORKDIR /app$", dockerfile, re.MULTILINE)
    for line in re.findall(r"^COPY (.+)$", dockerfile, re.MULTILINE):
        *sources, _ = line.split()
        for source in sources:
            assert (REPO / source).exists(), source
    assert 'pip install --no-cache-dir ".[spark]"' in dockerfile
    for command in re.findall(r"^CMD (\[.+\])$", dockerfile, re.MULTILINE):
        check_command(yaml.safe_load(command))


def check_command(command: list[str]) -> None:
    """The command runs one of our console scripts with arguments its parser accepts, and every
    file it names exists in the repo (and a config file loads)."""
    program, args = command[0], command[1:]
    if program == "ddmq-proxy":
        parsed = proxy_parser().parse_args(args)
        load(in_repo(parsed.config))
    elif program == "ddmq":
        parsed = ddmq_parser().parse_args(args)
        assert callable(parsed.func)
    else:
        raise AssertionError(f"unexpected program {program!r} in {shlex.join(command)}")


def test_every_command_parses_and_its_files_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("proxy", "producer", "spark"):
        check_command(services[name]["command"])
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]


def test_the_services_agree_on_addresses_topic_and_group(compose: dict[str, Any]) -> None:
    services = compose["services"]
    config = load(in_repo(proxy_parser().parse_args(services["proxy"]["command"][1:]).config))
    assert config.redis == "redis://redis:6379/0" and config.thrift.port == 9713
    producer = ddmq_parser().parse_args(services["producer"]["command"][1:])
    spark = ddmq_parser().parse_args(services["spark"]["command"][1:])
    assert producer.redis == config.redis
    assert producer.topic in config.topics
    assert spark.group in config.groups and producer.topic in config.groups[spark.group]
    assert spark.servers == "proxy:9713"
    assert services["proxy"]["ports"] == ["9713:9713"]
