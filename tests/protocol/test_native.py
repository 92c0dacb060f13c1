"""ddmq.protocol.native: which hot path this install runs, and the event loop choices."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from collections.abc import Callable
from importlib import machinery
from pathlib import Path
from typing import Any

import pytest

from ddmq.protocol import native
from ddmq.protocol.native import COMPILED, GC_THRESHOLDS, hot_path, loop_factory, loop_name, resolve_loop
from tests.harness.clientproc import ClientProcess

REPO = Path(__file__).resolve().parents[2]


def test_loop_choices_resolve_and_unknown_ones_are_refused() -> None:
    assert resolve_loop("auto") == "uvloop"  # a dependency wherever it installs (not on Windows)
    assert resolve_loop("asyncio") == "asyncio" and resolve_loop("uvloop") == "uvloop"
    with pytest.raises(ValueError, match="none of auto, uvloop, asyncio"):
        resolve_loop("trio")


def test_uvloop_asked_for_but_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "uvloop_available", lambda: False)
    assert resolve_loop("auto") == "asyncio"
    with pytest.raises(ValueError, match="'uvloop' is not installed"):
        loop_factory("uvloop")


@pytest.mark.parametrize(("choice", "expected"), [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_each_factory_makes_the_loop_it_names_and_sets_no_policy(choice: str, expected: str) -> None:
    policy = asyncio.get_event_loop_policy()

    async def running() -> str:
        return loop_name(asyncio.get_running_loop())

    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        assert runner.run(running()) == expected
    assert asyncio.get_event_loop_policy() is policy


def test_every_compiled_module_has_its_python_source() -> None:
    for name in COMPILED:
        assert (REPO / (name.removeprefix("ddmq.").replace(".", "/") + ".py")).is_file(), name


def test_the_hot_path_is_what_the_modules_load_from() -> None:
    suffixes = tuple(machinery.EXTENSION_SUFFIXES)
    origins = [importlib.util.find_spec(name).origin or "" for name in COMPILED]  # type: ignore[union-attr]
    compiled = [origin.endswith(suffixes) for origin in origins]
    path = hot_path()
    if all(compiled):
        assert path == ("compiled", "")
    elif not any(compiled):
        assert path.kind == "pure"
        from_sources = Path(native.__file__).resolve().parent.parent.name != "ddmq"
        assert path.reason.startswith("editable install" if from_sources else "no compiled modules"), path
    else:
        assert path.kind == "partial" and "pure" in path.reason


async def _heap_after_ready(spec: None, ready: Callable[[], None]) -> dict[str, Any]:
    before = {"frozen": gc.get_freeze_count(), "thresholds": list(gc.get_threshold())}
    ready()
    return {"before": before, "frozen": gc.get_freeze_count(), "thresholds": list(gc.get_threshold())}


def test_a_bench_client_process_settles_its_heap_when_ready_as_the_proxy_does() -> None:
    """The benchmarks' client process (spawned, so a fresh interpreter) freezes what its imports left
    and takes the proxy's thresholds once it says it is ready, not before."""
    with ClientProcess(_heap_after_ready, None) as process:
        result = process.result(60)
    assert result["before"] == {"frozen": 0, "thresholds": [700, 10, 10]}
    assert result["frozen"] > 1000  # the imports' objects, out of the collector's sight
    assert result["thresholds"] == list(GC_THRESHOLDS)
