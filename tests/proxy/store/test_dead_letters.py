"""Dead letters against a real proxy and real Redis: answers bounded in bytes (pages stop early and say
where to go on, values cut in listings, whole by id), and replay exactly once per entry under double
clicks, a racing purge, several proxies, and crashes between its steps. Every replay ends with a
consume that checks each message arrives once and each key's messages in order."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import redis.asyncio

from ddmq.protocol.produce.producer import AsyncProducer
from ddmq.protocol.redis import keys, stream_entry
from ddmq.protocol.redis.connection import async_redis
from ddmq.protocol.redis.hashing import queue_for_key
from ddmq.protocol.redis.queues import ensure_topic
from ddmq.proxy.core.types import StoredMessage
from ddmq.proxy.service import ProxyService
from ddmq.proxy.store.dead_letters import DeadLetters

from ...http_support import ApiClient
from ..servers.test_http_api import http_proxy, pull

LETTERS = "/admin/groups/g/topics/t/dead-letters"
#: The smallest cap the config allows, so a test needs few and small entries to reach it.
CAP = 64 * 1024


async def dead_letter(service: ProxyService, key: str, value: bytes, offset: int = 1) -> None:
    """Through the broker's own dead-lettering (what the pull buffer calls), from the key's queue."""
    assert service.broker is not None
    qid = queue_for_key(key, 4)
    await service.broker.dead_letter("g", "t", qid, StoredMessage(offset, value, key, "", {}, 1), 1, "test")


async def consume_all(api: ApiClient, count: int) -> list[tuple[str, str]]:
    """Pull and ack until ``count`` messages arrived; (key, value) in delivery order."""
    seen: list[tuple[str, str]] = []
    while len(seen) < count:
        body = await pull(api, max_batch=100, linger_ms=1000)
        if not body["messages"]:
            break
        seen += [(m["key"], m["value_text"]) for m in body["messages"]]
        acks = [{"topic": "t", "qid": body["qid"], "success": [m["offset"] for m in body["messages"]]}]
        assert (await api.call("POST", "/v1/ack", json={"group": "g", "results": acks}))[0] == 200
    return seen


def assert_once_in_order(seen: list[tuple[str, str]], sent: list[tuple[str, str]]) -> None:
    assert sorted(seen) == sorted(sent), "every dead letter delivered exactly once"
    for key in {k for k, _ in sent}:
        assert [v for k, v in seen if k == key] == [v for k, v in sent if k == key], f"order of key {key}"


async def queue_entries(redis_client: redis.asyncio.Redis, queues: int = 4) -> int:
    return sum([int(await redis_client.xlen(keys.stream("t", qid))) for qid in range(queues)])


async def replayed_for(redis_client: redis.asyncio.Redis, queues: int = 4) -> set[str | None]:
    """The groups the queues' entries are addressed to (None: every group)."""
    groups: set[str | None] = set()
    for qid in range(queues):
        for _, fields in await redis_client.xrange(keys.stream("t", qid)):
            groups.add(stream_entry.decode_properties(fields.get(stream_entry.PROPERTIES)).get(stream_entry.REPLAY_GROUP))
    return groups


async def test_pages_stop_at_the_byte_cap_and_say_where_to_go_on(redis_url: str) -> None:
    http = {"max_answer_bytes": CAP, "max_listed_value_bytes": 1024}
    async with http_proxy(redis_url, {"order_key": "KEY"}, http=http) as (service, api):
        values = [bytes([65 + i % 26]) * 20_000 for i in range(30)]  # 20 KB each: 600 KB in all
        for i, value in enumerate(values):
            await dead_letter(service, f"k{i}", value, offset=i + 1)
        ids: list[str] = []
        after: str | None = None

        while True:
            params = {"limit": "1000", **({"after": after} if after else {})}
            async with api.session.get(api.base + LETTERS, params=params) as response:
                raw = await response.read()
            assert response.status == 200 and len(raw) <= CAP
            page = api.checker.check("GET", LETTERS, 200, "application/json", raw)
            for entry in page["entries"]:
                assert entry["value_truncated"] and entry["value_bytes"] == 20_000
                assert len(base64.b64decode(entry["value_base64"])) == 1024 and len(entry["value_text"]) == 1024
            ids += [entry["id"] for entry in page["entries"]]
            if not page["more"]:
                break
            after = page["next_after"]
        assert len(ids) == len(set(ids)) == 30 and ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))

        # By id the whole value comes back, while it fits the cap; a larger one is cut there.
        status, entry = await api.call("GET", f"{LETTERS}/{ids[0]}")
        assert status == 200 and not entry["value_truncated"] and base64.b64decode(entry["value_base64"]) == values[0]
        await dead_letter(service, "big", b"\xff" * 200_000, offset=99)
        status, page = await api.call("GET", LETTERS, params={"after": ids[-1]})
        (big,) = page["entries"]
        async with api.session.get(f"{api.base}{LETTERS}/{big['id']}") as response:
            raw = await response.read()
        assert response.status == 200 and len(raw) <= CAP
        entry = api.checker.check("GET", f"{LETTERS}/{big['id']}", 200, "application/json", raw)
        assert entry["value_truncated"] and entry["value_bytes"] == 200_000 and entry["value_text"] is None
        status, error = await api.call("GET", f"{LETTERS}/1-0")
        assert (status, error["code"]) == (404, 1003)


async def test_uncut_pages_stop_early_too(redis_url: str) -> None:
    """Values under the listing cut, but many: the page stops before the cap and ``more`` says so."""
    http = {"max_answer_bytes": CAP, "max_listed_value_bytes": 16 * 1024}
    async with http_proxy(redis_url, http=http) as (service, api):
        for i in range(20):
            await dead_letter(service, f"k{i}", b"x" * 10_000, offset=i + 1)
        seen: list[str] = []
        after: str | None = None
        while True:
            async with api.session.get(
                api.base + LETTERS, params={"limit": "100", **({"after": after} if after else {})}
            ) as response:
                raw = await response.read()
                assert len(raw) <= CAP
            page = api.checker.check("GET", LETTERS, 200, "application/json", raw)
            assert 0 < len(page["entries"]) < 20 or not page["more"]
            assert not any(entry["value_truncated"] for entry in page["entries"])
            seen += [entry["id"] for entry in page["entries"]]
            if not page["more"]:
                break
            after = page["next_after"]
        assert len(seen) == len(set(seen)) == 20


async def test_concurrent_replays_produce_each_dead_letter_once_in_key_order(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        sent = [(f"k{i % 5}", f"v{i:03d}") for i in range(60)]
        for i, (key, value) in enumerate(sent):
            await dead_letter(service, key, value.encode(), offset=i + 1)
        answers = await asyncio.gather(
            *(api.call("POST", LETTERS + "/replay", json={"all": True}) for _ in range(8))
        )
        assert all(status == 200 for status, _ in answers)
        assert sum(answer["replayed"] for _, answer in answers) == 60
        assert await queue_entries(redis_client) == 60
        assert (await api.call("GET", LETTERS))[1]["total"] == 0
        assert await redis_client.xlen(keys.dead_letter_claims("g", "t")) == 0
        assert_once_in_order(await consume_all(api, 60), sent)


async def test_a_replay_racing_a_purge_takes_each_entry_once(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        sent = [(f"k{i % 3}", f"v{i:03d}") for i in range(300)]
        for i, (key, value) in enumerate(sent):
            await dead_letter(service, key, value.encode(), offset=i + 1)
        # Two proxies' worth of callers: the lock of one proxy does not order them, the claims do.
        other = DeadLetters(service.redis, "g", "t", max_bytes=2000)  # type: ignore[arg-type]
        (_, replayed), purged, again = await asyncio.gather(
            api.call("POST", LETTERS + "/replay", json={"all": True}), other.purge(None), other.replay(None)
        )
        produced = replayed["replayed"] + again.replayed
        assert produced + purged == 300
        assert await queue_entries(redis_client) == produced
        seen = await consume_all(api, produced)
        assert len(seen) == produced and len(set(seen)) == produced and set(seen) <= set(sent)


async def test_a_crash_between_steps_loses_nothing_and_duplicates_nothing(
    redis_url: str, redis_client: redis.asyncio.Redis
) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        letters = DeadLetters(service.redis, "g", "t", max_bytes=300)  # type: ignore[arg-type]
        for round_, produced_before_crash in enumerate((False, True)):
            sent = [(f"k{i % 4}", f"r{round_}-v{i:03d}") for i in range(40)]
            for i, (key, value) in enumerate(sent):
                await dead_letter(service, key, value.encode(), offset=i + 1)
            last = (await DeadLetters(service.redis, "g", "t").read(limit=1000)).entries[-1].id  # type: ignore[arg-type]
            # A replay dies after claiming a chunk (step 1), or after producing it too (step 2).
            _, claimed = await letters.claim(("range", last))
            assert claimed and await letters.count() == 40 - len(claimed)
            if produced_before_crash:
                assert await letters.produce_claimed(claimed, release=False) == len(claimed)
            before = await queue_entries(redis_client)
            # The next replay finishes the claims first, then replays the rest: each entry once, in order.
            status, answer = await api.call("POST", LETTERS + "/replay", json={"all": True})
            assert status == 200
            assert answer["replayed"] == 40 - (len(claimed) if produced_before_crash else 0)
            assert await queue_entries(redis_client) == before + answer["replayed"]
            assert await redis_client.xlen(keys.dead_letter_claims("g", "t")) == 0
            # a claim finished by the next replay is addressed to the group like the rest
            assert await replayed_for(redis_client) == {"g"}
            assert_once_in_order(await consume_all(api, 40), sent)


async def test_replay_by_id_claims_each_once(redis_url: str, redis_client: redis.asyncio.Redis) -> None:
    async with http_proxy(redis_url, {"order_key": "KEY"}) as (service, api):
        for i in range(10):
            await dead_letter(service, "k", f"v{i}".encode(), offset=i + 1)
        ids = [entry["id"] for entry in (await api.call("GET", LETTERS))[1]["entries"]]
        answers: list[tuple[int, Any]] = await asyncio.gather(
            *(api.call("POST", LETTERS + "/replay", json={"ids": ids[:6]}) for _ in range(4))
        )
        assert sum(answer["replayed"] for _, answer in answers) == 6
        assert sorted(len(answer["missing"]) for _, answer in answers) == [0, 6, 6, 6]
        assert await queue_entries(redis_client) == 6
        assert [v for _, v in await consume_all(api, 6)] == [f"v{i}" for i in range(6)]


async def test_every_admin_list_is_paged_by_bytes(redis_url: str) -> None:
    """In-flight jobs, blocked keys and the group's queue rows stop at the cap and say where to go on."""
    long_key = "k" * 3000  # 3 KB keys make every row big
    config = {"order_key": "KEY", "timeout_ms": 60_000}
    async with http_proxy(redis_url, config, http={"max_answer_bytes": CAP}, queues=512) as (_, api):
        async with AsyncProducer(redis_url) as producer:
            await producer.send_batch("t", [{"key": f"{long_key}{i}", "value": "v"} for i in range(60)])
        held = 0
        while held < 60:
            held += len((await pull(api, max_batch=100))["messages"])
        for path, items in (("/admin/groups/g/in-flight", "jobs"), ("/admin/groups/g/blocked-keys", "keys"),
                            ("/admin/groups/g", "queues")):
            offset_name = "queue_offset" if items == "queues" else "offset"
            next_name = "next_queue_offset" if items == "queues" else "next_offset"
            seen = offset = pages = 0
            while True:
                params = {offset_name: str(offset), **({"limit": "1000"} if items != "queues" else {})}
                async with api.session.get(api.base + path, params=params) as response:
                    raw = await response.read()
                assert response.status == 200 and len(raw) <= CAP, (path, len(raw))
                answer = api.checker.check("GET", path, 200, "application/json", raw)
                seen += len(answer[items])
                pages += 1
                if answer[next_name] is None:
                    break
                assert answer[next_name] == offset + len(answer[items])
                offset = answer[next_name]
            assert seen == (512 if items == "queues" else 60) and pages > 1, (path, seen, pages)


async def test_replay_and_pages_run_on_a_redis_cluster(cluster_url: str) -> None:
    """Every script touches one slot: the dead-letter stream with its claims, a queue with its markers."""
    client = async_redis(cluster_url, decode_responses=False)
    try:
        await ensure_topic(client, "t", 4)
        for i in range(30):
            fields = stream_entry.encode_entry(f"v{i:02d}".encode(), f"k{i % 3}", None, None, 1)
            entry = {**dict(zip(fields[::2], fields[1::2], strict=True)), "qid": queue_for_key(f"k{i % 3}", 4)}
            await client.xadd(keys.dead_letters("g", "t"), entry)
        letters = DeadLetters(client, "g", "t", max_bytes=200)
        page = await letters.read(limit=1000)
        assert page.more and 0 < len(page.entries) < 30
        results = await asyncio.gather(letters.replay(None), DeadLetters(client, "g", "t").replay(None))
        assert sum(result.replayed for result in results) == 30
        produced: dict[str, list[str]] = {}
        for qid in range(4):
            for _, entry in await client.xrange(keys.stream("t", qid)):
                produced.setdefault(entry[b"k"].decode(), []).append(entry[b"v"].decode())
        assert sorted(v for values in produced.values() for v in values) == [f"v{i:02d}" for i in range(30)]
        assert await client.xlen(keys.dead_letters("g", "t")) == 0
    finally:
        await client.aclose()
