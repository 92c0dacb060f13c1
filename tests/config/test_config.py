"""Config loading: examples load, and every kind of broken file fails naming the bad field."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddmq.actions import registered_names
from ddmq.config import load, parse
from ddmq.config.schema import ACTION_NAMES
from ddmq.proxy.core.errors import ConfigError

EXAMPLES = sorted((Path(__file__).parents[2] / "config" / "examples").glob("*.yaml"))

ISSUE_SHAPE = """
instance_id: proxy-1
redis: redis://127.0.0.1:6379/0        # or: embedded
thrift: {host: 127.0.0.1, port: 9713}
http: {enabled: true, host: 127.0.0.1, port: 9714}
topics:
  rides: {queues: 8}
groups:
  cg_rides:
    rides:
      actions: [Json, Order, PullServer]
      order_key: "$.rider_id"
      timeout_ms: 5000
      max_retry: 3
"""


def test_action_names_match_the_registry() -> None:
    assert registered_names() == ACTION_NAMES


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_load(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDMQ_ADMIN_TOKEN", "example-token-0123456789")  # compose.yaml reads it
    config = load(path)
    assert config.groups


def test_the_documented_shape_loads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "proxy.yaml"
    path.write_text(ISSUE_SHAPE)
    config = load(path)
    rides = config.groups["cg_rides"]["rides"]
    assert (rides.order_key, rides.timeout_ms, rides.max_retry) == ("$.rider_id", 5000, 3)
    assert rides.concurrency == 1000 and config.topics["rides"].queues == 8
    assert rides.retry_delay_ms(1) == 100 and rides.retry_delay_ms(9) == 5000


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("groups: {g: {t: {timeout_ms: soon}}}", "groups.g.t.timeout_ms"),
        ("groups: {g: {t: {actions: [Json, Groovy, PullServer]}}}", "unknown action(s) ['Groovy']"),
        ("groups: {g: {t: {actions: [PullServer, Json]}}}", "must end with PullServer"),
        ("groups: {g: {t: {order_key: '$.a', actions: [Order, PullServer]}}}", "needs the Json action"),
        ("groups: {g: {t: {order_key: '$[[['}}}", "invalid JSONPath"),
        ("groups: {g: {t: {order_key: rider}}}", "groups.g.t.order_key"),
        ("groups: {g: {t: {timeout: 5}}}", "groups.g.t.timeout: Extra inputs are not permitted"),
        ("topics: {rides: {queues: 0}}", "topics.rides.queues"),
        ("redis: localhost:6379", "redis: Value error"),
        ("groups: {'bad name': {}}", "invalid topic or group name"),
        ("thrift: {port: 70000}", "thrift.port"),
        ("- just\n- a list", "top level must be a mapping"),
        ("groups: {g: [unclosed", "not valid YAML"),
        # YAML 1.1 booleans are not numbers, and only true/false are booleans
        ("groups: {g: {t: {timeout_ms: yes}}}", "groups.g.t.timeout_ms: Input should be a valid integer"),
        ("groups: {g: {t: {max_retry: on}}}", "groups.g.t.max_retry: Input should be a valid integer"),
        ("groups: {g: {t: {max_retry: true}}}", "groups.g.t.max_retry: Input should be a valid integer"),
        ("http: {enabled: yes}", "http.enabled: Input should be a valid boolean"),
        ("groups:\n  g: {t: {}}\n  g: {t: {timeout_ms: 5}}\n", "duplicate key 'g' (first on line 2)"),
        ("groups: {g: {t: {timeout_ms: 5, timeout_ms: 6}}}", "duplicate key 'timeout_ms'"),
        ("", "the file is empty"),
        ("# only a comment\n", "the file is empty"),
        ("thrift: {max_frame_bytes: 2048, max_buffered_bytes: 1024}", "at least max_frame_bytes"),
        # tenants: the expression, the weights, and what they need of the chain
        ("groups: {g: {t: {fair_key: customer}}}", "fair_key must be KEY, TAG or a JSONPath"),
        ("groups: {g: {t: {fair_key: '$[[['}}}", "invalid JSONPath"),
        ("groups: {g: {t: {fair_weights: {a: 2}}}}", "fair_weights is set but fair_key is not"),
        ("groups: {g: {t: {fair_key: KEY, fair_weights: {a: 0}}}}", "groups.g.t.fair_weights.a"),
        ("groups: {g: {t: {fair_key: KEY, fair_weights: {a: -1}}}}", "greater than 0"),
        ("groups: {g: {t: {fair_key: KEY, fair_weights: {a: 2000000}}}}", "less than or equal to 1000000"),
        ("groups: {g: {t: {fair_key: KEY, fair_weights: {a: heavy}}}}", "groups.g.t.fair_weights.a"),
        ("groups: {g: {t: {fair_key: KEY, order_key: QID}}}", "with order_key QID a queue is one key"),
        ("groups: {g: {t: {fair_key: KEY, actions: [Json, PullServer]}}}", "add Order to actions"),
        ("groups: {g: {t: {fair_key: '$.c', actions: [Order, PullServer]}}}", "JSONPath fair_key needs the Json"),
        ("groups: {g: {t: {key_buffer: 0}}}", "groups.g.t.key_buffer"),
    ],
)
def test_broken_files_name_the_problem(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "nope.yaml")


def test_no_data_gives_defaults() -> None:
    config = parse(None)
    assert config.redis == "embedded" and config.thrift.port == 9713


def test_proxy_refuses_a_broken_file_at_start_up(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("groups: {g: {t: {max_retry: -1}}}")
    proc = subprocess.run(
        [sys.executable, "-m", "ddmq.proxy", "--config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "groups.g.t.max_retry" in proc.stderr


def test_check_flag_refuses_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    command = [sys.executable, "-m", "ddmq.proxy", "--config", str(path), "--check"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"ddmq-proxy: {path}: the file is empty; a config needs at least its groups " \
        "(see config/examples/)"


def test_check_flag_validates_without_starting() -> None:
    compose = [path for path in EXAMPLES if path.name == "compose.yaml"]
    proc = subprocess.run(
        [sys.executable, "-m", "ddmq.proxy", "--config", str(compose[0]), "--check"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "DDMQ_ADMIN_TOKEN": "check-token-0123456789"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "ok" in proc.stdout
    # Without the variable the file does not load, and the error names the variable and the field.
    env = {name: value for name, value in os.environ.items() if name != "DDMQ_ADMIN_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "ddmq.proxy", "--config", str(compose[0]), "--check"],
        capture_output=True, text=True, timeout=60, env=env,
    )
    assert proc.returncode == 2
    assert "http.admin_token: environment variable DDMQ_ADMIN_TOKEN is not set" in proc.stderr


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("{actions: [Json, Transit, PullServer]}", "the Transit action needs its settings under 'transit'"),
        ("{transit: {a: $.a}}", "'transit' is set but the Transit action is not in actions"),
        ("{actions: [Transit, Json, PullServer], transit: {a: $.a}}", "Transit reads the parsed body"),
        ("{actions: [Json, Transit, PullServer], transit: {a: nope}}", "groups.g.t.transit"),
        ("{actions: [Json, Transit, PullServer], transit: {a: $.a, a.b: $.b}}", "is inside field 'a'"),
        ("{actions: [Filter, PullServer], filter: {}}", "give at least one of"),
        ("{actions: [Filter, PullServer], filter: {expression: '$.a > 1'}}", "Filter reads the parsed body"),
        ("{actions: [Json, Order, AsyncHttp, PullServer], async_http: {urls: ['http://h/']}}", "only one of"),
        ("{actions: [Json, Order, AsyncHttp]}", "needs its settings under 'async_http'"),
        ("{actions: [AsyncHttp], async_http: {urls: []}}", "groups.g.t.async_http.urls"),
        ("{actions: [AsyncHttp], async_http: {urls: ['ftp://h/']}}", "not an http:// or https:// URL"),
        ("{actions: [AsyncHttp], async_http: {urls: ['http://h/'], method: FETCH}}", "async_http.method"),
        ("{actions: [AsyncHttp], async_http: {urls: ['http://h/'], body: form}}", "AsyncHttp reads the parsed"),
        (
            "{actions: [Json, Redis], redis_action: {url: 'localhost', commands: [{command: del, key: k}]}}",
            "redis_action.url",
        ),
        (
            "{actions: [Json, Redis], redis_action: {url: 'redis://h', commands: [{command: set, key: k}]}}",
            "set needs value",
        ),
        (
            "{actions: [Json, Redis], redis_action: {url: 'redis://h', commands: [{command: hset, key: k}]}}",
            "hset needs fields",
        ),
        (
            "{actions: [Json, Redis], redis_action: {url: 'redis://h', commands: [{command: del, key: 'a:{$[[}'}]}}",
            "redis_action.commands.0.key",
        ),
        (
            "{actions: [Json, Redis], redis_action: {url: 'redis://h', commands: [{command: del, key: k, when: 'x'}]}}",
            "redis_action.commands.0.when",
        ),
    ],
)
def test_action_settings_are_checked_at_load(tmp_path: Path, topic: str, expected: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(f"groups: {{g: {{t: {topic}}}}}")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert expected in str(info.value)


def test_every_example_passes_check() -> None:
    for path in EXAMPLES:
        proc = subprocess.run(
            [sys.executable, "-m", "ddmq.proxy", "--config", str(path), "--check"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DDMQ_ADMIN_TOKEN": "example-token-0123456789"},  # compose.yaml reads it
        )
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(text)
    return path


def test_values_take_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDMQ_TEST_TOKEN", "from-the-environment-0123")
    monkeypatch.setenv("DDMQ_TEST_HOST", "10.1.2.3")
    monkeypatch.delenv("DDMQ_TEST_UNSET", raising=False)
    path = _write(
        tmp_path,
        'redis: "redis://:${DDMQ_TEST_UNSET:-pw}@${DDMQ_TEST_HOST}:6379/0"\n'
        "http: {admin_token: '${DDMQ_TEST_TOKEN}', allowed_hosts: ['${DDMQ_TEST_UNSET:-proxy.internal}']}\n"
        "instance_id: 'proxy-$${HOSTNAME}'\ngroups: {g: {t: {actions: [PullServer]}}}\n",
    )
    config = load(path)
    assert config.redis == "redis://:pw@10.1.2.3:6379/0"
    assert config.http.admin_token == "from-the-environment-0123"
    assert config.http.allowed_hosts == ["proxy.internal"]
    # $${ is a literal ${, and an expanded value is not expanded again
    assert config.instance_id == "proxy-${HOSTNAME}"


def test_an_unset_variable_names_itself_and_the_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DDMQ_TEST_UNSET", raising=False)
    path = _write(tmp_path, "http: {admin_token: '${DDMQ_TEST_UNSET}'}\ngroups: {g: {t: {actions: [PullServer]}}}\n")
    with pytest.raises(ConfigError, match=r"proxy.yaml: http.admin_token: environment variable DDMQ_TEST_UNSET "):
        load(path)
    broken = _write(tmp_path, "redis: 'redis://${oops'\ngroups: {g: {t: {actions: [PullServer]}}}\n")
    with pytest.raises(ConfigError, match=r"redis: '\$\{' must start"):
        load(broken)


def test_a_secret_from_the_environment_is_not_echoed_by_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDMQ_TEST_TOKEN", "tiny-secret")  # too short for admin_token
    path = _write(tmp_path, "http: {admin_token: '${DDMQ_TEST_TOKEN}'}\ngroups: {g: {t: {actions: [PullServer]}}}\n")
    with pytest.raises(ConfigError, match=r"http\.admin_token") as raised:
        load(path)
    assert "tiny-secret" not in str(raised.value)
