"""docker-compose.yml and the Dockerfile, checked without Docker: the compose file against the Compose
Specification's JSON schema, start-up order, health checks, every command, flag and file they reference,
and a replay of the Dockerfile's COPY and ``pip install .`` steps in a temporary directory, so that a
file the image build needs but the Dockerfile does not copy fails here rather than in ``docker build``."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from ddmq.client.cli.main import build_parser as ddmq_parser
from ddmq.config import load
from ddmq.proxy.cli import build_parser as proxy_parser

REPO = Path(__file__).resolve().parents[2]
APP = "/app"  # the Dockerfile's WORKDIR: the repo's files are copied there


@pytest.fixture(autouse=True)
def admin_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """The token docker-compose.yml hands to the proxy, which its config reads from the environment."""
    token = "compose-token-0123456789"
    monkeypatch.setenv("DDMQ_ADMIN_TOKEN", token)
    return token


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


def test_the_services_agree_on_addresses_topic_and_group(compose: dict[str, Any], admin_token: str) -> None:
    services = compose["services"]
    config = load(in_repo(proxy_parser().parse_args(services["proxy"]["command"][1:]).config))
    assert config.redis == "redis://redis:6379/0" and config.thrift.port == 9713
    producer = ddmq_parser().parse_args(services["producer"]["command"][1:])
    spark = ddmq_parser().parse_args(services["spark"]["command"][1:])
    assert producer.redis == config.redis
    assert producer.topic in config.topics
    assert spark.group in config.groups and producer.topic in config.groups[spark.group]
    assert spark.servers == "proxy:9713"
    assert services["proxy"]["ports"] == ["9713:9713", f"{config.http.port}:{config.http.port}"]
    assert config.http.enabled and config.http.host == "0.0.0.0"
    # The health check asks /readyz on the port the config serves HTTP on.
    (probe,) = [part for part in services["proxy"]["healthcheck"]["test"] if "readyz" in part]
    assert f"http://127.0.0.1:{config.http.port}/readyz" in probe
    environment = services["proxy"]["environment"]
    assert environment["DDMQ_REDIS"] == config.redis
    assert environment["DDMQ_SERVERS"] == f"127.0.0.1:{config.thrift.port}"
    assert environment["DDMQ_HTTP"] == f"http://127.0.0.1:{config.http.port}"
    # The console is opened from the host, across the Docker bridge: that needs the admin token, which
    # the config takes from the environment compose passes (and compose refuses to start without it).
    assert environment["DDMQ_ADMIN_TOKEN"].startswith("${DDMQ_ADMIN_TOKEN:?")
    assert config.http.admin_token == admin_token


def test_compose_file_follows_the_compose_specification(compose: dict[str, Any]) -> None:
    """The Compose Specification's schema as check-jsonschema ships it (vendored from compose-spec, Apache-2.0)."""
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendor.joinpath("compose-spec.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(compose)
    proxy = {**compose["services"]["proxy"], "helthcheck": {}}
    broken = {**compose, "services": {**compose["services"], "proxy": proxy}}
    with pytest.raises(jsonschema.ValidationError):  # the schema does catch a misspelt key
        jsonschema.Draft202012Validator(schema).validate(broken)


# -- the image build, replayed ---------------------------------------------------------------------


#: What a Debian release's archive calls the Java runtime the spark target installs.
JRE_BY_DEBIAN = {"bookworm": "openjdk-17-jre-headless"}


def dockerfile_steps(text: str) -> list[tuple[str, str]]:
    """(instruction, arguments) per step, continuation lines joined, comments dropped."""
    steps = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            instruction, _, rest = line.partition(" ")
            steps.append((instruction.upper(), rest.strip()))
    return steps


def dockerignored(names: list[str]) -> list[str]:
    patterns = [line.strip().removeprefix("**/") for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    return [name for name in names if any(fnmatch.fnmatch(name, pattern) for pattern in patterns)]


def replay_copy(args: str, workdir: Path) -> None:
    """``COPY src... dest`` from the build context (the repo, less .dockerignore) into the image's WORKDIR."""
    *sources, dest = shlex.split(args)
    target = workdir / dest
    for source in sources:
        path = REPO / source
        assert path.exists(), f"COPY {source}: not in the repo"
        if path.is_dir():  # Docker copies a directory's contents into dest
            shutil.copytree(path, target, dirs_exist_ok=True, ignore=lambda _, names: dockerignored(names))
        else:
            into = target / path.name if dest.endswith("/") or len(sources) > 1 else target
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, into)


def test_the_image_build_replays_without_docker(dockerfile: str, tmp_path: Path) -> None:
    """Every step of the proxy stage, in order: the COPY lines fill a temporary /app, and ``pip install .``
    runs there (as a wheel build without dependencies, the fast part that needs every build file).
    The spark stage's steps are checked for what they need: the JRE in the base's Debian, the extra."""
    steps = dockerfile_steps(dockerfile)
    stages = [i for i, (instruction, _) in enumerate(steps) if instruction == "FROM"]
    base = steps[0][1].split()[0]
    debian = base.rpartition("-")[2]
    assert debian in JRE_BY_DEBIAN, f"{base}: pin the base image to a Debian release (python:3.11-slim-bookworm)"
    app = tmp_path / "app"
    workdir = app
    installs = 0
    for instruction, args in steps[: stages[1]]:
        if instruction == "WORKDIR":
            assert args == APP
        elif instruction == "COPY":
            replay_copy(args, workdir)
        elif instruction == "RUN":
            assert args == "pip install --no-cache-dir .", f"RUN {args}: teach this test to replay it"
            wheels = tmp_path / "wheels"
            build = subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                 "-w", str(wheels), "."],
                # pure: the files the build needs are the same, and compiling would take a minute or two
                cwd=workdir, capture_output=True, text=True, timeout=300, env={**os.environ, "DDMQ_COMPILE": "0"},
            )
            assert build.returncode == 0, build.stderr
            (wheel,) = wheels.glob("ddmq_proxy-*.whl")
            with zipfile.ZipFile(wheel) as archive:
                names = set(archive.namelist())
            assert {"ddmq/proxy/cli.py", "ddmq/client/cli/main.py", "ddmq/config/examples/compose.yaml"} <= names
            installs += 1
        else:
            assert instruction in ("FROM", "ENV", "EXPOSE", "CMD"), instruction
    assert installs == 1
    spark_runs = [args for instruction, args in steps[stages[1]:] if instruction == "RUN"]
    assert any(JRE_BY_DEBIAN[debian] in run for run in spark_runs), spark_runs
    assert 'pip install --no-cache-dir ".[spark]"' in spark_runs
    assert "spark" in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
