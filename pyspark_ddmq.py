"""Spark's entry point for ``format("ddmq")``: Spark registers a top-level ``pyspark_*`` module's ``DefaultSource``."""

from ddmq.client.spark import DdmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
