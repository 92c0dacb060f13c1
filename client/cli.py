"""``ddmq``: the operator and developer CLI (produce, consume, status, demo)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddmq", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    from ddmq.client import consumer, producer, status

    producer.add_cli(sub)
    consumer.add_cli(sub)
    status.add_cli(sub)

    demo = sub.add_parser("demo", help="run an embedded Redis, a proxy, a ride-event producer and consumers")
    from ddmq.proxy import demo as demo_module

    demo_module.add_arguments(demo)
    demo.set_defaults(func=demo_module.main)

    demo_producer = sub.add_parser("demo-producer", help="produce the demo's ride events into a Redis")
    demo_module.add_producer_arguments(demo_producer)
    demo_producer.set_defaults(func=demo_module.producer_main)

    # Imported when run: pyspark is an optional extra (`pip install ddmq-proxy[spark]`).
    spark = sub.add_parser("spark-pipeline", help="ride events -> per-rider trips -> parquet, with Spark")
    _add_spark_pipeline_arguments(spark)
    spark.set_defaults(func=_spark_pipeline)
    return parser


def _add_spark_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    from ddmq.client.spark.pipeline import add_arguments  # argparse only; pyspark loads when it runs

    add_arguments(parser)


def _spark_pipeline(args: argparse.Namespace) -> int:
    from ddmq.client.spark import pipeline

    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        print(f"ddmq spark-pipeline needs PySpark: pip install 'ddmq-proxy[spark]' ({exc})", file=sys.stderr)
        return 2
    return pipeline.main(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
