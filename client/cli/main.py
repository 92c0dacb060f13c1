"""``ddmq``: the operator and developer CLI (produce, consume, status, offsets, dead letters, keys, demo).

Common flags default to environment variables: ``--redis`` to ``$DDMQ_REDIS``, ``--servers`` to
``$DDMQ_SERVERS``, ``--http`` to ``$DDMQ_HTTP`` and the admin token to ``$DDMQ_ADMIN_TOKEN``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import cast

from ddmq.protocol import clitools


def build_parser() -> argparse.ArgumentParser:
    parser = clitools.Parser(prog="ddmq", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    clitools.add_version(parser)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # Subcommands are clitools.Parser too (argparse's default parser_class is the parent's class).
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))

    from ddmq.client.cli import actions as actions_cli
    from ddmq.client.cli import admin, offsets, status
    from ddmq.client.cli import consume as consume_cli
    from ddmq.client.cli import groups as groups_cli
    from ddmq.client.cli import keys as keys_cli
    from ddmq.client.cli import produce as produce_cli
    from ddmq.client.cli import topics as topics_cli

    produce_cli.add_cli(sub)
    consume_cli.add_cli(sub)
    status.add_cli(sub)
    topics_cli.add_cli(sub)
    groups_cli.add_cli(sub)
    offsets.add_cli(sub)
    admin.add_cli(sub)
    keys_cli.add_cli(sub)
    actions_cli.add_cli(sub)

    demo = sub.add_parser("demo", help="run an embedded Redis, a proxy, a ride-event producer and consumers")
    from ddmq.client.cli import demo as demo_module

    demo_module.add_arguments(demo)
    demo.set_defaults(func=demo_module.main)

    demo_producer = sub.add_parser("demo-producer", help="produce the demo's ride events into a Redis")
    demo_module.add_producer_arguments(demo_producer)
    demo_producer.set_defaults(func=demo_module.producer_main)

    # Imported when run: pyspark is an optional extra (`pip install ddmq-proxy[spark]`).
    spark = sub.add_parser("spark-pipeline", help="ride events -> per-rider trips -> parquet, with Spark")
    _add_spark_pipeline_arguments(spark)
    spark.set_defaults(func=_spark_pipeline)

    completion = sub.add_parser(
        "completion", help="print a shell completion script for ddmq (bash or zsh)",
        description=_COMPLETION_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    completion.add_argument("shell", choices=["bash", "zsh"])
    completion.set_defaults(func=_completion)
    return parser


_COMPLETION_HELP = """ddmq completion: print a completion script for ddmq's commands and flags.

bash, for this shell:    eval "$(ddmq completion bash)"
bash, for every shell:   ddmq completion bash > ~/.local/share/bash-completion/completions/ddmq
zsh:                     ddmq completion zsh > "${fpath[1]}/_ddmq"   (then start a new shell)"""


def _completion(args: argparse.Namespace) -> int:
    import shtab  # generates the script from the parser itself, so it never lags behind a new flag

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def _add_spark_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    from ddmq.client.spark.pipeline import add_arguments  # argparse only; pyspark loads when it runs

    add_arguments(parser)


def _spark_pipeline(args: argparse.Namespace) -> int:
    from ddmq.client.spark import pipeline

    try:
        import pyspark  # noqa: F401
    except ImportError as exc:
        raise clitools.CliError(f"needs PySpark: pip install 'ddmq-proxy[spark]' ({exc})") from exc
    return pipeline.main(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return clitools.run_command(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
