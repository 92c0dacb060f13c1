"""What every scenario shares: settings, the proxy's group config, and running one client load."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.dataset import QUEUES, TOPIC
from tests.harness.clientproc import ClientProcess, Load
from tests.harness.machine import log

__all__ = ["ORDER_KEYS", "Settings", "log", "proxy_sections", "run_load"]

#: Order-key variants: (row id suffix, order_key, actions). The body is only parsed for the JSONPath.
ORDER_KEYS: dict[str, tuple[str, list[str]]] = {
    "KEY": ("KEY", ["Order", "PullServer"]),
    "JSONPath": ("$.k", ["Json", "Order", "PullServer"]),
    "QID": ("QID", ["Order", "PullServer"]),
}


@dataclass(frozen=True)
class Settings:
    quick: bool
    #: The throughput row whose proxy is profiled (``--profile [ROW]``), or None.
    profile: str | None
    results_dir: Path

    def size(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def seconds(self, quick: float, full: float) -> float:
        return quick if self.quick else full


#: Retention for scenarios that drain one backlog many times (a fresh group each, beside raw consumer
#: groups the proxy does not know): the default (``consumed``) would trim what the first group consumed.
KEEP_BACKLOG: dict[str, Any] = {"consumed": False}


def proxy_sections(
    group: str, *, retention: dict[str, Any] | None = KEEP_BACKLOG, **topic_config: Any
) -> dict[str, Any]:
    """The ``topics`` and ``groups`` config sections for one group consuming the bench topic;
    ``retention`` None leaves the topic's retention at the proxy's default."""
    topic: dict[str, Any] = {"queues": QUEUES}
    if retention is not None:
        topic["retention"] = retention
    return {"topics": {TOPIC: topic}, "groups": {group: {TOPIC: topic_config}}}


def run_load(
    load: Load, spec: Any, timeout_s: float, *, on_ready: Callable[[], None] | None = None
) -> dict[str, Any]:
    """Run ``load`` in the client process; ``on_ready`` runs once its connections are up."""
    with ClientProcess(load, spec) as process:
        process.wait_ready(60)
        if on_ready is not None:
            on_ready()
        return process.result(timeout_s)
