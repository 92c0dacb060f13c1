"""``ddmq spark-pipeline``: ride events → per-rider trip state → parquet, through ``format("ddmq")``.

The events are the demo's (``ddmq demo-producer``): per rider ``call → pickup → pay``, JSON bodies
``{"rider_id", "seq", "event", "ts", "fare"}`` keyed by rider. The job reads them with Structured
Streaming, keeps each rider's trip in ``applyInPandasWithState`` and writes one parquet row per trip
when it completes (``pay``) or is abandoned (the watermark, ``--abandon-after`` seconds behind the
latest event time seen, passed the rider's last event without a ``pay``). The ``out_of_order``
column flags a rider whose events did not arrive in ``seq`` order (a repeat of an event already seen
is a redelivery, not a reordering).

    ddmq spark-pipeline --servers h1:9713,h2:9713 --group cg_rides --out /data/trips --available-now

It prints one summary line, ``rows=N riders=N completed=N out_of_order=N data_batches=N`` (rows and
data_batches: events and micro-batches with events read by this run; the rest counted over the whole
output directory), and exits 0. It runs on ``local[*]`` by
default and unchanged under ``spark-submit --master ...`` (``--master`` is only applied when given).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, Final

from ddmq.protocol import clitools

__all__ = ["STATE_SCHEMA", "TRIP_SCHEMA", "TripStates", "add_arguments", "build_query", "main", "run"]

log = logging.getLogger(__name__)

EVENT_SCHEMA: Final = "rider_id string, seq int, event string, ts double, fare double"
TRIP_SCHEMA: Final = (
    "rider_id string, status string, call_time timestamp, pickup_time timestamp, pay_time timestamp, "
    "wait_s double, ride_s double, fare double, events int, out_of_order boolean"
)
STATE_SCHEMA: Final = (
    "call_ts double, pickup_ts double, pay_ts double, fare double, next_seq int, events int, out_of_order boolean"
)
_EVENT_SEQ: Final = {"call": 0, "pickup": 1, "pay": 2}


class TripStates:
    """``applyInPandasWithState`` function: one rider's events of a micro-batch → finished trips.

    Timeouts are in event time: a rider whose last event is ``abandon_after_ms`` behind the watermark
    is emitted as abandoned (at once when its events arrive that late). A completed rider's state is
    kept until then too, so a late or repeated event of a finished trip is recognised (and ignored)
    rather than starting a new trip.
    """

    def __init__(self, abandon_after_ms: int) -> None:
        self.abandon_after_ms = abandon_after_ms

    def __call__(self, key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        return trip_states(key, frames, state, self.abandon_after_ms)


def trip_states(key: tuple[Any, ...], frames: Iterator[Any], state: Any, abandon_after_ms: int) -> Iterator[Any]:
    import pandas as pd

    (rider,) = key
    if state.hasTimedOut:
        call_ts, pickup_ts, pay_ts, fare, next_seq, events, out_of_order = state.get
        state.remove()
        if pay_ts is None:
            yield _trip_frame(pd, rider, "abandoned", call_ts, pickup_ts, pay_ts, fare, events, out_of_order)
        return
    if state.exists:
        call_ts, pickup_ts, pay_ts, fare, next_seq, events, out_of_order = state.get
    else:
        call_ts = pickup_ts = pay_ts = fare = None
        next_seq, events, out_of_order = 0, 0, False
    completed_before = pay_ts is not None
    last_ts = max((t for t in (call_ts, pickup_ts, pay_ts) if t is not None), default=0.0)
    batch = pd.concat(list(frames))
    # A rider's events all sit in one queue: queue offsets restore their arrival order in the batch.
    for row in batch.sort_values(["qid", "offset"]).itertuples(index=False):
        seq = _EVENT_SEQ.get(row.event, row.seq)
        last_ts = max(last_ts, row.ts)
        if seq < next_seq:
            continue  # a redelivery of an event already applied
        if seq > next_seq:
            out_of_order = True
        events += 1
        next_seq = seq + 1
        if row.event == "call":
            call_ts = row.ts
        elif row.event == "pickup":
            pickup_ts = row.ts
        elif row.event == "pay":
            pay_ts, fare = row.ts, row.fare
    deadline_ms = int(last_ts * 1000) + abandon_after_ms
    if deadline_ms > state.getCurrentWatermarkMs():
        state.update((call_ts, pickup_ts, pay_ts, fare, next_seq, events, out_of_order))
        state.setTimeoutTimestamp(deadline_ms)
    else:
        # Late events: the rider's newest event is already past the abandon horizon (Spark refuses a
        # timeout behind the watermark). Settle the trip now instead of keeping state.
        state.remove()
        if pay_ts is None:
            yield _trip_frame(pd, rider, "abandoned", call_ts, pickup_ts, pay_ts, fare, events, out_of_order)
            return
    if pay_ts is not None and not completed_before:
        yield _trip_frame(pd, rider, "completed", call_ts, pickup_ts, pay_ts, fare, events, out_of_order)


def _trip_frame(
    pd: Any,
    rider: str,
    status: str,
    call_ts: float | None,
    pickup_ts: float | None,
    pay_ts: float | None,
    fare: float | None,
    events: int,
    out_of_order: bool,
) -> Any:
    def when(ts: float | None) -> Any:
        # Whole microseconds: Spark timestamps have no finer unit.
        return pd.Timestamp(round(ts * 1_000_000), unit="us", tz="UTC") if ts is not None and ts == ts else pd.NaT

    def gap(a: float | None, b: float | None) -> float | None:
        return b - a if a is not None and b is not None else None

    return pd.DataFrame(
        {
            "rider_id": [rider],
            "status": [status],
            "call_time": [when(call_ts)],
            "pickup_time": [when(pickup_ts)],
            "pay_time": [when(pay_ts)],
            "wait_s": [gap(call_ts, pickup_ts)],
            "ride_s": [gap(pickup_ts, pay_ts)],
            "fare": [fare],
            "events": [events],
            "out_of_order": [bool(out_of_order)],
        }
    )


def build_query(spark: Any, args: argparse.Namespace) -> Any:
    """The streaming query (not started): ddmq → trips → parquet in ``args.out``."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("ddmq")
        .option("servers", args.servers)
        .option("group", args.group)
        .option("mode", args.mode)
    )
    if args.topic:
        reader = reader.option("topic", args.topic)
    if args.max_messages_per_trigger:
        reader = reader.option("maxMessagesPerTrigger", str(args.max_messages_per_trigger))
    if args.max_per_key is not None:
        reader = reader.option("maxPerKey", str(args.max_per_key))
    abandon_after_ms = int(args.abandon_after * 1000)
    events = (
        reader.load()
        .select("qid", "offset", F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("qid", "offset", "e.*")
        .where(F.col("rider_id").isNotNull() & F.col("ts").isNotNull())
        .withColumn("event_time", F.timestamp_seconds("ts"))
        # Event-time timeouts (not processing time: those keep an availableNow run going for ever).
        .withWatermark("event_time", f"{abandon_after_ms} milliseconds")
    )
    trips = events.groupBy("rider_id").applyInPandasWithState(
        TripStates(abandon_after_ms), TRIP_SCHEMA, STATE_SCHEMA, "append", "EventTimeTimeout"
    )
    writer = (
        trips.writeStream.format("parquet")
        .option("path", args.out)
        .option("checkpointLocation", args.checkpoint or os.path.join(args.out, "_checkpoint"))
        .outputMode("append")
    )
    if args.available_now:
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=args.trigger_interval)


def run(spark: Any, args: argparse.Namespace) -> str:
    """Run the pipeline to the end (``--available-now``) or for ``--run-seconds``; returns the summary."""
    from pyspark.sql import functions as F

    counter = _input_row_counter()
    spark.streams.addListener(counter)
    try:
        query = build_query(spark, args).start()
        try:
            if args.available_now:
                query.awaitTermination()
            else:
                query.awaitTermination(args.run_seconds)
        finally:
            if query.isActive:
                query.stop()
    finally:
        spark.streams.removeListener(counter)
    exception = query.exception()
    if exception is not None:
        raise RuntimeError(f"the streaming query failed: {exception}")
    rows = counter.rows.get(str(query.id), 0)
    data_batches = counter.data_batches.get(str(query.id), 0)
    trips = spark.read.schema(TRIP_SCHEMA).parquet(args.out)
    totals = trips.agg(
        F.countDistinct("rider_id").alias("riders"),
        F.sum(F.when(F.col("status") == "completed", 1).otherwise(0)).alias("completed"),
        F.sum(F.when(F.col("out_of_order"), 1).otherwise(0)).alias("out_of_order"),
    ).first()
    return (
        f"rows={rows} riders={totals['riders'] or 0} completed={totals['completed'] or 0} "
        f"out_of_order={totals['out_of_order'] or 0} data_batches={data_batches}"
    )


def _input_row_counter() -> Any:
    """A listener counting input rows per query over every micro-batch (``recentProgress`` keeps only
    the last 100); ``.rows`` maps query id → rows, ``.data_batches`` query id → micro-batches with rows."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class InputRows(StreamingQueryListener):
        def __init__(self) -> None:
            self.rows: dict[str, int] = {}
            self.data_batches: dict[str, int] = {}

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            query_id = str(event.progress.id)
            rows = int(event.progress.numInputRows)
            self.rows[query_id] = self.rows.get(query_id, 0) + rows
            if rows:
                self.data_batches[query_id] = self.data_batches.get(query_id, 0) + 1

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return InputRows()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    clitools.env_option(parser, "--servers", clitools.ENV_SERVERS, "proxies, H:P[,H:P...]")
    parser.add_argument("--group", required=True, help="consumer group")
    parser.add_argument("--out", required=True, help="output directory (parquet)")
    parser.add_argument("--topic", help="only this topic of the group")
    parser.add_argument("--mode", choices=("pull", "queue"), default="pull", help="source mode (default pull)")
    parser.add_argument("--checkpoint", help="checkpoint directory (default OUT/_checkpoint)")
    parser.add_argument("--available-now", action="store_true", help="process what is there now, then stop")
    parser.add_argument("--trigger-interval", default="5 seconds", help="micro-batch interval (streaming)")
    parser.add_argument("--run-seconds", type=float, default=None, help="stop a streaming run after this long")
    parser.add_argument("--max-messages-per-trigger", type=int, help="cap on messages per micro-batch")
    parser.add_argument(
        "--max-per-key", type=int, help="pull mode: ordered runs, messages of one rider per pull (default 1000)"
    )
    parser.add_argument(
        "--abandon-after", type=float, default=600.0, help="seconds without events before a trip is abandoned"
    )
    parser.add_argument("--master", help="Spark master (default: whatever spark-submit / the environment says)")
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        default=8,
        help="partitions of the per-rider state (spark.sql.shuffle.partitions, default 8; fixed by the checkpoint)",
    )


#: A warnings filter (PYTHONWARNINGS syntax: action:message-start:category) for Spark's Python workers.
_QUIET_PANDAS = "ignore:The behavior of DataFrame concatenation with empty or all-NA entries:FutureWarning"


def main(args: argparse.Namespace, spark: Any = None) -> int:
    """The CLI entry: builds (or reuses) a SparkSession, runs, prints the summary line."""
    # Executors and Spark's Python workers must import ddmq: default them to this interpreter.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if spark is None:
        from pyspark.sql import SparkSession

        builder = (
            SparkSession.builder.appName("ddmq-spark-pipeline")
            .config("spark.sql.session.timeZone", "UTC")
            # Spark's default of 200 state partitions makes every micro-batch run 200 Python tasks.
            .config("spark.sql.shuffle.partitions", str(args.shuffle_partitions))
            # PySpark's own pandas state code concatenates empty frames, which pandas 2.x warns about
            # once per batch and partition; nothing the pipeline can change, so the workers ignore it.
            .config("spark.executorEnv.PYTHONWARNINGS", _QUIET_PANDAS)
        )
        if args.master:
            builder = builder.master(args.master)
        spark = builder.getOrCreate()
    print(run(spark, args), flush=True)
    return 0
