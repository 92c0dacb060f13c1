"""What aiohttp's parser refuses (a request line or headers too long, bytes that are no request) is
answered in the JSON error body, like every other error answer, and closes that connection only."""

from __future__ import annotations

import asyncio
import json

import pytest

from ..conftest import running_proxy

CASES = [
    (b"GET /v1/" + b"x" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414),  # the schema admits such a path
    (b"GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: " + b"y" * 9000 + b"\r\n\r\n", 431),
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
]


@pytest.mark.parametrize(("raw", "status"), CASES, ids=["request-line-too-long", "header-too-long", "garbage"])
async def test_parser_errors_are_json(raw: bytes, status: int, redis_url: str) -> None:
    async with running_proxy(redis_url, None, http={"enabled": True, "port": 0}) as service:
        reader, writer = await asyncio.open_connection("127.0.0.1", service.http_port)
        try:
            writer.write(raw)
            await writer.drain()
            answer = await asyncio.wait_for(reader.read(), 5)  # read to the close
        finally:
            writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        assert lines[0].split(" ")[1] == str(status), lines[0]  # HTTP/1.0: aiohttp read no version
        assert "content-type: application/json; charset=utf-8" in (line.lower() for line in lines)
        error = json.loads(body)
        assert error["code"] == 1003 and error["retriable"] is False and error["message"], error
        # The server still answers the next client.
        reader, writer = await asyncio.open_connection("127.0.0.1", service.http_port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()
