"""Batch jobs: ``spark.read.format("ddmq")`` and the ack writer ``df.write.format("ddmq")`` (queue mode).

An at-least-once batch job reads from the group's stored fetch positions, writes its output, and
then writes the rows it consumed back to ``format("ddmq")``, which stores, per (topic, qid), the
offset after the highest one written as the group's position. The next run starts there.

>>> df = spark.read.format("ddmq").options(servers=S, group="g", mode="queue", maxMessages="100000").load()
>>> df.write.parquet(out)                                                    # your output first
>>> df.select("topic", "qid", "offset").write.format("ddmq").options(servers=S, group="g", mode="queue") \\
...     .mode("append").save()                                              # then the acks
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, DataSourceWriter, WriterCommitMessage

from ddmq.client.spark.options import SourceOptions
from ddmq.client.spark.queue_mode import Positions, QueueBatchReader, _Queues

__all__ = ["AckWriter", "batch_reader"]

_PULL_UNSUPPORTED = (
    "batch reads and the ack writer use mode=queue (offset ranges); mode=pull is for streaming queries, "
    'where acks follow Spark\'s commits: add .option("mode", "queue")'
)


def batch_reader(options: SourceOptions) -> DataSourceReader:
    if options.mode != "queue":
        raise ValueError(_PULL_UNSUPPORTED)
    return QueueBatchReader(options)


@dataclass
class _Highest(WriterCommitMessage):
    positions: Positions


class AckWriter(DataSourceWriter):
    """Stores, per (topic, qid) in the rows written, the offset after the highest one as the position."""

    def __init__(self, options: SourceOptions) -> None:
        if options.mode != "queue":
            raise ValueError(_PULL_UNSUPPORTED)
        self.options = options

    def write(self, iterator: Iterator[Any]) -> _Highest:
        highest: Positions = {}
        for row in iterator:
            by_qid = highest.setdefault(str(row["topic"]), {})
            qid = str(row["qid"])
            by_qid[qid] = max(by_qid.get(qid, 0), int(row["offset"]) + 1)
        return _Highest(highest)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        merged: Positions = {}
        for message in messages:
            if isinstance(message, _Highest):
                for topic, by_qid in message.positions.items():
                    into = merged.setdefault(topic, {})
                    for qid, offset in by_qid.items():
                        into[qid] = max(into.get(qid, 0), offset)
        queues = _Queues(self.options)
        try:
            queues.ack(merged, strict=True)
        finally:
            queues.close()

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # nothing stored: the next run reads the same messages again
