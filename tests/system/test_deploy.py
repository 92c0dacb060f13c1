"""The Grafana dashboard and the Prometheus alert rules under ``deploy/`` use only metrics a real
proxy exports: every PromQL expression is parsed (promql-parser) and each metric it selects must be
in a scrape of a running proxy's ``/metrics`` with traffic behind it, with every label the expression
matches on or aggregates by. Both label modes (per (group, topic), and ``metrics.per_queue``) are
scraped: the rules and the dashboard work with either."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ddmq.protocol.produce.producer import AsyncProducer

from ..http_support import ApiClient, OpenApiChecker
from ..proxy.conftest import running_proxy
from ..proxy.ops.test_metrics import TENANTS_ONLY
from ..proxy.servers.test_http_api import eventually, pull

DEPLOY = Path(__file__).parents[2] / "deploy"
#: Series Prometheus makes itself for every target, and the labels it adds to every series.
PROMETHEUS_OWN = {"up"}
#: Exported only by topics with ``fair_key`` (``tests/proxy/ops/test_metrics.py::test_tenant_series``
#: checks them), with these labels.
TENANT_LABELS = {"group", "topic", "tenant"}
TARGET_LABELS = {"instance", "job"}
_LABEL_VALUES = re.compile(r"^label_values\((.+),\s*[a-zA-Z_]+\)$")


def selected_metrics(expression: str) -> set[str]:
    """Names of the metrics an expression selects (Grafana's interval variables made concrete)."""
    node = promql_parser.parse(expression.replace("$__rate_interval", "5m").replace("$__interval", "1m"))
    names: set[str] = set()
    stack: list[Any] = [node]
    while stack:
        node = stack.pop()
        if type(node).__name__ == "VectorSelector":
            assert node.name, f"a selector without a metric name in {expression!r}"
            names.add(node.name)
        for attribute in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
            child = getattr(node, attribute, None)
            if isinstance(child, list):
                stack.extend(child)
            elif child is not None and not isinstance(child, int | float | str):
                stack.append(child)
    return names


def _children(node: Any) -> list[Any]:
    found: list[Any] = []
    for attribute in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
        child = getattr(node, attribute, None)
        if isinstance(child, list):
            found.extend(child)
        elif child is not None and not isinstance(child, int | float | str):
            found.append(child)
    return found


def label_uses(expression: str) -> list[tuple[str, set[str]]]:
    """(metric, labels the expression needs it to have): those its selector matches on, and those
    of every ``by (...)`` above it."""
    node = promql_parser.parse(expression.replace("$__rate_interval", "5m").replace("$__interval", "1m"))
    uses: list[tuple[str, set[str]]] = []
    stack: list[tuple[Any, frozenset[str]]] = [(node, frozenset())]
    while stack:
        node, above = stack.pop()
        modifier = getattr(node, "modifier", None)
        if type(node).__name__ == "AggregateExpr" and modifier is not None and str(modifier).startswith("by"):
            above = above | set(modifier.labels)
        if type(node).__name__ == "VectorSelector":
            uses.append((node.name, set(above) | {m.name for m in node.matchers.matchers} - {"__name__"}))
        stack.extend((child, above) for child in _children(node))
    return uses


def dashboard_expressions() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "ddmq-proxy.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.match(variable["query"])
            assert match, variable["query"]
            expressions.append(match.group(1))
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    return expressions


def alert_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((DEPLOY / "prometheus" / "ddmq-alerts.yml").read_text())
    rules: list[dict[str, Any]] = [rule for group in document["groups"] for rule in group["rules"]]
    return rules


def test_the_alerts_cover_lag_time_lag_dead_letters_owners_and_parked_keys() -> None:
    rules = alert_rules()
    for rule in rules:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("info", "warning", "critical") and rule["annotations"]["summary"]
    used = set().union(*(selected_metrics(rule["expr"]) for rule in rules))
    assert {"ddmq_lag_messages", "ddmq_lag_seconds", "ddmq_messages_dead_lettered_total",
            "ddmq_queues_without_owner", "ddmq_messages_expired_total", "ddmq_redis_used_memory_bytes",
            "ddmq_redis_maxmemory_bytes", "ddmq_keys", "ddmq_held_messages", "ddmq_tenant_held_keys"} <= used
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["ddmq-alerts.yml"]


def test_label_uses_sees_matchers_and_aggregations() -> None:
    uses = label_uses('max(sum by (group, topic) (rate(x_total{event="read"}[5m]))) / sum by (instance) (y)')
    assert sorted((name, sorted(labels)) for name, labels in uses) == [
        ("x_total", ["event", "group", "topic"]), ("y", ["instance"])]


@pytest.mark.parametrize("per_queue", [False, True], ids=["per_topic", "per_queue"])
async def test_every_metric_the_dashboard_and_alerts_use_is_exported(redis_url: str, per_queue: bool) -> None:
    config = {"order_key": "KEY", "max_retry": 0}
    metrics = {"per_queue": per_queue}
    async with running_proxy(redis_url, config, http={"enabled": True, "port": 0}, metrics=metrics) as service:
        base = f"http://127.0.0.1:{service.http_port}"
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": "a", "value": "1"}, {"key": "b", "value": "2"}])
        async with aiohttp.ClientSession() as session:
            api = ApiClient(session, base, OpenApiChecker())
            taken = []
            while len(taken) < 2:
                batch = await pull(api, max_batch=10)
                taken += [(batch["qid"], m["offset"]) for m in batch["messages"]]
            (ok_qid, ok_offset), (bad_qid, bad_offset) = taken
            results = [{"topic": "t", "qid": ok_qid, "success": [ok_offset]},
                       {"topic": "t", "qid": bad_qid, "fail": [bad_offset]}]
            assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": results}))[0] == 200
            exported: dict[str, set[str]] = {}

            async def dead_lettered() -> bool:
                status, text = await api.call("GET", "/metrics")
                assert status == 200
                samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
                exported.clear()
                for sample in samples:
                    exported.setdefault(sample.name, set()).update(sample.labels)
                return any(sample.name == "ddmq_dead_letters" and sample.value == 1 for sample in samples)

            await eventually(dead_lettered)
    assert per_queue == ("qid" in exported["ddmq_lag_messages"])
    expressions = dashboard_expressions() + [rule["expr"] for rule in alert_rules()]
    used = set().union(*(selected_metrics(expression) for expression in expressions))
    assert used - PROMETHEUS_OWN - TENANTS_ONLY <= exported.keys(), sorted(used - PROMETHEUS_OWN - exported.keys())
    tenants = [(expression, name, sorted(labels - TENANT_LABELS - TARGET_LABELS))
               for expression in expressions for name, labels in label_uses(expression)
               if name in TENANTS_ONLY and labels - TENANT_LABELS - TARGET_LABELS]
    assert not tenants, tenants
    assert any(name.startswith("process_") for name in used) and "ddmq_pull_duration_seconds_bucket" in used
    missing = [(expression, name, sorted(labels - exported[name] - TARGET_LABELS))
               for expression in expressions for name, labels in label_uses(expression)
               if name not in PROMETHEUS_OWN | TENANTS_ONLY and labels - exported[name] - TARGET_LABELS]
    assert not missing, missing
