"""The HTTP API under an OpenAPI fuzzer: schemathesis, from the document the proxy serves, against a real
proxy process with an admin token and a data token, after a workload was produced.

Every check of schemathesis runs (no 5xx, every status and body and header as documented, bad input
refused and good input taken, auth enforced), bounded in examples per operation and in time. Most of
the path groups and topics name the proxy's own (a dictionary of schemathesis), so the calls reach the
handlers rather than the unknown-group 404. Afterwards the proxy still serves (``/healthz``), and once
whatever the fuzzer paused or parked is lifted, a consumer gets the rest of every key in order (from
where the fuzzer, a client too, left it: what it pulled and acked with a guessed offset is consumed)
and the committed offsets reach the produced ones: whatever the fuzzer sent, nothing was lost.

Run it by hand with more time: ``DDMQ_FUZZ_SECONDS=600 DDMQ_FUZZ_EXAMPLES=500 .venv/bin/pytest
tests/system/test_http_fuzz.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from ddmq.protocol.net import free_port
from ddmq.protocol.redis.stream_entry import REPLAY_GROUP

from ..support import ProxyProcess, produce_keyed

GROUP = "cg_rides"  # the names of the document's examples
TOPIC = "rides"
QUEUES = 4
KEYS = 40
MESSAGES = 400
ADMIN_TOKEN = "fuzz-admin-token-0123456789"
DATA_TOKEN = "fuzz-data-token-0123456789"
SECONDS = int(os.environ.get("DDMQ_FUZZ_SECONDS", "100"))
EXAMPLES = int(os.environ.get("DDMQ_FUZZ_EXAMPLES", "40"))
SEED = os.environ.get("DDMQ_FUZZ_SEED", "20261202")

SCHEMATHESIS_CONFIG = f"""
[auth.openapi.adminToken]
bearer = "{ADMIN_TOKEN}"

[auth.openapi.dataToken]
bearer = "{DATA_TOKEN}"

[dictionaries.groups]
values = ["{GROUP}"]

[dictionaries.topics]
values = ["{TOPIC}"]

[parameters]
"path.group" = {{ dictionary = "groups", probability = 0.8 }}
"path.topic" = {{ dictionary = "topics", probability = 0.8 }}

[checks.negative_data_rejection]
# What aiohttp's parser refuses before any route sees it (a query past the request line's bound) is a
# 414, a header past its bound 431: both the JSON error, as documented.
expected-statuses = [400, 401, 403, 404, 405, 406, 409, 413, 414, 415, 422, 428, 429, 431]
"""


def _proxy(tmp_path: Path, redis_url: str, http_port: int) -> ProxyProcess:
    group = {
        TOPIC: {
            "actions": ["Json", "Order", "PullServer"],
            "order_key": "$.k",
            "timeout_ms": 1000,
            # A fuzzed fail may hit a real message: retried soon, and never dead-lettered.
            "max_retry": 1000,
            "retry_intervals_ms": [20, 50],
        }
    }
    http = {
        "enabled": True,
        "host": "127.0.0.1",
        "port": http_port,
        "admin_token": ADMIN_TOKEN,
        "data_token": DATA_TOKEN,
        "max_linger_ms": 200,  # a fuzzed pull parks at most this long
    }
    return ProxyProcess(tmp_path, redis_url, {GROUP: group}, {TOPIC: {"queues": QUEUES}}, http=http)


def _schemathesis(base: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "schemathesis.toml"
    config.write_text(SCHEMATHESIS_CONFIG)
    command = [
        str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "run",
        f"{base}/openapi.json", "--checks", "all", "--mode", "all", "--max-examples", str(EXAMPLES),
        "--max-time", str(SECONDS), "--seed", SEED, "--workers", "1", "--request-timeout", "10",
        "--phases", "examples,coverage,fuzzing", "--no-color",
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=SECONDS + 300, cwd=tmp_path,
                          env={**os.environ, "SCHEMATHESIS_HOOKS": ""})


async def _call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN if '/admin/' in url else DATA_TOKEN}"}
    async with session.request(method, url, json=body, headers=headers) as response:
        return response.status, await response.json()


async def _lift_what_the_fuzzer_left(session: aiohttp.ClientSession, base: str) -> None:
    """Resume the group's pauses and resume its parked keys: an operator's actions the fuzzer may have
    taken with the real names, which hold deliveries back by design."""
    status, answer = await _call(session, "POST", f"{base}/admin/groups/{GROUP}/resume", {"by": "fuzz test"})
    assert status == 200 and answer["paused"] == [], answer
    keys = f"{base}/admin/groups/{GROUP}/topics/{TOPIC}/keys"
    status, answer = await _call(session, "GET", f"{keys}?state=parked")
    assert status == 200, answer
    for row in answer["keys"]:
        status, acted = await _call(session, "POST", f"{keys}/resume", {"key": row["key"], "by": "fuzz test"})
        assert status == 200, acted


async def _consume_all(
    session: aiohttp.ClientSession, base: str
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Pull and ack until a pull finds nothing and the committed offsets reach the produced ones; each
    key's sequence numbers as delivered, and apart from them those of replayed dead letters. (The fuzzer
    is a client too: a message it pulled and acked with a guessed offset is consumed, so a key may start
    past 0 here, never go back. It may also skip a key's head, which dead-letters it, and replay the
    dead letters: such a message comes again after its key's later ones, as documented for
    ``on_exhausted: dead_letter``, carrying ``ddmq.replay.group``.)"""
    seqs: dict[str, list[int]] = {}
    replayed: dict[str, list[int]] = {}
    pending: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 90
    while True:
        assert loop.time() < deadline, "the queues did not drain"
        request = {"group": GROUP, "topic": TOPIC, "max_batch": 64, "linger_ms": 200, "results": pending}
        status, answer = await _call(session, "POST", f"{base}/v1/pull", request)
        assert status == 200, answer
        offsets = []
        for message in answer["messages"]:
            event = json.loads(message["value_text"])
            into = replayed if REPLAY_GROUP in message["properties"] else seqs
            into.setdefault(event["k"], []).append(event["seq"])
            offsets.append(message["offset"])
        pending = [{"topic": TOPIC, "qid": answer["qid"], "success": offsets}] if offsets else []
        if not offsets and await _committed_everything(session, base):
            return seqs, replayed


async def _committed_everything(session: aiohttp.ClientSession, base: str) -> bool:
    status, group = await _call(session, "GET", f"{base}/admin/groups/{GROUP}")
    assert status == 200, group
    return all(q["committed"] == q["produced"] for q in group["queues"])


@pytest.mark.timeout(SECONDS + 420)
async def test_the_fuzzer_finds_nothing_and_nothing_is_lost(redis_url: str, tmp_path: Path) -> None:
    http_port = free_port()
    base = f"http://127.0.0.1:{http_port}"
    proxy = _proxy(tmp_path, redis_url, http_port).start()
    try:
        produced: dict[str, int] = {}
        await asyncio.to_thread(produce_keyed, redis_url, MESSAGES, produced, random.Random(7), keys=KEYS, topic=TOPIC)
        run = await asyncio.to_thread(_schemathesis, base, tmp_path)
        assert run.returncode == 0, f"schemathesis found something:\n{run.stdout[-20000:]}\n{run.stderr[-3000:]}"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            async with session.get(f"{base}/healthz") as response:
                assert response.status == 200 and (await response.json())["status"] == "ok"
            await _lift_what_the_fuzzer_left(session, base)
            seqs, replayed = await _consume_all(session, base)
            # Every key in order from where the fuzzer left it, through its last message unless the
            # fuzzer acked that one too; every offset committed (_consume_all's end).
            for key, got in seqs.items():
                assert got == sorted(got) and got[-1] <= produced[key] - 1, (key, got)
                assert got == list(range(got[0], got[-1] + 1)), (key, got)
            assert set(seqs) <= set(produced)
            # A replayed dead letter is one of its key's messages the fuzzer skipped: never one of those
            # delivered here in the key's order (those were not dead-lettered), never one not produced.
            for key, got in replayed.items():
                assert all(0 <= seq < produced[key] and seq not in seqs.get(key, ()) for seq in got), (key, got)
    finally:
        assert proxy.stop() == 0, proxy.log()[-5000:]
