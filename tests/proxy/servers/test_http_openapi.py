"""The OpenAPI document is valid, documents exactly the routes the app serves, and real answers of
every operation validate against it."""

from __future__ import annotations

import json
import random
import re
from importlib import resources
from typing import Any

import aiohttp
import jsonschema
import pytest
import yaml
from openapi_spec_validator import validate

from ddmq.actions.job import JobState
from ddmq.config import parse
from ddmq.config.schema import TopicConfig
from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.proxy.api.requests import MAX_QID, REQUEST_BOUNDS
from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.servers.http import build_app, load_openapi
from ddmq.proxy.servers.http.admin import KeyActionIn
from ddmq.proxy.servers.http.pull_api import AckIn, FailDetailIn, PullIn, ResultIn
from ddmq.proxy.servers.http.view import ProxyView
from ddmq.proxy.service import ProxyService
from ddmq.proxy.store.dead_letters import check_id

from ...http_support import ApiClient, OpenApiChecker
from ..conftest import running_proxy


def test_the_document_is_valid_openapi() -> None:
    validate(load_openapi())


def test_every_route_is_documented_and_every_documented_operation_is_served() -> None:
    config = parse({"redis": "redis://127.0.0.1:1", "http": {"enabled": True}})
    service = ProxyService(config)
    view = ProxyView(service.registry, service.api, service.metrics, service.clients, lambda: service.running)
    app = build_app(view, config.http)
    served = {
        (route.resource.canonical, route.method.lower())
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    documented = {
        (path, method)
        for path, item in load_openapi()["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }
    assert served == documented


async def test_real_answers_of_every_operation_validate(redis_url: str) -> None:
    config = {"order_key": "KEY", "max_retry": 0, "retry_intervals_ms": [10]}
    checker = OpenApiChecker()
    async with running_proxy(redis_url, config, http={"enabled": True, "port": 0}) as service:
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch(
                "t",
                [
                    {"key": "a", "value": "text", "qid": 0, "tag": "x", "properties": {"p": "1"}},
                    {"key": "a", "value": b"\x00\xff", "qid": 0},
                ],
            )
        async with aiohttp.ClientSession() as session:
            api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", checker)
            status, batch = await api.call("POST", "/v1/pull", json={"group": "g", "topic": "t", "linger_ms": 5000})
            assert status == 200 and len(batch["messages"]) == 1  # key a: one at a time
            for path in (
                "/admin/groups",
                "/admin/groups/g",
                "/admin/groups/g/in-flight",
                "/admin/groups/g/blocked-keys",
                "/admin/groups/g/clients",
            ):
                assert (await api.call("GET", path))[0] == 200
            fail = [{"topic": "t", "qid": batch["qid"], "fail": [batch["messages"][0]["offset"]]}]
            status, second = await api.call(
                "POST",
                "/v1/pull",
                json={
                    "group": "g",
                    "topic": "t",
                    "linger_ms": 5000,
                    "results": fail,
                },
            )
            assert status == 200 and second["messages"][0]["value_text"] is None
            status, keys = await api.call("GET", "/admin/groups/g/topics/t/keys")
            assert status == 200 and keys["keys"][0]["key"] == "a" and keys["counts"]["in_flight"] == 1
            status, explained = await api.call("GET", "/admin/groups/g/topics/t/keys/explain", params={"key": "a"})
            assert status == 200 and explained["queues"][0]["state"] == "in_flight", explained
            status, acted = await api.call("POST", "/admin/groups/g/topics/t/keys/retry", json={"key": "a"})
            assert status == 200 and acted["applied"] == [{"qid": 0, "state": "in_flight"}]
            assert (
                await api.call(
                    "POST",
                    "/v1/ack",
                    json={
                        "group": "g",
                        "results": [{"topic": "t", "qid": second["qid"], "success": [second["messages"][0]["offset"]]}],
                    },
                )
            )[0] == 200
            letters = "/admin/groups/g/topics/t/dead-letters"
            status, page = await api.call("GET", letters)
            assert status == 200 and page["total"] == 1 and page["entries"][0]["tag"] == "x"
            status, entry = await api.call("GET", f"{letters}/{page['entries'][0]['id']}")
            assert status == 200 and entry["id"] == page["entries"][0]["id"] and not entry["value_truncated"]
            assert (await api.call("POST", letters + "/replay", json={"ids": [page["entries"][0]["id"]]}))[0] == 200
            assert (await api.call("POST", letters + "/purge", json={"all": True}))[0] == 200
            paused = await api.call("POST", "/admin/groups/g/pause", json={"for_ms": 60_000, "by": "test"})
            assert paused[0] == 200 and paused[1]["paused"][0]["by"] == "test"
            assert (await api.call("GET", "/admin/groups/g/pause"))[0] == 200
            assert (await api.call("POST", "/admin/groups/g/resume", json={}))[1]["paused"] == []
            status, actions = await api.call("GET", "/admin/actions", params={"limit": "5"})
            assert status == 200 and [a["action"] for a in actions["actions"]][:2] == ["resume", "pause"]
            for path in ("/healthz", "/readyz", "/metrics", "/", "/console", "/console/console.js",
                         "/console/console.css", "/admin/groups/g/lag-history"):
                assert (await api.call("GET", path))[0] == 200
            status, document = await api.call("GET", "/openapi.json")
            assert status == 200 and document == json.loads(json.dumps(load_openapi()))
            assert (await api.call("POST", "/v1/pull", json={"group": "nope"}))[0] == 404

    documented_success = {
        (path, method, int(status))
        for path, item in checker.document["paths"].items()
        for method, operation in item.items()
        for status in operation["responses"]
        if status.startswith("2")
    }
    assert documented_success <= checker.seen, documented_success - checker.seen


BOUND_KEYWORDS = ("minimum", "maximum", "minLength", "maxLength", "maxItems", "minItems")


def _bounds(node: Any, defs: dict[str, Any]) -> set[tuple[str, int]]:
    """Every bound a schema node sets, through $ref, anyOf/oneOf and nullable types (not into items)."""
    ref = node.get("$ref")
    if ref is not None:
        return _bounds(defs[ref.rsplit("/", 1)[1]], defs)
    found = {(key, node[key]) for key in BOUND_KEYWORDS if key in node}
    for branch in [*node.get("anyOf", ()), *node.get("oneOf", ())]:
        found |= _bounds(branch, defs)
    if "items" in node:
        found |= {(f"items.{key}", value) for key, value in _bounds(node["items"], defs)}
    return found


@pytest.mark.parametrize(
    ("model", "name"),
    [(PullIn, "PullRequest"), (AckIn, "AckRequest"), (ResultIn, "Result"), (FailDetailIn, "FailDetail")],
)
def test_the_pull_and_ack_bodies_have_the_codes_bounds(model: type[Any], name: str) -> None:
    """The document's bounds are the models' (which take them from the request rules' table)."""
    document = load_openapi()["components"]["schemas"]
    _same_bounds(model, document[name], document, name)


def test_the_key_action_body_and_the_keys_filter_have_the_codes_bounds() -> None:
    document = load_openapi()
    keys = "/admin/groups/{group}/topics/{topic}/keys"
    body = document["paths"][keys + "/{action}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    _same_bounds(KeyActionIn, body, document["components"]["schemas"], "key action")
    (key,) = [p for p in document["paths"][keys]["get"]["parameters"] if p.get("name") == "key"]
    assert key["schema"]["maxLength"] == REQUEST_BOUNDS["key"].high


def _same_bounds(model: type[Any], documented: dict[str, Any], document: dict[str, Any], name: str) -> None:
    code = model.model_json_schema(ref_template="#/$defs/{model}")
    code_defs = code.get("$defs", {})
    assert set(code["properties"]) == set(documented["properties"])
    for field, schema in code["properties"].items():
        item_ref = schema.get("items", {}).get("$ref")
        if item_ref is not None:  # a nested model: checked by its own case
            continue
        assert _bounds(schema, code_defs) == _bounds(documented["properties"][field], document), (name, field)
    assert set(code.get("required", ())) == set(documented.get("required", ())), name


def test_the_request_rules_bound_what_the_models_take() -> None:
    schema = PullIn.model_json_schema()["properties"]
    for field in ("max_batch", "linger_ms", "max_per_key"):
        bound = REQUEST_BOUNDS[field]
        assert {("minimum", bound.low), ("maximum", bound.high)} <= _bounds(schema[field], {}), field
    assert {("minLength", REQUEST_BOUNDS["group"].low), ("maxLength", REQUEST_BOUNDS["group"].high)} == _bounds(
        schema["group"], {})
    assert MAX_QID + 1 == TopicConfig.model_fields["queues"].metadata[-1].le


def test_every_operation_documents_the_statuses_every_route_can_answer() -> None:
    """The middlewares answer every route: 500 (1500) for a bug; the parser 414 and 431; a body's
    reader 400, 408, 413 and 415; the guard 401 and 403 on /v1 and /admin, each under the token
    scheme of its prefix. The servers entry is relative: the address the document was fetched from."""
    document = load_openapi()
    assert document["servers"] == [{"url": "/"}]
    assert set(document["components"]["securitySchemes"]) == {"adminToken", "dataToken"}
    for path, item in document["paths"].items():
        for method, operation in item.items():
            want = {"500", "414", "431"}  # a request line or a header past aiohttp's parser's bound
            if "requestBody" in operation:
                want |= {"400", "408", "413", "415"}
            if path.startswith(("/v1/", "/admin/")):
                want |= {"401", "403"}
                scheme = "dataToken" if path.startswith("/v1/") else "adminToken"
                assert operation["security"] == [{}, {scheme: []}], (method, path)
            assert want <= set(operation["responses"]), (method, path, want - set(operation["responses"]))


@pytest.mark.parametrize(
    ("body", "replay", "purge"),
    [
        ({"ids": ["1-0"]}, True, True),
        ({"all": True}, True, True),
        ({"all": True, "key": None}, True, True),
        ({"all": True, "ids": None}, True, True),
        ({"key": "k"}, True, False),
        ({"ids": [], "all": True}, False, False),
        ({"key": "k", "all": True}, False, False),
        ({"key": "k", "ids": ["1-0"]}, False, False),
        ({}, False, False),
        ({"all": False}, False, False),
    ],
)
async def test_replay_and_purge_bodies_are_valid_by_the_document_exactly_when_the_proxy_takes_them(
    body: dict[str, Any], replay: bool, purge: bool, redis_url: str
) -> None:
    """Each body (as a dry run: nothing is touched) against the document and a real proxy."""
    document = load_openapi()
    letters = "/admin/groups/g/topics/t/dead-letters/"
    async with running_proxy(redis_url, None, http={"enabled": True, "port": 0}) as service:
        async with aiohttp.ClientSession() as session:
            api = ApiClient(session, f"http://127.0.0.1:{service.http_port}", OpenApiChecker())
            for name, takes, route in (("Selection", replay, "replay"), ("PurgeSelection", purge, "purge")):
                schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
                assert jsonschema.Draft202012Validator(schema).is_valid(body) == takes, (name, body)
                status, answer = await api.call("POST", letters + route, json={**body, "dry_run": True})
                assert status == (200 if takes else 400), (route, body, answer)


def test_the_job_states_are_the_engines() -> None:
    job = load_openapi()["components"]["schemas"]["Job"]["properties"]["state"]
    assert job["enum"] == [state.name.lower() for state in JobState]


def _takes_id(entry_id: str) -> bool:
    try:
        check_id(entry_id)
    except BadRequestError:
        return False
    return True


def test_the_entry_id_pattern_takes_exactly_the_ids_the_proxy_takes() -> None:
    """Two numbers below 2^64: the pattern spells the bound digit by digit, so it is held to the code
    around every digit of 2^64 - 1 and at random."""
    documented = load_openapi()["components"]["schemas"]["EntryId"]["pattern"]
    assert documented.startswith("^") and documented.endswith("$")
    pattern = re.compile(documented[:-1] + r"\Z")  # ECMA-262's $: the end, not before a last newline
    rng = random.Random(48)
    top = 2**64
    numbers = [0, 1, 10**19 - 1, 10**19, top - 1, top, top + 1, 10**20 - 1, 10**20]
    numbers += [top - 1 - rng.randrange(10**k) for k in range(1, 20) for _ in range(30)]
    numbers += [top + rng.randrange(10**k) for k in range(1, 19) for _ in range(30)]
    numbers += [rng.randrange(2**67) for _ in range(500)]
    ids = [form.format(n) for n in numbers for form in ("{0}-0", "0-{0}", "0{0}-1", "{0}-{0}")]
    ids += ["", "1", "1-", "-1", "1-0\n", "1-0 ", "+1-0", "\u0661-0", "1.0-0", "00000000000000000001-0", "1-0-0"]
    for entry_id in ids:
        assert bool(pattern.search(entry_id)) == _takes_id(entry_id), entry_id


def test_the_document_names_no_key_twice() -> None:
    """PyYAML keeps the last of two equal keys without a word: a schema written twice hides the first."""
    text = resources.files("ddmq.proxy.servers.http").joinpath("openapi.yaml").read_text("utf-8")

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader: Strict, node: yaml.MappingNode) -> dict[Any, Any]:
        keys = [loader.construct_object(key) for key, _ in node.value]
        twice = sorted({str(key) for key in keys if keys.count(key) > 1})
        assert not twice, f"{twice} twice in the mapping at {node.start_mark}"
        return loader.construct_mapping(node)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    assert yaml.load(text, Strict) == load_openapi()  # Strict is a SafeLoader
