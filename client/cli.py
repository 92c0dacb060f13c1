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
    return parser


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
