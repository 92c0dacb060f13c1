"""ReadAudit: an optional JSON-lines record of every stream read, with the reader's lease term.

Enabled by ``audit_log: PATH`` in the config. One line per non-empty read batch::

    {"t": 1732240000.123456, "rt": 1732240000.1242, "owner": "proxy-a", "group": "g", "topic": "t",
     "qid": 3, "term": 7, "first": 1201, "last": 1456}

It answers "who read this queue, under which lease, when" after the fact: the cluster tests check
from it that no queue ever had two readers (one owner per term, terms never overlapping in time), and
an operator can use it to trace a message to the proxy that delivered it. ``t`` is this host's wall
clock, exact for comparing with other records of the host; ``rt`` is Redis's time as the proxy knows
it (its lease clock, within a few milliseconds), so the records of proxies whose own clocks disagree
still line up. Lines are written
unbuffered-per-line from the event loop; a read batch is up to ``read_batch_size`` messages, so the
cost is one short write per batch, not per message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

#: When a read was taken: (this host's wall clock, Redis's clock), in seconds.
Stamp = tuple[float, float]


class ReadAudit:
    def __init__(self, path: str | Path, owner: str, redis_now: Callable[[], float] | None = None) -> None:
        self.path = Path(path)
        self.owner = owner
        #: Redis's time (seconds) as the proxy knows it; this host's wall clock when not given.
        self._redis_now = redis_now or time.time
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = self.path.open("a", encoding="utf-8", buffering=1)

    def now(self) -> Stamp:
        return time.time(), self._redis_now()

    def record(
        self, group: str, topic: str, qid: int, term: int, first: int, last: int, at: Stamp | None = None
    ) -> None:
        """One read batch; ``at``: when it was taken under the lease (:meth:`now`; default now)."""
        if self._file is None:
            return
        wall, redis_time = self.now() if at is None else at
        self._file.write(
            json.dumps(
                {"t": wall, "rt": round(redis_time, 4), "owner": self.owner, "group": group, "topic": topic,
                 "qid": qid, "term": term, "first": first, "last": last},
                separators=(",", ":"),
            )
            + "\n"
        )

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
