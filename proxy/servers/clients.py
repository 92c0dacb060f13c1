"""The clients pulling from this proxy, as the console lists them: per connection (protocol and peer
address) and group, the client's version string, its last pull, and the messages it holds.

The server adapters report each pull and each set of results (:meth:`ClientTracker.pulled`,
:meth:`ClientTracker.answered`); nothing here touches the engine. A message counts as held by the
client it was delivered to until a result for it arrives (over any connection) or its ack deadline
(the topic's ``timeout_ms``) passes, when the proxy delivers it again. Memory is bounded: at most
:data:`MAX_CLIENTS` clients (the longest idle forgotten first, and any idle for
:data:`FORGET_AFTER_MS`) and :data:`MAX_HELD` held messages over all of them (past it, a delivery is
not tracked and the count reads low).

>>> tracker = ClientTracker(lambda group, topic: 5000)
>>> tracker.pulled("thrift", "10.0.0.7:51234", "cg_rides", "2.3.1", batch, results)
>>> tracker.clients("cg_rides")   # [PullClient(protocol="thrift", peer=..., in_flight=12, ...)]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from ddmq.proxy.core.types import PullBatch, QueueResult

__all__ = ["ClientTracker", "PullClient"]

MAX_CLIENTS: Final = 1000
MAX_HELD: Final = 200_000
FORGET_AFTER_MS: Final = 10 * 60 * 1000
#: Longest version string kept (a client sends what it likes).
MAX_VERSION_CHARS: Final = 100

_ClientKey = tuple[str, str, str]  # protocol, peer, group
_Held = tuple[str, str, int, int]  # group, topic, qid, offset


@dataclass(frozen=True)
class PullClient:
    protocol: str
    peer: str
    group: str
    version: str | None
    first_pull_ms: int
    last_pull_ms: int
    pulls: int
    #: Messages delivered to it and not answered, whose ack deadline has not passed.
    in_flight: int


class _Client:
    __slots__ = ("first_ms", "held", "last_ms", "pulls", "version")

    def __init__(self, now: int) -> None:
        self.first_ms = self.last_ms = now
        self.pulls = 0
        self.version: str | None = None
        self.held: dict[_Held, int] = {}  # -> ack deadline (ms)


class ClientTracker:
    def __init__(self, timeout_ms: Callable[[str, str], int], clock_ms: Callable[[], int] | None = None) -> None:
        self._timeout_ms = timeout_ms
        self._now = clock_ms or (lambda: int(time.time() * 1000))
        self._clients: dict[_ClientKey, _Client] = {}
        self._holder: dict[_Held, _ClientKey] = {}

    def pulled(self, protocol: str, peer: str, group: str, version: str | None, batch: PullBatch,
               results: Iterable[QueueResult] = ()) -> None:
        """A pull answered ``batch`` (it carried ``results``, already applied)."""
        now = self._now()
        self.answered(results, group)
        key = (protocol, peer, group)
        client = self._clients.get(key)
        if client is None:
            self._make_room(now)
            client = self._clients[key] = _Client(now)
        client.last_ms = now
        client.pulls += 1
        if version:
            client.version = version[:MAX_VERSION_CHARS]
        if batch.queue is None or not batch.messages:
            return
        topic, qid = batch.queue.topic, batch.queue.qid
        deadline = now + self._timeout_ms(group, topic)
        for message in batch.messages:
            held = (group, topic, qid, message.offset)
            if len(self._holder) >= MAX_HELD and held not in self._holder:
                break
            previous = self._holder.get(held)
            if previous is not None and previous != key and previous in self._clients:
                self._clients[previous].held.pop(held, None)  # redelivered: the other one lost it
            self._holder[held] = key
            client.held[held] = deadline

    def answered(self, results: Iterable[QueueResult], group: str | None = None) -> None:
        """Acks and fails arrived: those messages are no longer held by anyone."""
        for result in results:
            owner = result.group or group
            if owner is None or not result.qid.isdigit():
                continue
            qid = int(result.qid)
            for offset in (*result.success, *result.fail):
                held = (owner, result.topic, qid, offset)
                key = self._holder.pop(held, None)
                if key is not None and key in self._clients:
                    self._clients[key].held.pop(held, None)

    def clients(self, group: str) -> list[PullClient]:
        """The clients of ``group`` seen within :data:`FORGET_AFTER_MS`, most recent pull first."""
        now = self._now()
        self._expire(now)
        found = []
        for (protocol, peer, name), client in self._clients.items():
            if name == group:
                found.append(PullClient(protocol, peer, name, client.version, client.first_ms, client.last_ms,
                                        client.pulls, len(client.held)))
        return sorted(found, key=lambda c: -c.last_pull_ms)

    def _expire(self, now: int) -> None:
        for key in [key for key, client in self._clients.items() if now - client.last_ms > FORGET_AFTER_MS]:
            self._forget(key)
        for client in self._clients.values():
            for held in [held for held, deadline in client.held.items() if deadline <= now]:
                del client.held[held]
                self._holder.pop(held, None)

    def _make_room(self, now: int) -> None:
        if len(self._clients) >= MAX_CLIENTS:
            self._expire(now)
        while len(self._clients) >= MAX_CLIENTS:
            self._forget(min(self._clients, key=lambda key: self._clients[key].last_ms))

    def _forget(self, key: _ClientKey) -> None:
        client = self._clients.pop(key)
        for held in client.held:
            if self._holder.get(held) == key:
                del self._holder[held]
