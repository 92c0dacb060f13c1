"""S1 Spark: rows/s into parquet through ``format("ddmq")`` (pull mode, queue mode) vs the Spark ceiling.

One local SparkSession (``local[2]``) runs the same job three times, each ``trigger(availableNow=True)``
from a fresh checkpoint into a fresh parquet directory: ``readStream`` → ``writeStream.parquet``.

- ceiling: an in-memory synthetic stream source (this module's ``SyntheticSource``) that yields the
  same number of rows of the same schema and value size, in the same number of micro-batches as the
  queue-mode run, without any network;
- pull: ``mode=pull`` against a real proxy (order key KEY) with ordered runs (the source's default
  ``maxPerKey``), so a key's messages go out in one run, not one per micro-batch; the proxy may hold
  the whole backlog (``concurrency``) and a pull may carry 1,000 messages (16 pulls per partition), so
  the micro-batches are set by the source's rows per micro-batch (partitions, pulls, ``maxBatchSize``),
  reported as ``batches``;
- queue: ``mode=queue``, ``maxMessagesPerTrigger`` as below.

The figure of each row is its rows/s divided by the ceiling's rows/s measured in the same run. Time is
measured from ``start()`` to the end of ``awaitTermination()``; Spark's start-up and a small warm-up
job (the first query of a session pays for class loading and Python worker start-up) come before.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.dataset import QUEUES, TOPIC, key_names
from bench.report import Row, Target
from bench.scenarios.base import Settings, log, proxy_sections
from ddmq.client.spark.options import DEFAULT_MAX_PER_KEY
from ddmq.protocol.produce.producer import Producer
from tests.harness.stack import ProxyRun, RedisServer

__all__ = ["spark"]

_REPO = str(Path(__file__).resolve().parents[2])


def _produce(redis_url: str, messages: int, keys: int) -> None:
    names = key_names(keys) if keys <= 10_000 else [f"k{i}" for i in range(keys)]
    with Producer(redis_url) as producer:
        producer.ensure_topic(TOPIC, QUEUES)
        batch = []
        for n in range(messages):
            key = names[n % keys]
            batch.append({"key": key, "value": json.dumps({"k": key, "seq": n // keys}, separators=(",", ":"))})
            if len(batch) == 5000:
                producer.send_batch(TOPIC, batch)
                batch = []
        if batch:
            producer.send_batch(TOPIC, batch)


def _synthetic_source() -> Any:
    """A stream source of ``rows`` in-memory rows in ``batches`` micro-batches (the Spark ceiling)."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from ddmq.client.spark.rows import SCHEMA

    class SyntheticReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, rows: int, batches: int) -> None:
            self.rows, self.batches = rows, batches

        def prepareForTriggerAvailableNow(self) -> None:
            pass  # every batch is known up front (without this mixin availableNow runs one batch)

        def initialOffset(self) -> dict[str, int]:
            return {"batch": 0}

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"batch": min(self.batches, start["batch"] + 1)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
            per_batch = -(-self.rows // self.batches)
            first = start["batch"] * per_batch
            count = max(0, min(self.rows, end["batch"] * per_batch) - first)
            half = count // 2
            return [InputPartition((first, half)), InputPartition((first + half, count - half))]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            # Imported here, in the executor: the thrift-generated Message class cannot be pickled.
            from ddmq.client.spark.rows import to_record_batch
            from ddmq.protocol.wire import Message

            first, count = partition.value
            for chunk in range(first, first + count, 256):
                messages = [
                    Message(
                        key=f"k{n}",
                        value=json.dumps({"k": f"k{n}", "seq": n}).encode(),
                        tag="",
                        offset=n,
                        properties={},
                        produceTime=int(time.time() * 1000),
                    )
                    for n in range(chunk, min(first + count, chunk + 256))
                ]
                yield to_record_batch(TOPIC, 0, messages)

    class SyntheticSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ddmq_synthetic"

        def schema(self) -> Any:
            return SCHEMA

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return SyntheticReader(int(self.options["rows"]), int(self.options["batches"]))

    return SyntheticSource


def _run(spark: Any, reader: Any, out: Path) -> tuple[float, int, int]:
    """Run one availableNow job into parquet; returns (seconds, rows written, micro-batches)."""
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"spark job failed: {query.exception()}")
    batches = len([p for p in query.recentProgress if p.get("numInputRows", 0) > 0])
    rows = spark.read.parquet(str(out / "data")).count()
    return elapsed, rows, batches


def spark(settings: Settings) -> list[Row]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO, os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    from ddmq.client.spark import register

    messages = settings.size(20_000, 100_000)
    keys = settings.size(4_000, 10_000)
    per_trigger = settings.size(5_000, 20_000)
    work = Path(tempfile.mkdtemp(prefix="ddmq-bench-spark-"))
    log(f"S1: starting local[2] Spark; {messages} messages over {keys} keys")
    session = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    session.dataSource.register(_synthetic_source())
    results: dict[str, tuple[float, int, int]] = {}
    try:
        log("S1: warm-up job (not measured)")
        _run(session, session.readStream.format("ddmq_synthetic").options(rows="2000", batches="2"), work / "warm")
        with RedisServer() as redis_server:
            _produce(redis_server.url, messages, keys)
            sections = proxy_sections("cg-spark", order_key="KEY", max_pull_batch_size=1000, concurrency=messages)
            with ProxyRun(redis_server.url, **sections) as proxy:
                servers = f"127.0.0.1:{proxy.port}"

                def ddmq(**options: str) -> Any:  # a new reader each time: .option() mutates the reader
                    return session.readStream.format("ddmq").options(servers=servers, group="cg-spark", **options)

                log("S1: queue mode")
                results["queue"] = _run(
                    session, ddmq(mode="queue", maxMessagesPerTrigger=str(per_trigger)), work / "queue"
                )
                log("S1: pull mode")
                results["pull"] = _run(
                    session, ddmq(mode="pull", numPartitions="2", pullsPerPartition="16", maxBatchSize="1000"),
                    work / "pull",
                )
            log("S1: synthetic in-memory source (the ceiling)")
            synthetic = (
                session.readStream.format("ddmq_synthetic")
                .option("rows", str(messages))
                .option("batches", str(max(1, results["queue"][2])))
            )
            results["ceiling"] = _run(session, synthetic, work / "ceiling")
    finally:
        session.stop()
        shutil.rmtree(work, ignore_errors=True)
    ceiling_s, ceiling_rows, ceiling_batches = results["ceiling"]
    if ceiling_rows != messages:
        raise RuntimeError(f"the synthetic source wrote {ceiling_rows} rows, not {messages}")
    ceiling_rate = ceiling_rows / ceiling_s
    rows = []
    for mode in ("pull", "queue"):
        seconds, written, batches = results[mode]
        rate = written / seconds
        rows.append(
            Row(
                f"S1-{mode}",
                f"Spark availableNow -> parquet, mode={mode} (vs in-memory source)",
                f"{rate:,.0f} rows/s",
                f"{ceiling_rate:,.0f} rows/s",
                rate / ceiling_rate,
                Target(">=", 0.4) if mode == "pull" else None,
                {"messages": messages, "keys": keys, "master": "local[2]"}
                | ({"max_per_key": DEFAULT_MAX_PER_KEY, "max_batch_size": 1000, "pulls_per_partition": 16}
                   if mode == "pull"
                   else {"max_messages_per_trigger": per_trigger}),
                {
                    "seconds": round(seconds, 2),
                    "rows": written,
                    "batches": batches,
                    "ceiling_seconds": round(ceiling_s, 2),
                    "ceiling_batches": ceiling_batches,
                    "complete": written == messages,
                },
            )
        )
    return rows
