"""Live configuration: reload the config file into a running proxy, without a restart, on request
(the CLI wires SIGHUP to :meth:`ConfigReloader.request`) or when the file changes.

What changes live is consumption, the ``groups`` and ``topics`` sections, and what ``/metrics``
exports (``metrics``); the registry of running groups applies a new config
(:meth:`~ddmq.proxy.groups.registry.GroupRegistry.apply`, which says what happens to each added,
removed or changed (group, topic)). Every other top-level field belongs to the process (Redis,
listeners, leases, instance id, intervals): a change is logged and ignored until a restart.

An invalid file never gets applied (:func:`ddmq.config.load` rejects it); a config that cannot be
applied raises :class:`ConfigError` before anything changed. Either way the running config stays.

>>> reloader = ConfigReloader(service.reload, "proxy.yaml")
>>> reloader.start()
>>> loop.add_signal_handler(signal.SIGHUP, reloader.request)
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from ddmq.config.loader import load
from ddmq.config.schema import ProxyConfig
from ddmq.proxy.core.errors import DdmqError
from ddmq.proxy.groups.changes import ConfigChange

log = logging.getLogger(__name__)


class ConfigReloader:
    """Reloads the config file through ``apply`` (the service's reload, which serialises reloads and
    refuses them while the proxy is not running) on :meth:`request` (the CLI wires SIGHUP to it) and,
    with ``watch_interval_ms`` > 0, whenever the file's content changes. Reloads run one at a time;
    requests arriving meanwhile are merged into one more reload."""

    def __init__(
        self, apply: Callable[[ProxyConfig], Awaitable[ConfigChange]], path: str | Path, watch_interval_ms: int = 0
    ) -> None:
        self._apply = apply
        self._path = Path(path)
        self._watch_s = watch_interval_ms / 1000
        self._requested = asyncio.Event()
        self._digest = self._read_digest()
        self._tasks: list[asyncio.Task[None]] = []
        self._current: asyncio.Task[ConfigChange | None] | None = None

    def start(self) -> None:
        if self._tasks:
            raise RuntimeError("ConfigReloader already started")
        self._tasks.append(asyncio.create_task(self._serve_requests(), name="config-reload"))
        if self._watch_s > 0:
            self._tasks.append(asyncio.create_task(self._watch(), name="config-watch"))

    async def close(self) -> None:
        """Stop watching and serving requests; a reload under way is finished, not cut short."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._current is not None:
            await asyncio.gather(self._current, return_exceptions=True)

    def request(self) -> None:
        """Ask for a reload (safe from a signal handler installed with ``loop.add_signal_handler``)."""
        self._requested.set()

    async def reload(self) -> ConfigChange | None:
        """Load the file and apply it now; None when it was rejected (the reason is logged)."""
        self._digest = self._read_digest()
        try:
            config = load(self._path)
            return await self._apply(config)
        except DdmqError as exc:
            log.error("config reload rejected; the running config stays in force: %s", exc)
            return None

    async def _serve_requests(self) -> None:
        while True:
            await self._requested.wait()
            self._requested.clear()
            # Shielded: a half-applied reload would leave consumers half retired.
            self._current = asyncio.create_task(self.reload(), name="config-reload-apply")
            try:
                await asyncio.shield(self._current)
            except Exception:  # a bug must not end reloading for the life of the process
                log.exception("config reload failed")

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._watch_s)
            digest = self._read_digest()
            if digest is not None and digest != self._digest:
                log.info("%s changed; reloading", self._path)
                self._digest = digest
                self.request()

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self._path.read_bytes()).digest()
        except OSError:
            return None
