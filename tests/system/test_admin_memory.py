"""Admin answers stay bounded in bytes and the proxy's memory stays flat while 50 dead letters of 4 MiB
each are paged through, read one by one, and replayed: a real proxy process (its RSS read from
``/proc``), real Redis, real HTTP, the default ``http.max_answer_bytes`` (4 MiB)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys, stream_entry

from ..support import ProxyProcess

MIB = 1024 * 1024
CAP = 4 * MIB
COUNT = 50
#: What the proxy may grow by while it serves the pages (the issue's bound).
MAX_GROWTH = 64 * MIB


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[tuple[ProxyProcess, str]]:
    port = free_port()
    process = ProxyProcess(
        tmp_path, redis_url, {"g": {"t": {"order_key": "KEY"}}}, {"t": {"queues": 4}},
        http={"enabled": True, "port": port},
    ).start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if requests.get(base + "/readyz", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, process.log()
        time.sleep(0.1)
    try:
        yield process, base
    finally:
        process.stop()


def test_big_dead_letters_keep_answers_under_the_cap_and_memory_flat(
    proxy: tuple[ProxyProcess, str], redis_url: str
) -> None:
    process, base = proxy
    assert process.proc is not None
    pid = process.proc.pid
    with redis.Redis.from_url(redis_url) as client:
        for i in range(COUNT):
            value = bytes([48 + i % 10]) * (4 * MIB)
            fields = stream_entry.encode_entry(value, f"k{i % 5}", None, None, 1)
            client.xadd(keys.dead_letters("g", "t"), {**dict(zip(fields[::2], fields[1::2], strict=True)),
                                                      "qid": 0, "offset": i + 1, "attempts": 1, "error": "x",
                                                      "dead_ms": 1})
    letters = f"{base}/admin/groups/g/topics/t/dead-letters"
    session = requests.Session()
    assert session.get(base + "/admin/groups", timeout=10).status_code == 200
    baseline = rss(pid)
    peak = baseline
    largest = 0
    for _ in range(3):
        ids: list[str] = []
        after: str | None = None
        while True:
            response = session.get(letters, params={"limit": 1000, **({"after": after} if after else {})}, timeout=30)
            assert response.status_code == 200
            largest = max(largest, len(response.content))
            page = response.json()
            assert all(entry["value_truncated"] and entry["value_bytes"] == 4 * MIB for entry in page["entries"])
            ids += [entry["id"] for entry in page["entries"]]
            peak = max(peak, rss(pid))
            if not page["more"]:
                break
            after = page["next_after"]
        assert len(ids) == len(set(ids)) == COUNT
        for entry_id in ids[:10]:
            response = session.get(f"{letters}/{entry_id}", timeout=30)
            assert response.status_code == 200
            largest = max(largest, len(response.content))
            peak = max(peak, rss(pid))
    print(f"\nlargest answer {largest / MIB:.2f} MiB; proxy RSS {baseline / MIB:.0f} MiB -> peak {peak / MIB:.0f} MiB "
          f"(+{(peak - baseline) / MIB:.1f} MiB) over 3 page loops and 30 reads by id")
    assert largest <= CAP
    assert peak - baseline < MAX_GROWTH, f"RSS grew {(peak - baseline) / MIB:.1f} MiB"

    # Replay works through them in chunks: each produced once into its key's queue.
    response = session.post(letters + "/replay", json={"all": True}, timeout=120)
    assert response.status_code == 200 and {k: response.json()[k] for k in ("replayed", "missing", "refused")} == {
            "replayed": COUNT, "missing": [], "refused": []}
    # (RSS grows now, but by the group's readers: they fetch the replayed messages for its consumers.)
    print(f"after replaying {COUNT} x 4 MiB: proxy RSS {rss(pid) / MIB:.0f} MiB")
    with redis.Redis.from_url(redis_url) as client:
        assert sum(client.xlen(keys.stream("t", qid)) for qid in range(4)) == COUNT
        assert client.xlen(keys.dead_letters("g", "t")) == 0
