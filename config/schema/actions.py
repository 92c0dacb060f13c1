"""The action chain's settings: JSONPath and expression checks, ``Filter``, ``Transit``, the push actions."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from ddmq.config.schema.base import Model


def _jsonpath(value: str) -> str:
    from ddmq.config.jsonpath import check_jsonpath

    return check_jsonpath(value)


def _expression(value: str) -> str:
    from ddmq.config.expression import compile_expression

    compile_expression(value)  # raises ExpressionError (a ValueError) naming the column
    return value


JsonPath = Annotated[str, AfterValidator(_jsonpath)]
Expression = Annotated[str, AfterValidator(_expression)]


class FilterConfig(Model):
    """``Filter``: a message is kept when it passes every condition given; dropped ones finish at once."""

    #: Keep only messages with one of these tags (empty = any tag).
    tags: list[str] = []
    #: Drop messages with one of these tags.
    exclude_tags: list[str] = []
    #: Keep only messages for which this is true (see ``ddmq.config.expression``), e.g.
    #: ``$.amount >= 100 and not $.city in ['bj', 'sh']``.
    expression: Expression | None = None

    @model_validator(mode="after")
    def _something(self) -> FilterConfig:
        if not (self.tags or self.exclude_tags or self.expression):
            raise ValueError("give at least one of tags, exclude_tags, expression")
        return self


def _transit(mapping: dict[str, str]) -> dict[str, str]:
    if not mapping:
        raise ValueError("transit needs at least one field")
    fields = set(mapping)
    for name, path in mapping.items():
        parts = name.split(".")
        if not all(parts):
            raise ValueError(f"bad output field {name!r}: empty part")
        for i in range(1, len(parts)):
            if ".".join(parts[:i]) in fields:
                raise ValueError(f"output field {name!r} is inside field {'.'.join(parts[:i])!r}, also mapped")
        _jsonpath(path)
    return mapping


#: ``Transit``: output field (dots nest: ``rider.id``) -> JSONPath into the parsed body.
TransitConfig = Annotated[dict[str, str], AfterValidator(_transit)]


class AsyncHttpConfig(Model):
    """``AsyncHttp``: push each message to one of ``urls``; 2xx is success, anything else a failed attempt."""

    #: Tried round-robin, one per attempt (a retry goes to the next one).
    urls: Annotated[list[str], Field(min_length=1)]
    #: The HTTP method of every push.
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    #: Headers sent with every push (a value may take a secret from the environment with ``${VAR}``).
    headers: dict[str, str] = {}
    #: ``json``: the message body as is, ``Content-Type: application/json`` (after ``Transit``, its
    #: output); ``form``: the top-level fields of the JSON body as form fields; ``none``: no body.
    body: Literal["json", "form", "none"] = "json"
    #: Query parameter -> JSONPath into the parsed body (a parameter whose path finds nothing is left out).
    query_params: dict[str, JsonPath] = {}
    #: Sent as ``Authorization: Bearer <token>``.
    token: str | None = None
    #: Requests per second to the upstream (retries included); None = unlimited.
    http_max_tps: Annotated[float, Field(gt=0)] | None = None
    #: One attempt's time limit (connect + answer); over it the attempt failed.
    timeout_ms: Annotated[int, Field(ge=1)] = 5_000
    #: Most requests in flight at once for this group/topic (the size of its worker pool and connection pool).
    max_in_flight: Annotated[int, Field(ge=1, le=10_000)] = 32

    @field_validator("urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return urls


class RedisCommandConfig(Model):
    """One command of the ``Redis`` action, run for every message (or those matching ``when``)."""

    #: The command run for the message: ``set`` a value, ``hset``/``hmset`` fields of a hash, ``del`` the key.
    command: Literal["set", "hset", "hmset", "del"]
    #: The Redis key; ``{$.path}`` is replaced by the value found in the body, e.g. ``rider:{$.rider_id}``.
    key: str
    #: ``set``: JSONPath of the value.
    value: JsonPath | None = None
    #: ``hset`` / ``hmset``: hash field -> JSONPath (fields whose path finds nothing are left out).
    fields: dict[str, JsonPath] = {}
    #: ``set`` / ``hset`` / ``hmset``: expire the key after this.
    ttl_ms: Annotated[int, Field(ge=1)] | None = None
    #: Run the command only for messages where this expression is true.
    when: Expression | None = None

    @field_validator("key")
    @classmethod
    def _key_template(cls, key: str) -> str:
        from ddmq.config.jsonpath import parse_key_template

        parse_key_template(key)
        return key

    @model_validator(mode="after")
    def _arguments(self) -> RedisCommandConfig:
        if self.command == "set" and self.value is None:
            raise ValueError("set needs value (a JSONPath)")
        if self.command != "set" and self.value is not None:
            raise ValueError(f"value is for set, not {self.command} (hset/hmset take fields)")
        if self.command in ("hset", "hmset") and not self.fields:
            raise ValueError(f"{self.command} needs fields (hash field -> JSONPath)")
        if self.command not in ("hset", "hmset") and self.fields:
            raise ValueError(f"fields are for hset/hmset, not {self.command}")
        if self.command == "del" and self.ttl_ms is not None:
            raise ValueError("del takes no ttl_ms")
        return self


class RedisActionConfig(Model):
    """``Redis``: write fields of each message to a Redis, pipelined."""

    #: The Redis to write to (``redis://``, ``rediss://`` or ``unix://``; not a Cluster).
    url: str
    #: The commands run for every message, in this order, in one pipeline per batch.
    commands: Annotated[list[RedisCommandConfig], Field(min_length=1)]
    #: Messages per pipeline.
    batch_size: Annotated[int, Field(ge=1, le=10_000)] = 64
    #: Pipelines in flight at once.
    max_in_flight: Annotated[int, Field(ge=1, le=1_000)] = 4
    #: One pipeline's time limit; over it every message in it failed an attempt.
    timeout_ms: Annotated[int, Field(ge=1)] = 5_000

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if value.startswith(("redis://", "rediss://", "unix://")):
            return value
        raise ValueError("url must be a redis:// / rediss:// / unix:// URL")
