"""``ddmq-proxy --config FILE``: run the consume proxy until SIGTERM/SIGINT, then stop gracefully.
SIGHUP reloads the config file (groups and topics change live; see ``ddmq.proxy.ops.reload``)."""
# The event loop is uvloop when installed (--loop chooses); ``--version`` and the first log line say
# which loop and which hot path (compiled or pure Python, ddmq.protocol.native) this process runs.

from __future__ import annotations

# Imports are what ``--check`` and ``--version`` need: the service and its servers (aiohttp,
# thriftpy2, redis-py, uvloop) load only when the proxy is to run, so a check costs the interpreter,
# pydantic and the config alone (tests/config/test_check.py holds it to that).
import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from ddmq.config.loader import load
from ddmq.protocol import clitools
from ddmq.protocol.errors import DdmqError
from ddmq.protocol.native import LOOP_CHOICES, describe, resolve_loop
from ddmq.proxy.core.errors import ConfigError
from ddmq.proxy.ops import logs

if TYPE_CHECKING:
    from ddmq.config.schema import ProxyConfig
    from ddmq.proxy.service import ProxyService

log = logging.getLogger("ddmq.proxy")


class _Version(argparse.Action):
    """``--version``: the version, the hot path and the event loop this process would run."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, *_: object) -> None:
        try:
            loop = resolve_loop(getattr(namespace, "loop", None) or "auto")
        except ValueError as exc:
            parser.error(str(exc))
        print(f"{parser.prog} {clitools.version()}; {describe(loop)}", flush=True)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = clitools.Parser(prog="ddmq-proxy", description=__doc__)
    parser.add_argument(
        "--version", action=_Version, nargs=0, help="print the version, the hot path and the event loop, and exit"
    )
    parser.add_argument("--config", "-c", required=True, help="the proxy's YAML config file")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default INFO"
    )
    parser.add_argument(
        "--log-format", default="text", choices=logs.LOG_FORMATS,
        help="text (default), or json: every line on stderr and stdout one JSON object (time, level, logger, "
        "message; group, topic and qid where a line is about one; the start-up export line as a field)",
    )
    parser.add_argument("--check", action="store_true", help="validate the config file and exit")
    parser.add_argument(
        "--watch-interval-ms", type=int, default=0, metavar="MS",
        help="also reload the config when the file's content changes, checked every MS ms "
        "(default 0: off; SIGHUP always reloads)",
    )
    parser.add_argument(
        "--loop", choices=LOOP_CHOICES, default="auto",
        help="the event loop: uvloop, asyncio's own, or auto (default: uvloop where it is installed)",
    )
    return parser


def configure_logging(level: str, log_format: str = "text") -> None:
    logs.configure(level, log_format)


async def serve(service: ProxyService, config_path: str, watch_interval_ms: int = 0, log_format: str = "text",
                ) -> None:
    import asyncio
    import signal

    from ddmq.protocol.native import loop_name, settle_heap
    from ddmq.proxy.ops.reload import ConfigReloader

    loop = asyncio.get_running_loop()
    log.info("ddmq-proxy %s; %s", clitools.version(), describe(loop_name(loop)))
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reloader = ConfigReloader(service.reload, config_path, watch_interval_ms)
    # Installed before start-up: SIGHUP's default action would end the process. Served once running.
    loop.add_signal_handler(signal.SIGHUP, reloader.request)
    await service.start()
    reloader.start()
    _print_exports(service, log_format)
    # Long-lived state (config, clients, compiled scripts) moves out of the collector's sight.
    settle_heap()
    # Frames above 64 KiB are decoded in worker threads, which hold the GIL while they decode; the
    # loop gets it back once per switch interval. 1 ms instead of 5 keeps other clients' pulls quick
    # meanwhile, and costs nothing when no such frame is being decoded (the loop runs alone then).
    sys.setswitchinterval(0.001)
    try:
        await stop.wait()
        log.info("stopping: no more reads; clients have %d ms to ack", service.config.shutdown_grace_ms)
    finally:
        await reloader.close()
        await service.close()
        log.info("stopped")


def _print_exports(service: ProxyService, log_format: str = "text") -> None:
    from ddmq.proxy.ops.exports import export_lines

    config = service.config
    http = config.http if service.http_port is not None else None
    lines = export_lines(service.redis_url, config.thrift.host, service.thrift_port or config.thrift.port,
                         http.host if http is not None else None, service.http_port)
    if log_format == "json":
        export = next(line for line in lines if line.startswith("export "))
        notes = [line.removeprefix("# ") for line in lines[1:] if line.startswith("# ")]
        # Printed whatever --log-level, as the text format's lines are.
        print(logs.json_line("INFO", "ddmq.proxy", "ready: the export line lets the ddmq commands of a shell "
                             "reach this proxy", export=export, note=notes[0] if notes else None),
              file=sys.stderr, flush=True)
        return
    print("\n".join(lines), file=sys.stderr, flush=True)


def _say(message: str, log_format: str, level: str = "ERROR", stream: TextIO | None = None) -> None:
    """A line of the command itself (not of the running proxy): ``ddmq-proxy: ...``, or a JSON object."""
    line = logs.json_line(level, "ddmq.proxy", message) if log_format == "json" else f"ddmq-proxy: {message}"
    print(line, file=stream if stream is not None else sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fmt = args.log_format
    configure_logging(args.log_level, fmt)
    try:
        config = load(args.config)
    except ConfigError as exc:
        _say(str(exc), fmt)
        return 2
    if args.watch_interval_ms < 0:
        _say("--watch-interval-ms must not be negative", fmt)
        return 2
    try:
        loop_choice = resolve_loop(args.loop)  # refused here, before a check says ok: uvloop asked, not installed
    except ValueError as exc:
        _say(str(exc), fmt)
        return 2
    if args.check:
        ok = f"{args.config}: ok ({len(config.groups)} groups, {len(config.topics)} topics)"
        try:
            print(logs.json_line("INFO", "ddmq.proxy", ok) if fmt == "json" else ok, flush=True)
        except BrokenPipeError:
            clitools.detach_stdout()
            return 1
        return 0
    return _run(config, args.config, args.watch_interval_ms, fmt, loop_choice)


def _run(config: ProxyConfig, config_path: str, watch_interval_ms: int, fmt: str, loop_choice: str) -> int:
    import asyncio

    from ddmq.protocol.native import loop_factory
    from ddmq.proxy.service import ProxyService

    try:
        with asyncio.Runner(loop_factory=loop_factory(loop_choice)) as runner:
            runner.run(serve(ProxyService(config), config_path, watch_interval_ms, fmt))
    except DdmqError as exc:
        _say(str(exc), fmt)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
