"""A streaming query outlives one of its proxies: the rides pipeline over two proxies of one group, one
killed with -9 once the first micro-batch is committed, in pull mode and in queue mode.

Pull mode: the batch planned before the kill may hold leases on the dead proxy; those partitions read
nothing (the leases died with it) and their messages come back through the survivor, which takes the
dead proxy's queues after the lease TTL. Queue mode: partitions go on reading their ranges from the
survivor. Either way the query ends by itself and the parquet sink holds every rider's trip once.
"""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import redis

from ddmq.client.cli.demo import produce_rides
from ddmq.client.cli.main import build_parser
from ddmq.client.spark import pipeline
from ddmq.client.spark.options import parse_options
from ddmq.client.spark.pull_mode import PullPartition, PullStreamReader, read_leased
from ddmq.client.spark.queue_mode import QueuePartition, read_range
from ddmq.client.thrift_client import ProxyConnectionError
from ddmq.protocol.net import free_port
from ddmq.protocol.redis import keys

from ..support import ProxyProcess, order_violations
from .helpers import Collector, owners, positions, produce, wait_until

RIDERS = 600
LEASES = {"ttl_ms": 1000, "renew_ms": 300, "claim_interval_ms": 100}
GROUPS = {"cg_rides": {"rides": {"actions": ["Json", "Order", "PullServer"], "order_key": "$.rider_id",
                                 "max_pull_batch_size": 1000, "concurrency": 5000}}}


def start_two(tmp_path: Path, redis_url: str, groups: dict[str, Any], topic: str, leases: dict[str, int],
              proxies: list[ProxyProcess]) -> None:
    """Two proxies of one group into ``proxies``; returns once both own some of its queues."""
    group = next(iter(groups))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        proxies.append(ProxyProcess(
            tmp_path / name, redis_url, groups=groups, topics={topic: {"queues": 8}}, instance_id=name,
            leases=leases, commit_interval_ms=100, shutdown_grace_ms=0,
        ).start())
    wait_until(lambda: set(owners(proxies[0], group).values()) == {"a", "b"}, 30, "both proxies to own queues")


@pytest.fixture
def two_proxies(tmp_path: Path, redis_url: str) -> Any:
    proxies: list[ProxyProcess] = []
    try:
        start_two(tmp_path, redis_url, GROUPS, "rides", LEASES, proxies)
        yield proxies
    finally:
        for process in proxies:
            process.stop()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("mode", ["pull", "queue"])
def test_the_pipeline_finishes_with_every_trip_once_when_a_proxy_is_killed(
    spark: Any, two_proxies: list[ProxyProcess], redis_url: str, tmp_path: Path, mode: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    riders = [f"rider-{i}" for i in range(RIDERS)]
    produce_rides(redis_url, riders, random.Random(5))
    out = tmp_path / "trips"
    args = build_parser().parse_args([
        "spark-pipeline", "--servers", ",".join(f"127.0.0.1:{p.port}" for p in two_proxies),
        "--group", "cg_rides", "--out", str(out), "--mode", mode, "--available-now",
        "--max-messages-per-trigger", "300",
    ])
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["status"] = pipeline.main(args, spark=spark)
        except BaseException as exc:  # reported by the assertion below
            outcome["error"] = exc

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    first_commit = out / "_checkpoint" / "commits" / "0"
    wait_until(lambda: first_commit.exists() or not runner.is_alive(), 240, "the first committed micro-batch")
    assert runner.is_alive(), f"the query ended before the kill: {outcome}"
    two_proxies[0].kill()
    runner.join(300)
    assert not runner.is_alive(), "the query did not finish"
    assert outcome.get("status") == 0, outcome
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert int(summary.split("data_batches=")[1]) > 1, summary  # the kill fell between micro-batches

    trips = spark.read.parquet(str(out)).toPandas()
    assert sorted(trips["rider_id"]) == sorted(riders)  # every rider's trip, exactly once
    assert (trips["status"] == "completed").all()
    assert (~trips["out_of_order"]).all() and (trips["events"] == 3).all()


def test_a_queue_partition_goes_on_at_the_next_server_when_its_own_dies_mid_read(
    proxy: ProxyProcess, redis_url: str, tmp_path: Path
) -> None:
    (tmp_path / "b").mkdir()
    other = ProxyProcess(tmp_path / "b", redis_url, groups={"g": {"t": {"order_key": "KEY"}}},
                         topics={"t": {"queues": 8}}, instance_id="b", shutdown_grace_ms=0).start()
    try:
        produce(redis_url, 50, 8)
        end = positions(proxy)[("t", "0")][1]  # the next offset to be produced
        options = parse_options({"servers": f"127.0.0.1:{proxy.port},127.0.0.1:{other.port}", "group": "g",
                                 "mode": "queue", "maxBatchSize": "7"})
        reading = read_range(options, QueuePartition("127.0.0.1", proxy.port, "t", "0", 1, end))
        offsets = next(reading).column("offset").to_pylist()  # 7 rows from the partition's own proxy
        proxy.kill()
        for batch in reading:
            offsets += batch.column("offset").to_pylist()
        assert offsets == list(range(1, end))  # the rest from the other proxy: nothing twice, nothing less
    finally:
        other.stop()


def test_a_pull_partition_whose_proxy_refuses_connections_reads_nothing_and_abandons_its_lease(
    proxy: ProxyProcess, redis_url: str
) -> None:
    options = parse_options({"servers": f"127.0.0.1:{free_port()},127.0.0.1:{proxy.port}", "group": "g"})
    dead = options.servers[0]
    assert list(read_leased(options, PullPartition(dead[0], dead[1], "spark-g/1/0", 100))) == []
    # marked at the proxy that answers, so that the batch's ack finishes nothing of the lease
    with redis.Redis.from_url(redis_url) as client:
        assert client.hget(keys.replay_lease("g", "spark-g/1/0"), "abandoned") == b"1"


def test_a_pull_partition_whose_proxy_is_gone_fails_when_no_proxy_takes_the_abandonment() -> None:
    options = parse_options({"servers": f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}", "group": "g"})
    dead = options.servers[0]
    with pytest.raises(ProxyConnectionError, match="no other proxy took"):
        list(read_leased(options, PullPartition(dead[0], dead[1], "spark-g/1/0", 100)))


def test_planning_and_acks_leave_out_a_proxy_that_refuses_connections(proxy: ProxyProcess, redis_url: str) -> None:
    produce(redis_url, 10, 2)
    # planning sees a backlog only in queues the proxy has claimed: wait for all 8, not for its port
    wait_until(lambda: len(owners(proxy)) == 8, 60, "the proxy to claim every queue")
    dead = free_port()
    options = parse_options({"servers": f"127.0.0.1:{dead},127.0.0.1:{proxy.port}", "group": "g"})
    reader = PullStreamReader(options)
    try:
        end = reader.latestOffset(reader.initialOffset(), reader.getDefaultReadLimit())
        assert end["servers"] == [1]  # the batch's leases all go to the proxy that answered
        assert {(p.host, p.port) for p in reader.partitions({"seq": 0}, end)} == {("127.0.0.1", proxy.port)}
        reader.commit(end)  # the dead proxy's leases died with it: acked as far as it is concerned
        assert reader._acked_through == {0: end["seq"], 1: end["seq"]}
    finally:
        reader.stop()


@pytest.mark.timeout(300)
def test_available_now_waits_for_a_dead_proxys_queues_longer_than_its_idle_batches(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """With a queue lease TTL far longer than 20 quick empty micro-batches, the dead proxy's queues stand
    still until the survivor takes them: ``availableNow`` must wait for them rather than end early."""
    proxies: list[ProxyProcess] = []
    try:
        start_two(tmp_path, redis_url, {"g": {"t": {"order_key": "KEY", "max_pull_batch_size": 1000}}}, "t",
                  {"ttl_ms": 30000, "renew_ms": 3000, "claim_interval_ms": 100}, proxies)
        produced = produce(redis_url, 200, 5)
        collector = Collector()
        query = (
            spark.readStream.format("ddmq")
            .option("servers", ",".join(f"127.0.0.1:{p.port}" for p in proxies))
            .option("group", "g")
            .option("lingerMs", "50")
            .option("maxMessagesPerTrigger", "200")
            .load()
            .writeStream.foreachBatch(collector)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        wait_until(lambda: collector.count > 0 or not query.isActive, 120, "the first micro-batch")
        proxies[0].kill()
        query.awaitTermination(240)
        assert not query.isActive and query.exception() is None
        seqs: dict[str, list[int]] = {}
        for _, rows in sorted(collector.batches, key=lambda item: item[0]):
            for key, seq, _, _ in rows:
                seqs.setdefault(key, []).append(seq)
        assert order_violations(seqs, produced) == []
    finally:
        for process in proxies:
            process.stop()


@pytest.mark.timeout(420)
def test_a_raw_file_sink_gets_every_message_once_when_a_proxy_dies_between_commit_and_ack(
    spark: Any, redis_url: str, tmp_path: Path
) -> None:
    """Pull mode, a plain parquet sink of raw rows (no per-key state to hide a duplicate). The driver is
    held (``testAckGate``) after Spark committed the first micro-batch and before it acks its leases;
    one proxy is killed with -9 right then, so its leases of a committed batch are never acked where
    they live. The ack then reaches the survivor, which finishes them from their records: nothing of
    the committed batch comes again, and every message arrives, each key in order."""
    proxies: list[ProxyProcess] = []
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "hold-1").touch()  # seq 1 ends micro-batch 0
    try:
        start_two(tmp_path, redis_url, {"g": {"t": {"order_key": "KEY", "max_pull_batch_size": 1000}}}, "t",
                  LEASES, proxies)
        produced = produce(redis_url, 300, 8)
        out, checkpoint = tmp_path / "rows", tmp_path / "checkpoint"
        query = (
            spark.readStream.format("ddmq")
            .option("servers", ",".join(f"127.0.0.1:{p.port}" for p in proxies))
            .option("group", "g")
            .option("lingerMs", "50")
            .option("maxMessagesPerTrigger", "800")
            .option("testAckGate", str(gate))
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        wait_until(lambda: (gate / "ack-1.wait").exists() or not query.isActive, 180, "micro-batch 0's commit")
        assert query.isActive, query.exception()
        assert (checkpoint / "commits" / "0").exists()  # Spark committed it; its leases are not acked yet
        proxies[0].kill()
        (gate / "ack-1.go").touch()
        query.awaitTermination(300)
        assert not query.isActive and query.exception() is None

        # Each row's micro-batch, from the file sink's own log (which files each batch committed).
        batch_of: dict[str, int] = {}
        for log_file in (out / "_spark_metadata").iterdir():
            if log_file.name.split(".")[0].isdigit():
                for line in log_file.read_text().splitlines()[1:]:
                    batch_of[Path(json.loads(line)["path"]).name] = int(log_file.name.split(".")[0])
        seen: set[tuple[str, int, int]] = set()
        bodies: set[bytes] = set()
        duplicates = []
        arrivals: dict[str, list[tuple[int, int]]] = {}
        for name, batch in sorted(batch_of.items(), key=lambda item: item[1]):
            table = pq.read_table(out / name)
            for topic, qid, offset, value in zip(*(table.column(c).to_pylist()
                                                   for c in ("topic", "qid", "offset", "value")), strict=True):
                if (topic, qid, offset) in seen or value in bodies:
                    duplicates.append((topic, qid, offset, value))
                seen.add((topic, qid, offset))
                bodies.add(value)
                event = json.loads(value)
                arrivals.setdefault(event["k"], []).append((batch, event["seq"]))
        assert 0 in batch_of.values() and max(batch_of.values()) > 0  # the kill fell between micro-batches
        assert duplicates == []
        assert len(seen) == sum(produced.values())
        # Per key: batch by batch in key order (a file holds one partition's rows, in the order read).
        assert order_violations({key: [seq for _, seq in sorted(got, key=lambda a: a[0])]
                                 for key, got in arrivals.items()}, produced) == []
    finally:
        for process in proxies:
            process.stop()
