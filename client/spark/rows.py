"""The rows ``format("ddmq")`` produces, built as Arrow record batches (no per-row Python objects)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ddmq.protocol.wire import Message

__all__ = ["SCHEMA", "SCHEMA_DDL", "to_record_batch"]

SCHEMA: Final = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("qid", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("key", StringType(), True),
        StructField("value", BinaryType(), True),
        StructField("tag", StringType(), True),
        StructField("properties", MapType(StringType(), StringType(), True), True),
        StructField("produce_time", TimestampType(), True),
    ]
)
SCHEMA_DDL: Final = (
    "topic string, qid int, offset long, key string, value binary, tag string, "
    "properties map<string,string>, produce_time timestamp"
)
_ARROW_SCHEMA: Any = None


def _arrow_schema() -> Any:
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        _ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")
    return _ARROW_SCHEMA


def to_record_batch(topic: str, qid: int, messages: Sequence[Message]) -> Any:
    """One Arrow record batch in :data:`SCHEMA` for ``messages`` of one (topic, qid)."""
    schema = _arrow_schema()
    count = len(messages)
    produce_us = [
        m.produceTime * 1000 if m.produceTime else None  # 0 or unset: unknown
        for m in messages
    ]
    arrays = [
        pa.array([topic] * count, pa.string()),
        pa.array([qid] * count, pa.int32()),
        pa.array([m.offset or 0 for m in messages], pa.int64()),
        pa.array([m.key or "" for m in messages], pa.string()),
        pa.array([m.value or b"" for m in messages], pa.binary()),
        pa.array([m.tag or "" for m in messages], pa.string()),
        pa.array([list((m.properties or {}).items()) for m in messages], schema.field("properties").type),
        pa.array(produce_us, schema.field("produce_time").type),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
