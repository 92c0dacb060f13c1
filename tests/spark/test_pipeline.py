"""``ddmq spark-pipeline`` end to end: the demo's ride events through a real proxy into parquet."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ddmq.client.cli.demo import produce_rides
from ddmq.client.cli.main import build_parser
from ddmq.client.spark import pipeline
from ddmq.protocol.produce.producer import Producer

from ..support import ProxyProcess

RIDERS = 600


@pytest.fixture
def ride_proxy(tmp_path: Path, redis_url: str) -> Any:
    process = ProxyProcess(
        tmp_path,
        redis_url,
        # Room for the whole backlog in the proxy and in a pull: one micro-batch can carry it.
        groups={"cg_rides": {"rides": {"actions": ["Json", "Order", "PullServer"], "order_key": "$.rider_id",
                                       "max_pull_batch_size": 1000, "concurrency": 5000}}},
        topics={"rides": {"queues": 8}},
        commit_interval_ms=100,
        shutdown_grace_ms=0,
    ).start()
    try:
        yield process
    finally:
        process.stop()


def produce_out_of_order(redis_url: str, riders: list[str]) -> None:
    """These riders' events are produced pay-before-pickup: the pipeline must flag them."""
    now = time.time()
    with Producer(redis_url) as producer:
        for rider in riders:
            for seq, event in ((0, "call"), (2, "pay"), (1, "pickup")):
                value = {"rider_id": rider, "seq": seq, "event": event, "ts": now + seq, "fare": 9.5}
                producer.send("rides", json.dumps(value), key=rider)


def produce_abandoned(redis_url: str, riders: list[str]) -> None:
    """These riders called and were picked up two hours ago and never paid: far behind the watermark
    (the newest event time minus ``--abandon-after``, 600 s by default), so their trips time out."""
    then = time.time() - 7200
    with Producer(redis_url) as producer:
        for rider in riders:
            for seq, event in ((0, "call"), (1, "pickup")):
                value = {"rider_id": rider, "seq": seq, "event": event, "ts": then + seq, "fare": 0.0}
                producer.send("rides", json.dumps(value), key=rider)


@pytest.mark.timeout(300)
def test_the_pipeline_writes_one_trip_per_rider_and_flags_out_of_order_riders(
    spark: Any, ride_proxy: ProxyProcess, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    produce_rides(redis_url, [f"rider-{i}" for i in range(RIDERS)], random.Random(5))
    produce_out_of_order(redis_url, ["bad-1", "bad-2"])
    # Riders two hours old arrive behind the watermark: Spark drops late rows, and a rider whose rows do
    # reach the state function must not crash the query (a timeout behind the watermark is refused).
    produce_abandoned(redis_url, ["gone-1", "gone-2", "gone-3"])
    out = tmp_path / "trips"
    args = build_parser().parse_args(
        [
            "spark-pipeline",
            "--servers",
            f"127.0.0.1:{ride_proxy.port}",
            "--group",
            "cg_rides",
            "--out",
            str(out),
            "--available-now",
        ]
    )
    assert pipeline.main(args, spark=spark) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    total = RIDERS + 2
    rows, riders, completed, out_of_order, data_batches = (int(part.split("=")[1]) for part in summary.split())
    assert (completed, out_of_order) == (total, 2)
    # Ordered runs: a rider's three events travel in one micro-batch, not one per micro-batch.
    assert data_batches == 1, summary
    assert total * 3 <= rows <= total * 3 + 3 * 2 and total <= riders <= total + 3

    trips = spark.read.parquet(str(out)).toPandas()
    assert len(trips) == riders and trips["rider_id"].is_unique
    gone = trips[trips["status"] == "abandoned"]
    assert set(gone["rider_id"]) <= {"gone-1", "gone-2", "gone-3"}
    assert gone["events"].between(1, 2).all() and gone["pay_time"].isna().all()
    trips = trips[trips["status"] != "abandoned"]
    assert set(trips.loc[trips["out_of_order"], "rider_id"]) == {"bad-1", "bad-2"}
    good = trips[~trips["out_of_order"]]
    assert (good["events"] == 3).all() and (good["status"] == "completed").all()
    assert (good["wait_s"] >= 0).all() and (good["ride_s"] >= 0).all() and good["fare"].notna().all()


def test_the_pipelines_workers_ignore_pandas_concat_warnings_of_pysparks_state_code(tmp_path: Path) -> None:
    """The filter that `ddmq spark-pipeline` gives Spark's Python workers (spark.executorEnv.PYTHONWARNINGS)
    silences the warning PySpark's applyInPandasWithState code makes pandas print per batch and partition,
    shaped as that code calls it (rows of data, then empty rows built from a dict of Nones)."""
    script = tmp_path / "concat.py"
    script.write_text(
        "import pandas as pd\n"
        "data = pd.DataFrame({'x': [1.0], 'y': ['a']})\n"
        "empty = pd.DataFrame(dict.fromkeys(['x', 'y']), index=[0, 1])\n"
        "pd.concat([data, empty], ignore_index=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    loud = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert "FutureWarning: The behavior of DataFrame concatenation" in loud.stderr  # the warning still exists
    env["PYTHONWARNINGS"] = pipeline._QUIET_PANDAS
    quiet = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == ""
