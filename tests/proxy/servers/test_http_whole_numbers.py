"""Whole-number floats where the HTTP API wants an integer: JSON Schema's ``integer`` admits ``60000.0``,
and a client that writes every number as a float (JavaScript's) sends such. The pause body and the admin
views' query integers take them as the integers they are; a fraction is still a 400 (1003). And the
top of a query's range: a dead-letter page after the largest id."""

from __future__ import annotations

import pytest

from ddmq.protocol.produce.producer import AsyncProducer

from .test_http_api import http_proxy


async def test_a_pause_takes_a_whole_number_float_for_ms_and_refuses_a_fraction(redis_url: str) -> None:
    async with http_proxy(redis_url) as (_, api):
        status, body = await api.call("POST", "/admin/groups/g/pause", json={"for_ms": 60000.5})
        assert status == 400 and body["code"] == 1003 and "for_ms" in body["message"], body
        status, body = await api.call("POST", "/admin/groups/g/pause", json={"for_ms": 60000.0, "by": "float"})
        assert status == 200, body
        (pause,) = body["paused"]
        assert pause["by"] == "float" and pause["until_ms"] - body["now_ms"] <= 60_000
        status, body = await api.call("POST", "/admin/groups/g/resume", json={})
        assert status == 200 and body["paused"] == [], body


@pytest.mark.parametrize(
    ("path", "query", "status"),
    [
        ("/admin/groups/g/in-flight", {"limit": "2.0", "offset": "0.00"}, 200),
        ("/admin/groups/g/blocked-keys", {"limit": "20", "offset": "1.0"}, 200),
        ("/admin/groups/g/clients", {"limit": "5.0"}, 200),
        ("/admin/groups/g", {"queue_offset": "0.0"}, 200),
        ("/admin/groups/g/topics/t/keys", {"offset": "3.0"}, 200),
        ("/admin/groups/g/in-flight", {"limit": "2.5"}, 400),
        ("/admin/groups/g/in-flight", {"limit": "2."}, 400),
        ("/admin/groups/g/in-flight", {"offset": "1e3"}, 400),
        ("/admin/groups/g/in-flight", {"offset": "-1"}, 400),
        ("/admin/groups/g/in-flight", {"offset": "٣"}, 400),  # a digit, but not an ASCII one
        ("/admin/groups/g/clients", {"limit": "0.0"}, 400),
        ("/admin/groups/g", {"queue_offset": "10000001"}, 400),
    ],
)
async def test_admin_query_integers_take_whole_number_floats(
    redis_url: str, path: str, query: dict[str, str], status: int
) -> None:
    async with http_proxy(redis_url) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send("t", "m", key="k")
        got, body = await api.call("GET", path, params=query)
        assert got == status, body
        if status == 400:
            assert body["code"] == 1003 and next(iter(query)) in body["message"], body


async def test_dead_letters_after_the_largest_id_is_an_empty_page(redis_url: str) -> None:
    """Nothing can follow 18446744073709551615-18446744073709551615 (Redis refuses that range: a 503 once)."""
    async with http_proxy(redis_url) as (_, api):
        top = f"{2**64 - 1}-{2**64 - 1}"
        status, page = await api.call("GET", "/admin/groups/g/topics/t/dead-letters", params={"after": top})
        assert status == 200 and page["entries"] == [] and page["more"] is False, page
