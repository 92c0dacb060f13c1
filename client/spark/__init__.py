"""``format("ddmq")``: a PySpark data source that reads a consumer group through ddmq proxies.

>>> df = (spark.readStream.format("ddmq")
...       .option("servers", "h1:9713,h2:9713").option("group", "cg_rides").load())

Rows: ``topic, qid, offset, key, value (binary), tag, properties (map), produce_time``. Modes
(``mode`` option): ``pull`` (default; the ordered pull path with the group's per-key gate, retries
and dead letters, at-least-once, acked after Spark commits each micro-batch) and ``queue`` (offset
ranges per (topic, qid) through ``fetch``, deterministic replay; exactly-once with a checkpoint and
an idempotent sink). docs/spark.md lists every option.

Installing the package (a wheel or ``pip install -e``) installs the top-level module ``pyspark_ddmq``,
which Spark registers by itself. :func:`register` does it by hand, for a session whose Python workers
run another environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddmq.client.spark.rows import SCHEMA, SCHEMA_DDL
    from ddmq.client.spark.source import DdmqDataSource

__all__ = ["SCHEMA", "SCHEMA_DDL", "DdmqDataSource", "register"]


def register(spark: Any) -> None:
    """Register ``format("ddmq")`` with ``spark`` (a SparkSession)."""
    from ddmq.client.spark.source import DdmqDataSource

    spark.dataSource.register(DdmqDataSource)


def __getattr__(name: str) -> Any:
    # pyspark is an optional extra: load it only when the data source is used, not for `ddmq --help`.
    if name == "DdmqDataSource":
        from ddmq.client.spark.source import DdmqDataSource

        return DdmqDataSource
    if name in ("SCHEMA", "SCHEMA_DDL"):
        from ddmq.client.spark import rows

        return getattr(rows, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
