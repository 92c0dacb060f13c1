"""Test support for the HTTP API: a client that checks every answer against the OpenAPI document."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from ddmq.proxy.servers.http import load_openapi

_DOC_URI = "urn:ddmq-openapi"


def _pointer(*parts: str) -> str:
    return "/".join(part.replace("~", "~0").replace("/", "~1") for part in parts)


@dataclass
class OpenApiChecker:
    """Validates real responses against the documented schema for (path, method, status).

    Records every (path template, method, status) it validated, so a test can check coverage.
    """

    document: dict[str, Any] = field(default_factory=load_openapi)
    seen: set[tuple[str, str, int]] = field(default_factory=set)

    def __post_init__(self) -> None:
        resource = Resource.from_contents(self.document, default_specification=DRAFT202012)
        self._registry: Registry[Any] = Registry().with_resource(_DOC_URI, resource)
        self._templates = [
            (template, re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"))
            for template in self.document["paths"]
        ]

    def template(self, path: str) -> str:
        for template, pattern in self._templates:
            if pattern.match(path):
                return template
        raise AssertionError(f"{path} matches no documented path")

    def check(self, method: str, path: str, status: int, content_type: str, body: bytes) -> Any:
        template = self.template(path)
        operation = self.document["paths"][template].get(method.lower())
        assert operation is not None, f"{method} {template} is not documented"
        response = operation["responses"].get(str(status))
        assert response is not None, f"{method} {template} answered {status}, which is not documented"
        pointer_parts = ["paths", template, method.lower(), "responses", str(status)]
        if "$ref" in response:
            name = response["$ref"].rsplit("/", 1)[-1]
            response = self.document["components"]["responses"][name]
            pointer_parts = ["components", "responses", name]
        content = response["content"]
        assert content_type in content, f"{method} {template} {status}: {content_type} not in {list(content)}"
        self.seen.add((template, method.lower(), status))
        if content_type != "application/json":
            return body.decode()
        data = json.loads(body)
        schema_ref = f"{_DOC_URI}#/" + _pointer(*pointer_parts, "content", content_type, "schema")
        validator = Draft202012Validator({"$ref": schema_ref}, registry=self._registry)
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.path))
        assert not errors, f"{method} {path} {status}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
        return data


class ApiClient:
    """``await api.call("POST", "/v1/pull", json=...)`` -> (status, decoded body), schema-checked."""

    def __init__(
        self, session: aiohttp.ClientSession, base: str, checker: OpenApiChecker, headers: dict[str, str] | None = None
    ) -> None:
        self.session = session
        self.base = base
        self.checker = checker
        self.headers = headers or {}

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = {**self.headers, **(headers or {})}
        if data is not None and not any(name.lower() == "content-type" for name in sent):
            sent["Content-Type"] = "application/json"  # raw bytes stand for a JSON client's body
        async with self.session.request(
            method, self.base + path, json=json, data=data, params=params, headers=sent
        ) as response:
            body = await response.read()
            return response.status, self.checker.check(method, path, response.status, response.content_type, body)
