"""Instructions per message of the proxy's engine path, counted by valgrind's callgrind.

``python bench/instructions.py [--order-key KEY|QID|$.k] [--max-per-key N] [--thrift | --client-decode]
[--loop asyncio|uvloop] [--python PATH] [--keep DIR [--by-object]]``

CPU time on a shared virtual machine drifts by a quarter from run to run; instruction counts do not,
so this is the figure to compare two versions of the hot path by. Two drains of a backlog run under
callgrind, a small and a large one; their difference divided by the difference in messages is what one
more message costs, with start-up and shutdown cancelled out.

- default: a real :class:`~ddmq.proxy.service.ProxyService` and an embedded Redis in the traced
  process, drained by 8 pullers calling ``ProxyService.api.pull`` (acks on the next pull): reading, the
  chain (``Order, PullServer``; ``Json`` first for a JSONPath order key), the key gate, the buffer and
  acks, no Thrift; the traced process runs asyncio's own event loop (``--loop uvloop``: uvloop's);
- ``--thrift``: the same service drained through its Thrift server by the benchmark's pull clients in
  a child process (not traced), so the figure is the proxy's whole cost, request decoding and reply
  encoding included;
- ``--client-decode``: no proxy and no Redis, the client's side: a 64-message pull reply (the one
  ``bench/micro.py`` times) decoded as a client decodes it, over and over.

Each run also says which hot path the traced process ran, from the modules it had loaded: how many
of ``protocol/native.py``'s compiled list came from extension modules, and the file of the engine's
``pull_buffer`` or the client's ``message_reader``. An editable install or a checkout on the path runs
the ``.py`` files; to measure a compiled build, point ``--python`` at the interpreter of a regular
install (``pip install .``), e.g. ``--python .venv-compiled/bin/python``: the traced process imports
``ddmq`` from that interpreter's environment (the checkout's root, which has no ``ddmq`` folder, goes
at the end of the path for ``bench``). ``--keep DIR`` keeps callgrind's two output files, and
``--by-object`` then splits the instructions per message by object file: libpython's bytecode loop
(interpreted Python), the rest of libpython, the compiled modules, hiredis, libc.

The backlog is produced by a child process too. ``--python`` traces another install's interpreter
(say, a venv of an older release) with this same harness: the traced side imports only what every
release has (``ddmq.config.parse``, ``ProxyService``, ``QueueResult``, ``AsyncProducer``,
``EmbeddedRedis``; ``--client-decode`` needs the hand-written reply encoder and the compact reader),
while the pull clients of ``--thrift`` run on this interpreter. Needs ``valgrind`` (Debian: ``apt-get install
valgrind``); each run takes a minute or two, as callgrind runs the interpreter about 50 times slower.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    here = Path(__file__).resolve().parent
    if sys.path and Path(sys.path[0] or ".").resolve() == here:
        del sys.path[0]
    sys.path.append(str(here.parent))

PULLERS = 8
BATCH = 64

# The traced side (everything down to _traced) imports ddmq lazily and only what every release has.


async def produce_engine_backlog(url: str, messages: int, topic: str = "t", traced: bool = False) -> None:
    """The engine figures' backlog: ``messages`` JSON bodies over 1,000 keys; ``traced``: each with a
    ``traceparent`` of its own (an unsampled trace), as a traced producer sends them."""
    from ddmq.protocol.produce.producer import AsyncProducer

    producer = AsyncProducer(url)
    rng = random.Random(1)
    try:
        for start in range(0, messages, 1000):
            batch: list[dict[str, Any]] = []
            for seq in range(start, min(start + 1000, messages)):
                key = f"k{rng.randrange(1000):04d}"
                batch.append({"value": f'{{"k":"{key}","seq":{seq}}}', "key": key})
                if traced:
                    batch[-1]["properties"] = {"traceparent": f"00-{rng.getrandbits(128):032x}-{seq + 1:016x}-00"}
            await producer.send_batch(topic, batch)
    finally:
        await producer.close()


def engine_config(url: str, order_key: str = "KEY", topic: str = "t") -> Any:
    """One group reading ``topic`` (8 queues) with the chain ``Order, PullServer``; a JSONPath order key
    (``$.k``) gets ``Json, Order, PullServer``, as in the benchmark's P1j."""
    from ddmq.config import parse

    actions = ["Json", "Order", "PullServer"] if order_key.startswith("$") else ["Order", "PullServer"]
    return parse(
        {
            "instance_id": "engine-bench",
            "redis": url,
            "thrift": {"host": "127.0.0.1", "port": 0},
            "shutdown_grace_ms": 0,
            "topics": {topic: {"queues": 8}},
            "groups": {"g": {topic: {"order_key": order_key, "actions": actions}}},
        }
    )


async def drain_engine(service: Any, messages: int, max_per_key: int | None = None, topic: str = "t",
                       request_ids: bool = False) -> None:
    """:data:`PULLERS` pullers call ``pull`` on the request surface (acks on their next pull) until
    ``messages`` arrived; with ``request_ids`` every pull names a fresh request id, as the SDK's do."""
    try:
        from ddmq.proxy.core.types import QueueResult
    except ImportError:  # a release from before proxy/ had subpackages
        from ddmq.proxy.types import QueueResult  # type: ignore[no-redef]

    received = 0

    async def puller() -> None:
        nonlocal received
        results: list[Any] = []
        while received < messages:
            named = {"request_id": uuid.uuid4().hex} if request_ids else {}  # older releases know no ids
            batch = await service.pull("g", topic, BATCH, 200, results, max_per_key=max_per_key, **named)
            received += len(batch.messages)
            results = []
            if batch.queue is not None:
                offsets = [m.offset for m in batch.messages]
                results = [QueueResult("g", batch.queue.topic, str(batch.queue.qid), offsets, [])]
        if results:
            await service.submit(results)

    await asyncio.gather(*(puller() for _ in range(PULLERS)))


async def _drain_in_process(url: str, topic: str, messages: int, order_key: str, max_per_key: int, _: str) -> None:
    from ddmq.proxy.service import ProxyService

    async with ProxyService(engine_config(url, order_key, topic)) as service:
        # the request surface: ``service.api`` (older releases served it on the service itself)
        await drain_engine(getattr(service, "api", service), messages, max_per_key, topic)


async def _drain_over_thrift(
    url: str, topic: str, messages: int, order_key: str, max_per_key: int, clients_python: str
) -> None:
    from ddmq.proxy.service import ProxyService

    async with ProxyService(engine_config(url, order_key, topic)) as service:
        child = await asyncio.create_subprocess_exec(
            clients_python,
            __file__,
            "--clients",
            str(service.thrift_port),
            str(messages),
            str(max_per_key),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"the pull clients failed ({child.returncode})")
        result = json.loads(out)
        if result["unique"] != messages:
            raise RuntimeError(f"the pull clients got {result['unique']} of {messages} messages")


def _clients(port: int, messages: int, max_per_key: int) -> None:
    from bench.clients import ProxyDrain, drain_proxy

    runs = max_per_key if max_per_key > 1 else None
    spec = ProxyDrain(port, "g", messages, PULLERS, BATCH, wait_commit=False, max_per_key=runs)
    print(json.dumps(asyncio.run(drain_proxy(spec, lambda: None))))


def reply_messages() -> list[Any]:
    """The 64 messages of the pull reply the client-side figures decode (``micro.py`` too): bodies like
    the benchmarks', keys from 1,000, a produce time each."""
    from ddmq.proxy.core.types import StoredMessage

    rng = random.Random(1)
    body = b'{"k":"k0042","seq":17,"ts":1763776220.12}'
    produced_ms = 1_763_776_220_123
    return [StoredMessage(100_000 + i, body, f"k{rng.randrange(1000):04d}", "", {}, produced_ms) for i in range(BATCH)]


def _traced_decode(messages: int) -> None:
    """The body of a ``--client-decode`` run: one reply encoded, then decoded ``messages / 64`` times."""
    from ddmq.protocol.wire import ConsumerService, decode
    from ddmq.proxy.core.pull_codec import encode_pull_reply

    payload = encode_pull_reply(7, "g", "t", "3", reply_messages())[4:]
    for _ in range(messages // BATCH):
        decode(payload, lambda name, mtype: ConsumerService.pull_result())


def _what_ran() -> str:
    """Which hot path this (traced) process ran, from the modules it loaded."""
    from importlib.machinery import EXTENSION_SUFFIXES

    try:
        from ddmq.protocol import native

        listed: tuple[str, ...] = native.COMPILED
    except ImportError:  # a release from before the compiled build
        listed = ()
    loaded = [sys.modules[name] for name in listed if name in sys.modules]
    compiled = sum(str(getattr(module, "__file__", "")).endswith(tuple(EXTENSION_SUFFIXES)) for module in loaded)
    named = [
        f"{name.rpartition('.')[2]} from {getattr(module, '__file__', '?')}"
        for name, module in sorted(sys.modules.items())
        if name.startswith("ddmq.") and name.endswith((".pull_buffer", ".message_reader"))
    ]
    return f"{compiled} of the {len(loaded)} loaded modules of the compiled list are extensions; " + "; ".join(named)


def _traced(
    messages: int, topic: str, order_key: str, max_per_key: int, thrift: bool, clients_python: str, loop: str
) -> None:
    """The body of one traced run: embedded Redis, backlog from a child process, one drain on ``loop``."""
    try:
        from ddmq.proxy.store.embedded import EmbeddedRedis
    except ImportError:  # a release from before proxy/ had subpackages
        from ddmq.proxy.embedded import EmbeddedRedis  # type: ignore[no-redef]

    with tempfile.TemporaryDirectory() as data_dir:
        redis_server = EmbeddedRedis(data_dir).start()
        try:
            subprocess.run([sys.executable, __file__, "--produce", redis_server.url, topic, str(messages)], check=True)
            drain = _drain_over_thrift if thrift else _drain_in_process
            with asyncio.Runner(loop_factory=_loop_factory(loop)) as runner:
                runner.run(drain(redis_server.url, topic, messages, order_key, max_per_key, clients_python))
        finally:
            redis_server.stop()
    print(f"ran: {_what_ran()}")


def _loop_factory(loop: str) -> Any:
    # Not ddmq.protocol.native.loop_factory: the traced side runs older releases too (see above).
    if loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None  # asyncio's own


def _by_object(out: Path) -> dict[str, int]:
    """Self instructions per object file in one callgrind output file, libpython's bytecode loop
    (``_PyEval_EvalFrameDefault``: interpreted Python) apart from the rest of it (objects, calls, GC,
    which compiled code uses too). Reads callgrind's format: ``ob=``/``fn=`` set the context (names
    compressed as ``(id) name``, later ``(id)``); a cost line right after ``calls=`` is a call's
    inclusive cost, not self cost."""
    names: dict[tuple[str, str], str] = {}
    tables = {"ob": "ob", "cob": "ob", "fn": "fn", "cfn": "fn"}
    totals: dict[str, int] = {}
    obj = fn = ""
    call_cost_next = False
    for line in out.read_text().splitlines():
        if line[:1].isdigit() or line[:1] in ("+", "-", "*"):
            fields = line.split()
            if call_cost_next:
                call_cost_next = False
            elif len(fields) > 1:
                name = Path(obj).name
                if name.startswith("libpython"):
                    name += " (bytecode loop)" if fn.startswith("_PyEval_EvalFrameDefault") else " (the rest)"
                totals[name] = totals.get(name, 0) + int(fields[1])
            continue
        call_cost_next = line.startswith("calls=")
        kind, _, value = line.partition("=")
        if kind not in tables:
            continue
        ident, _, text = value.partition(" ")
        resolved = names.setdefault((tables[kind], ident), text) if text else names.get((tables[kind], ident), ident)
        if kind == "ob":
            obj = resolved
        elif kind == "fn":
            fn = resolved
    return totals


def _print_by_object(small: tuple[int, Path], large: tuple[int, Path]) -> None:
    (n_small, out_small), (n_large, out_large) = small, large
    before, after = _by_object(out_small), _by_object(out_large)
    per_message = {name: (after[name] - before.get(name, 0)) / (n_large - n_small) for name in after}
    total = sum(per_message.values())
    print("instructions per message by object file (self cost; 1% of the total or more):")
    for name, count in sorted(per_message.items(), key=lambda item: -item[1]):
        if count >= total / 100:
            print(f"  {count:10,.0f}  {count / total:6.1%}  {name}")


def _count(messages: int, args: argparse.Namespace, out_dir: Path) -> tuple[int, str]:
    """The instructions of one traced run of ``messages``, and what it said it ran."""
    from bench.dataset import TOPIC

    out = out_dir / f"callgrind.{messages}"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", args.python, __file__]
    if args.client_decode:
        command += ["--traced-decode", str(messages)]
    else:
        thrift = "1" if args.thrift else "0"
        # TOPIC: the benchmark clients' topic
        command += [
            "--traced", str(messages), TOPIC, args.order_key, str(args.max_per_key), thrift, sys.executable, args.loop
        ]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"the traced run of {messages} messages failed:\n{run.stderr[-3000:]}")
    summary = re.search(r"^summary: (\d+)", out.read_text(), re.MULTILINE)
    if summary is None:
        raise SystemExit(f"no summary line in {out}")
    ran = re.search(r"^ran: (.*)$", run.stdout, re.MULTILINE)
    return int(summary.group(1)), ran.group(1) if ran else "(not reported)"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--produce":
        asyncio.run(produce_engine_backlog(sys.argv[2], int(sys.argv[4]), sys.argv[3]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--clients":
        _clients(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--traced":
        _traced(
            int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1", sys.argv[7], sys.argv[8]
        )
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--traced-decode":
        _traced_decode(int(sys.argv[2]))
        print(f"ran: {_what_ran()}")
        return 0
    parser = argparse.ArgumentParser(prog="python bench/instructions.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--order-key", default="QID",
        help="KEY, QID or a JSONPath such as $.k (with the chain Json, Order, PullServer); default QID",
    )
    parser.add_argument("--max-per-key", type=int, default=64, help="ordered runs per pull (1: none; default 64)")
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument("--thrift", action="store_true", help="drain through the Thrift server (clients in a child)")
    modes.add_argument(
        "--client-decode", action="store_true",
        help="the client's decoding of 64-message pull replies instead (no proxy, no Redis; "
        "default 6,400 and 64,000 messages)",
    )
    parser.add_argument(
        "--python", default=sys.executable,
        help="the interpreter to measure (default: this one); a regular install's (pip install .) for the "
        "compiled build: ddmq is imported from its environment, and each run prints which hot path it loaded",
    )
    parser.add_argument(
        "--loop", choices=("asyncio", "uvloop"), default="asyncio",
        help="the traced process's event loop (default asyncio's own, as the figures in bench/README.md "
        "were taken; the proxy runs on uvloop where it is installed)",
    )
    parser.add_argument("--small", type=int, default=None, help="messages of the small drain")
    parser.add_argument("--large", type=int, default=None, help="messages of the large drain")
    parser.add_argument(
        "--keep", type=Path, default=None, metavar="DIR",
        help="keep callgrind's output files in DIR (callgrind.<messages>), for callgrind_annotate",
    )
    parser.add_argument(
        "--by-object", action="store_true",
        help="with --keep: also the instructions per message by object file (libpython's bytecode loop, "
        "the rest of libpython, the compiled modules, hiredis, libc, ...)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    # Over Thrift with one message per pull every message is a request: fewer of them say as much.
    one_per_pull = args.thrift and args.max_per_key <= 1
    small = args.small or (500 if one_per_pull else 6_400 if args.client_decode else 10_000)
    large = args.large or (2_500 if one_per_pull else 64_000 if args.client_decode else 30_000)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        runs = {n: _count(n, args, args.keep) for n in (small, large)}
    else:
        with tempfile.TemporaryDirectory() as out_dir:
            runs = {n: _count(n, args, Path(out_dir)) for n in (small, large)}
    counts = {n: count for n, (count, _) in runs.items()}
    per_message = (counts[large] - counts[small]) / (large - small)
    if args.client_decode:
        print(f"the client's decoding of {BATCH}-message pull replies ({args.python})")
    else:
        mode = "Thrift server, clients in a child process" if args.thrift else "in-process pulls"
        print(f"order_key={args.order_key} max_per_key={args.max_per_key} ({mode}; {args.loop}; {args.python})")
    for n, (_, ran) in runs.items():
        print(f"ran ({n:,} messages): {ran}")
    print(f"instructions: {counts[small]:,} for {small:,} messages, {counts[large]:,} for {large:,}")
    print(f"instructions per message: {per_message:,.0f}")
    if args.keep is not None and args.by_object:
        _print_by_object((small, args.keep / f"callgrind.{small}"), (large, args.keep / f"callgrind.{large}"))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
