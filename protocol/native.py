"""Which hot path and which event loop this process runs: the compiled modules, uvloop, and how to tell.

A regular install (``pip install .``) compiles :data:`COMPILED` with mypyc when a C compiler is there
(setup.py reads the list from this file); the ``.py`` files install beside the extensions and stay the
reference, and an install without a compiler, an editable one or ``DDMQ_COMPILE=0`` runs them alone.
:func:`hot_path` says which runs, and why when it is the pure one; ``ddmq-proxy --version``, the proxy's
start-up log and its ``ddmq_build_info`` metric all print it.

The event loop is uvloop where it is installed (not on Windows), asyncio's own otherwise:
:func:`loop_factory` turns a choice (``auto``, ``uvloop``, ``asyncio``) into a factory for
``asyncio.Runner``. Only processes this project starts choose a loop (the proxy, the benchmarks); the
SDK runs on whatever loop its user runs and never installs a policy. The same processes settle their
heap once started (:func:`settle_heap`); the SDK leaves its user's collector alone.

This module imports nothing of the project: setup.py loads it from its path before anything is built.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from collections.abc import Callable
from importlib import machinery
from pathlib import Path
from typing import Final, NamedTuple

__all__ = [
    "COMPILED",
    "GC_THRESHOLDS",
    "LOOP_CHOICES",
    "HotPath",
    "describe",
    "hot_path",
    "loop_factory",
    "loop_name",
    "resolve_loop",
    "settle_heap",
    "uvloop_available",
]

#: The modules a regular install compiles, as they import. The per-message path of the proxy (reading,
#: the chain, the key gate, the buffer, the timing wheel, offsets, acks, the pull reply, the request
#: surface) and the wire codec both sides run per message (request and reply decoding, the compact
#: reader and its ``Message`` loop, the varints). Each earns its place in ``python bench/micro.py`` or
#: ``bench/instructions.py``. Left out on
#: purpose: coroutines at the top of tasks (the Thrift server, the readers, the service, a consumer's
#: ownership task), whose cancellation a compiled frame reports differently (a compiled ownership task
#: left a second proxy of the same process unable to open the queues it claimed), and
#: ``protocol/wire/structs.py`` (thriftpy2 builds its classes at run time).
COMPILED: Final = (
    "ddmq.proxy.store.broker",
    "ddmq.proxy.api.fetch",
    # what a pull with a request id remembers (every pull of the project's SDK names one): the answer's
    # deliveries, one buffer lookup per message
    "ddmq.proxy.api.pull_retries",
    "ddmq.proxy.api.consume",
    # a request's acks and fails, from the request to the buffers
    "ddmq.proxy.api.results",
    "ddmq.proxy.groups.group",
    # every job's owner: what finishing one does (an ack's last step in the engine), the flow control
    "ddmq.proxy.engine.topic_jobs",
    "ddmq.proxy.engine.chain_run",
    # the job the chain runs on, and the engine's, which extends it (a native class extends only a native one)
    "ddmq.actions.job",
    "ddmq.proxy.engine.job",
    "ddmq.proxy.engine.ready_line",
    "ddmq.proxy.engine.offsets",
    "ddmq.proxy.engine.ordering",
    "ddmq.proxy.engine.queue_slot",
    "ddmq.proxy.engine.runs",
    "ddmq.proxy.engine.delivery",
    "ddmq.proxy.engine.pull_buffer",
    "ddmq.proxy.engine.redelivery",
    # a bisect and two additions per message delivered and acked: the end-to-end latency buckets
    "ddmq.proxy.engine.end_to_end",
    "ddmq.proxy.core.types",
    "ddmq.actions.order",
    # with a JSONPath order key: the body parsed once per message, and the getter into it
    "ddmq.actions.json_action",
    "ddmq.config.jsonpath",
    "ddmq.actions.pull_server",
    "ddmq.proxy.core.pull_codec",
    # which client holds which message (the console's view): two dict operations per message delivered
    "ddmq.proxy.servers.clients",
    # a Thrift call from its decoded struct to its reply frame; its coroutines are awaited by the
    # server's connection task, never at the top of one
    "ddmq.proxy.servers.thrift.handler",
    # a connection's frames: its buffer (the protocol the event loop feeds) and the loop that takes each
    # frame to the handler and writes the reply; awaited by the connection's task, never at its top
    "ddmq.proxy.servers.thrift.channel",
    "ddmq.proxy.servers.thrift.frame_loop",
    # what every request passes through: its rules (linger, batch size, results) and the pull timer
    "ddmq.proxy.api.requests",
    "ddmq.proxy.ops.latency",
    # a /metrics scrape: one pass over every queue held, its jobs and its series, with the event loop
    # blocked meanwhile (8,000 queues: bench/README.md, "Metrics scrape")
    "ddmq.proxy.ops.collector",
    "ddmq.proxy.ops.families",
    "ddmq.proxy.ops.rollup",
    "ddmq.proxy.ops.exposition",
    # the wire codec, both sides: varints and the Message layout, the compact reader (requests on the
    # proxy, replies on the clients) and its Message loop, the frame decoder, the writer (acks)
    "ddmq.protocol.wire.layout",
    "ddmq.protocol.wire.reader",
    "ddmq.protocol.wire.message_reader",
    "ddmq.protocol.wire.frames",
    "ddmq.protocol.wire.writer",
)

LOOP_CHOICES: Final = ("auto", "uvloop", "asyncio")


class HotPath(NamedTuple):
    """``kind`` is ``compiled``, ``pure`` or ``partial`` (some modules compiled, some not); ``reason``
    says why a pure or partial one is (empty when compiled)."""

    kind: str
    reason: str


def _compiled(module: str) -> bool:
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        return False
    origin = spec.origin if spec is not None else None
    return origin is not None and origin.endswith(tuple(machinery.EXTENSION_SUFFIXES))


def _why_pure() -> str:
    # Installed, this file is .../ddmq/protocol/native.py; an editable install or a checkout on the path
    # imports it from the sources' own protocol/ folder.
    if Path(__file__).resolve().parent.parent.name != "ddmq":
        return "editable install: compiled modules would shadow the sources"
    return "no compiled modules in this install: built without a C compiler, or with DDMQ_COMPILE=0"


def hot_path() -> HotPath:
    """Whether the modules of :data:`COMPILED` load from C extensions here, and why not if they do not."""
    pure = [name for name in COMPILED if not _compiled(name)]
    if not pure:
        return HotPath("compiled", "")
    if len(pure) == len(COMPILED):
        return HotPath("pure", _why_pure())
    return HotPath("partial", f"{len(pure)} of {len(COMPILED)} modules pure, {pure[0]} first")


def uvloop_available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve_loop(choice: str) -> str:
    """``uvloop`` or ``asyncio`` for a choice of :data:`LOOP_CHOICES`; ValueError for ``uvloop`` when
    it is not installed, or for a choice that is none of them."""
    if choice not in LOOP_CHOICES:
        raise ValueError(f"event loop {choice!r} is none of {', '.join(LOOP_CHOICES)}")
    if choice == "auto":
        return "uvloop" if uvloop_available() else "asyncio"
    if choice == "uvloop" and not uvloop_available():
        raise ValueError("event loop 'uvloop' is not installed (pip install uvloop; not on Windows)")
    return choice


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A new-loop factory for ``asyncio.Runner(loop_factory=...)``: uvloop's or asyncio's, no policy set."""
    if resolve_loop(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which implementation ``loop`` is."""
    return "uvloop" if type(loop).__module__.partition(".")[0] == "uvloop" else "asyncio"


#: Collector thresholds once the heap is settled: young collections every 50,000 allocations, not 700.
GC_THRESHOLDS: Final = (50_000, 20, 100)


def settle_heap() -> None:
    """Once a process has started (imports done, connections up): collect, move what is alive out of
    the collector's sight, and collect the young generation less often.

    The hot path allocates a few objects per message; with the default thresholds the collector ran
    every ~700 of them, and a full collection walked every object the imports left (39,000 in a bench
    client: 12 ms, in the middle of a drain of a fifth of a second). Frozen, a full collection walks
    only what was made since."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def describe(loop: str) -> str:
    """One line for logs and ``--version``: ``hot path: compiled; event loop: uvloop``."""
    path = hot_path()
    why = f" ({path.reason})" if path.reason else ""
    return f"hot path: {path.kind}{why}; event loop: {loop}"
