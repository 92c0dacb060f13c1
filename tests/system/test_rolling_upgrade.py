"""A rolling upgrade from the previous release: proxies of that release (installed from git into a venv
of their own, pure Python, cached between runs) and of this one share a group while the deploy runs.

Two proxies of the previous release serve 8 queues holding a backlog; per proxy a bare Thrift client
and the project's SDK consumer pull. Then, one at a time, each is sent SIGTERM and replaced by this
release under the same instance id, with one step rolled back on the way, so queues change hands in
every direction: old to old, old to new, new to old (the rollback), new to new. Checked over the whole
run: nothing lost (every message acked, committed offsets equal to produce offsets), every key in order
by lease term over every delivery (the read audit, written alike by both releases), one reader per
term; printed: the stop-to-serving time of each step and the longest gap per queue.

"The previous release" is main just before the hand-off work (a64a750, "a released lease moves its
term on"): what runs in a deployment about to take this release. docs/running.md says which
versions may share a group.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import tarfile
import time
import venv
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from ddmq.protocol.redis import keys
from tests.harness.rolling import (
    QUEUES,
    Pullers,
    backlog,
    longest_gaps,
    produce,
    proxy,
    served_again,
    served_since,
    settled,
)

from ..support import ProxyProcess, acked_prefixes, check_order_by_term, check_single_reader, until

PREVIOUS_RELEASE = "9fc126c8a2c9ae5bcc372cb0375ff1773a947d92"
#: Where the previous release's venv is kept between runs (default ``~/.cache/ddmq-upgrade``).
CACHE_ENV = "DDMQ_UPGRADE_CACHE"
MESSAGES = 40_000
NAMES = ("proxy-a", "proxy-b")
REPO = Path(__file__).resolve().parents[2]


def previous_release_python() -> Path:
    """The python of a venv holding :data:`PREVIOUS_RELEASE`, installed from this repository's history
    on first use (``git archive``, ``DDMQ_COMPILE=0``: a minute) and reused while its marker is there."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "ddmq-upgrade")
    home = root / PREVIOUS_RELEASE[:12]
    python, marker = home / "venv" / "bin" / "python", home / "installed"
    if marker.exists() and python.exists():
        return python
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
                           capture_output=True)
    if found.returncode != 0:  # a shallow clone: the history it needs is fetched once
        subprocess.run(["git", "-C", str(REPO), "fetch", "-q", "--unshallow"], check=True)
    subprocess.run(["rm", "-rf", str(home)], check=True)
    (home / "src").mkdir(parents=True)
    archive = home / "src.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), PREVIOUS_RELEASE], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(home / "src", filter="data")
    venv.create(home / "venv", with_pip=True)
    pip = subprocess.run([str(python), "-m", "pip", "install", "-q", str(home / "src")], capture_output=True,
                         text=True, env={**os.environ, "DDMQ_COMPILE": "0"})
    assert pip.returncode == 0, f"installing the previous release failed:\n{pip.stdout}\n{pip.stderr}"
    where = subprocess.run([str(python), "-c", "import ddmq.proxy.service as s; print(s.__file__)"], check=True,
                           cwd=home, capture_output=True, text=True).stdout
    assert where.startswith(str(home / "venv")), f"the previous release's venv imports ddmq from {where}"
    marker.write_text(PREVIOUS_RELEASE + "\n")
    return python


class Deploy:
    """Two proxies, each of the previous release or of this one, on one port per name, and the steps
    made (what, stop time, back-in-service time)."""

    def __init__(self, tmp_path: Path, redis_url: str, redis_client: aioredis.Redis, old_python: Path) -> None:
        self.proxies: dict[str, ProxyProcess] = {name: proxy(tmp_path, redis_url, name) for name in NAMES}
        self.release = dict.fromkeys(NAMES, "")
        self.pullers = Pullers()
        self.redis = redis_client
        self.old_python = old_python
        self.steps: list[tuple[str, float, float]] = []

    async def start(self, name: str, release: str) -> None:
        process = self.proxies[name]
        old = str(self.old_python)
        # PYTHONPATH left out: it may point at this release's tree, which would shadow the old one's
        process.child.wrap((lambda command: ["env", "-u", "PYTHONPATH", old, *command[1:]]) if release == "old"
                           else None)
        await asyncio.to_thread(process.start)
        self.release[name] = release

    async def settle(self, what: str, members: tuple[str, ...] = NAMES) -> None:
        deadline = time.monotonic() + 90
        while not await settled(self.redis, members):
            assert time.monotonic() < deadline, f"{what}: the queues did not settle within 90 s"
            await asyncio.sleep(0.05)

    async def replace(self, name: str, release: str) -> None:
        """SIGTERM ``name``, wait until the other holds every queue, start ``release`` under the same
        instance id and wait until each holds its own queues and every queue is served again."""
        was = self.release[name]
        stopped_at = time.time()
        assert await asyncio.to_thread(self.proxies[name].stop) == 0, self.proxies[name].log_tail()
        await self.settle(f"after stopping {was} {name}", tuple(n for n in NAMES if n != name))
        await self.start(name, release)
        await self.settle(f"after starting {release} {name}")
        back = time.time()
        await served_again(self.redis, self.pullers.log, back)
        self.steps.append((f"{name} {was}->{release} beside {self.release[self.other(name)]}", stopped_at, back))

    @staticmethod
    def other(name: str) -> str:
        return NAMES[1 - NAMES.index(name)]

    async def stop(self) -> list[int]:
        await self.pullers.close()
        return [await asyncio.to_thread(p.stop) for p in self.proxies.values()]


@pytest.mark.timeout(480)  # the first run on a machine installs the previous release: 1-3 minutes
async def test_a_rolling_upgrade_from_the_previous_release_loses_nothing_and_keeps_every_key_in_order(
    redis_url: str, redis_client: aioredis.Redis, tmp_path: Path
) -> None:
    old_python = await asyncio.to_thread(previous_release_python)
    produced: dict[str, int] = {}
    await asyncio.to_thread(produce, redis_url, MESSAGES, produced, random.Random(4646))
    deploy = Deploy(tmp_path, redis_url, redis_client, old_python)
    log = deploy.pullers.log
    try:
        for name in NAMES:
            await deploy.start(name, "old")
            await deploy.pullers.add(name, deploy.proxies[name].port)
        await deploy.settle("two proxies of the previous release")
        await until("deliveries from every queue", lambda: served_since(log, 0), 30)
        started = time.time()
        await deploy.replace("proxy-a", "new")  # old -> old on the stop, old -> new on the start
        await deploy.replace("proxy-a", "new")  # new -> old and old -> new: the step rolled back and redone
        await deploy.replace("proxy-b", "new")  # old -> new, then new -> new
        ended = time.time()
        left = await backlog(redis_client)
        deploy.pullers.slow = False
        await until("every message acked", lambda: acked_prefixes(log) == produced, 120)
    finally:
        codes = await deploy.stop()
    assert codes == [0, 0]

    produce_next = [int(await redis_client.get(keys.sequence("t", q)) or 0) + 1 for q in range(QUEUES)]
    committed = [int(await redis_client.get(keys.committed("g", "t", q)) or 0) for q in range(QUEUES)]
    assert committed == produce_next, "lost: committed offsets short of the produced ones"
    records = [json.loads(line) for p in deploy.proxies.values()
               for line in (p.config_path.parent / "reads.jsonl").read_text().splitlines() if line.strip()]
    moves = check_single_reader(records)
    checker = check_order_by_term(records, log)
    assert checker.violations == [], checker.violations[:5]
    assert checker.missing(produced) == {}
    gaps = longest_gaps(log, started, ended)
    print(f"\nrolling upgrade from {PREVIOUS_RELEASE[:7]}: {MESSAGES} messages, {len(log)} deliveries, "
          f"{checker.duplicates} delivered again after their ack, {moves} queue moves, backlog left {left}; "
          f"stop to back in service (s): {[(what, round(b - a, 2)) for what, a, b in deploy.steps]}; "
          f"longest gap per queue (s): { {q: round(g, 2) for q, g in gaps.items()} }")
