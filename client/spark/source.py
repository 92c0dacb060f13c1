"""``DdmqDataSource``: ``spark.readStream.format("ddmq")`` / ``spark.read.format("ddmq")``."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from ddmq.client.spark.options import SourceOptions, parse_options
from ddmq.client.spark.rows import SCHEMA

__all__ = ["DdmqDataSource"]


class DdmqDataSource(DataSource):
    """Reads a consumer group through ddmq proxies; see the package docstring for the options."""

    @classmethod
    def name(cls) -> str:
        return "ddmq"

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.options = options  # Spark's case-insensitive mapping: never dict() it
        self._parsed: SourceOptions | None = None

    @property
    def parsed(self) -> SourceOptions:
        if self._parsed is None:
            self._parsed = parse_options(self.options)
        return self._parsed

    def schema(self) -> StructType:
        return SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self.parsed
        if options.mode == "queue":
            from ddmq.client.spark.queue_mode import QueueStreamReader

            return QueueStreamReader(options)
        from ddmq.client.spark.pull_mode import PullStreamReader

        return PullStreamReader(options)

    def reader(self, schema: StructType) -> DataSourceReader:
        from ddmq.client.spark.batch import batch_reader

        return batch_reader(self.parsed)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ddmq.client.spark.batch import AckWriter

        return AckWriter(self.parsed)
