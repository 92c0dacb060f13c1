"""deploy/kubernetes/ddmq-proxy.yaml: the manifests agree with themselves and with the proxy, and the
config they mount runs as a pod would run it.

No cluster runs here, so what Kubernetes would do is taken from the manifests: the ConfigMap's config is
started as a real proxy with the environment the StatefulSet gives a pod (its name as ``POD_NAME``, the
Secret's values), the probes' paths are asked on the port they name, and SIGTERM, as a rolling update
sends it, must end the proxy cleanly (exit 0, leases released, the member gone) well inside
``terminationGracePeriodSeconds``, with every message delivered once and in key order meanwhile.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis
import yaml

from ddmq.client import Producer, PullConsumer
from ddmq.client.cli.proxy_process import ProxyChild, write_config
from ddmq.config.loader import expand_variables, parse
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys
from ddmq.proxy.cli import build_parser

MANIFESTS = Path(__file__).parents[2] / "deploy" / "kubernetes" / "ddmq-proxy.yaml"
TOKEN = "k8s-test-token-0123456789"


def _documents() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(MANIFESTS.read_text()) if doc}


def _container() -> dict[str, Any]:
    (container,) = _documents()["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    return container


def _raw_config() -> Any:
    return yaml.safe_load(_documents()["ConfigMap"]["data"]["proxy.yaml"])


#: The oldest Kubernetes still in common support and the newest the validator knows: the manifests use
#: nothing that either lacks (policy/v1 PodDisruptionBudget needs 1.21).
KUBERNETES_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_for_the_kubernetes_api(version: str) -> None:
    documents = [doc for doc in yaml.safe_load_all(MANIFESTS.read_text()) if doc]
    for document in documents:
        # strict: a misspelt field (terminationGracePeriod, readinesProbe) is an error, not ignored
        kubernetes_validate.validate(document, version, strict=True)


def test_the_validator_refuses_a_misspelt_field() -> None:
    sts = _documents()["StatefulSet"]
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {"path": "/readyz", "port": "http"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_manifests_agree_with_each_other_and_with_the_config() -> None:
    docs = _documents()
    assert set(docs) == {"ConfigMap", "Service", "StatefulSet", "PodDisruptionBudget"}
    sts, service = docs["StatefulSet"], docs["Service"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert sts["spec"]["selector"]["matchLabels"] == labels == service["spec"]["selector"]
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == labels
    # the pods' stable names, which clients list and the proxies take as instance ids, need a headless Service
    assert sts["spec"]["serviceName"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"

    container = _container()
    env = {item["name"]: item["valueFrom"] for item in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    secrets = {ref["secretKeyRef"]["name"] for name, ref in env.items() if name != "POD_NAME"}
    assert len(secrets) == 1
    config = parse(expand_variables(_raw_config(), {"POD_NAME": "ddmq-proxy-0", "DDMQ_REDIS_URL":
                                                    "redis://redis:6379/0", "DDMQ_ADMIN_TOKEN": TOKEN}))
    assert config.instance_id == "ddmq-proxy-0"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"thrift": config.thrift.port, "http": config.http.port}
    assert config.http.enabled and config.http.host == "0.0.0.0" and config.http.admin_token == TOKEN
    assert {port["targetPort"] for port in service["spec"]["ports"]} == set(ports)
    for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe

    # the config file the proxy is told to read is the one the ConfigMap is mounted as
    (mount,) = container["volumeMounts"]
    assert container["args"][:3] == ["ddmq-proxy", "--config", f"{mount['mountPath']}/proxy.yaml"]
    args = build_parser().parse_args(container["args"][1:])  # the proxy's own parser takes them
    assert args.watch_interval_ms == 5000
    # SIGTERM's drain (shutdown_grace_ms), then the last commit and the release, with room to spare
    grace_s = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s * 1000 >= config.shutdown_grace_ms + 10_000


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:
        return 0  # not listening (yet)


def _until(what: str, check: Any, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(0.05)


def test_the_configmap_runs_as_a_pod_runs_it_and_stops_cleanly_on_sigterm(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"POD_NAME": "ddmq-proxy-0", "DDMQ_REDIS_URL": redis_url, "DDMQ_ADMIN_TOKEN": TOKEN}.items():
        monkeypatch.setenv(name, value)  # what the StatefulSet's env gives the container
    raw = _raw_config()
    # The one change: free ports instead of 9713/9714, which a pod has to itself and this host may not.
    thrift, http = free_port(), free_port()
    raw["thrift"]["port"], raw["http"]["port"] = thrift, http
    proxy = ProxyChild(write_config(tmp_path / "proxy.yaml", raw), thrift, tmp_path / "proxy.log")
    proxy.start()
    try:
        base = f"http://127.0.0.1:{http}"
        _until("/readyz 200", lambda: _get(f"{base}/readyz") == 200)
        assert _get(f"{base}/healthz") == 200
        assert _get(f"{base}/admin/groups") == 401 and _get(f"{base}/admin/groups", TOKEN) == 200

        riders, events = 50, ("call", "pickup", "pay")
        with Producer(redis_url) as producer:
            for event in events:
                for rider in range(riders):
                    producer.send("rides", f'{{"rider_id": "r{rider}", "event": "{event}"}}', key=f"r{rider}")
        seen: dict[str, list[str]] = {}

        def handle(message: Any) -> bool:
            body = yaml.safe_load(message.value)
            seen.setdefault(body["rider_id"], []).append(body["event"])
            return True

        consumer = PullConsumer(f"127.0.0.1:{thrift}", "cg_rides", handle, threads=2, linger_ms=200)
        consumer.start()
        try:
            _until("every ride delivered", lambda: sum(map(len, seen.values())) >= riders * len(events))
        finally:
            consumer.stop()
        assert seen == {f"r{rider}": list(events) for rider in range(riders)}

        with redis.Redis.from_url(redis_url) as client:
            assert client.zscore(keys.members("cg_rides"), "ddmq-proxy-0") is not None
            started = time.monotonic()
            code = proxy.stop(timeout_s=30)
            took = time.monotonic() - started
            assert code == 0, proxy.log_tail()
            assert took < 30, took  # inside terminationGracePeriodSeconds: Kubernetes never SIGKILLs it
            assert client.zscore(keys.members("cg_rides"), "ddmq-proxy-0") is None  # it left the group
            assert not [qid for qid in range(8) if client.exists(keys.lease("cg_rides", "rides", qid))]
    finally:
        proxy.kill()
