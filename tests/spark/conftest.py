"""One local SparkSession for the whole test session (Spark's start-up costs seconds), and a real
``ddmq-proxy`` process per test over the session's Redis."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..support import ProxyProcess

# Executors and the driver-side Python workers must import ddmq: use this interpreter (the venv's).
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("ddmq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    # No register(session): format("ddmq") must be found the way a user's session finds it, through
    # the installed top-level module pyspark_ddmq (editable installs included).
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def proxy(tmp_path: Path, redis_url: str) -> Iterator[ProxyProcess]:
    """A proxy for group ``g`` on topic ``t`` (8 queues), ordered by message key."""
    process = ProxyProcess(
        tmp_path,
        redis_url,
        groups={"g": {"t": {"order_key": "KEY", "max_pull_batch_size": 1000, "timeout_ms": 30000}}},
        topics={"t": {"queues": 8}},
        commit_interval_ms=100,
        shutdown_grace_ms=0,
    ).start()
    try:
        yield process
    finally:
        process.stop()
