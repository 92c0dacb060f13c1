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
_Place = tuple[str, str, int]  # group, topic, qid


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
    __slots__ = ("first_ms", "holding", "last_ms", "pulls", "version")

    def __init__(self, now: int) -> None:
        self.first_ms = self.last_ms = now
        self.pulls = 0
        self.version: str | None = None
        #: Its entries in the tracker's held map (a forgotten client's stay there until answered or due).
        self.holding = 0


class ClientTracker:
    """Held messages are kept per queue, offset to (client, ack deadline), and each client counts its
    own: a pull's messages cost one dict entry each, looked up by offset within their queue's map, as do
    their results (this runs for every message delivered and acked)."""

    def __init__(self, timeout_ms: Callable[[str, str], int], clock_ms: Callable[[], int] | None = None) -> None:
        self._timeout_ms = timeout_ms
        self._now = clock_ms or (lambda: int(time.time() * 1000))
        self._clients: dict[_ClientKey, _Client] = {}
        self._held: dict[_Place, dict[int, tuple[_Client, int]]] = {}
        self._held_count = 0

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
        queue = batch.queue
        if queue is None or not batch.messages:
            return
        place = (group, queue.topic, queue.qid)
        held = self._held.get(place)
        if held is None:
            held = self._held[place] = {}
        holding = (client, now + self._timeout_ms(group, queue.topic))
        for message in batch.messages:
            offset = message.offset
            previous = held.get(offset)
            if previous is None:
                if self._held_count >= MAX_HELD:
                    break
                self._held_count += 1
            else:
                previous[0].holding -= 1  # delivered again: whoever had it holds it no more
            held[offset] = holding
            client.holding += 1

    def answered(self, results: Iterable[QueueResult], group: str | None = None) -> None:
        """Acks and fails arrived: those messages are no longer held by anyone."""
        for result in results:
            owner = result.group or group
            qid = result.qid
            if owner is None or not (qid.isascii() and qid.isdigit()):
                continue
            held = self._held.get((owner, result.topic, int(qid)))
            if not held:
                continue
            for offsets in (result.success, result.fail):
                for offset in offsets:
                    holding = held.pop(offset, None)
                    if holding is not None:
                        holding[0].holding -= 1
                        self._held_count -= 1

    def clients(self, group: str) -> list[PullClient]:
        """The clients of ``group`` seen within :data:`FORGET_AFTER_MS`, most recent pull first."""
        now = self._now()
        self._expire(now)
        found = []
        for (protocol, peer, name), client in self._clients.items():
            if name == group:
                found.append(PullClient(protocol, peer, name, client.version, client.first_ms, client.last_ms,
                                        client.pulls, client.holding))
        return sorted(found, key=lambda c: -c.last_pull_ms)

    def holder(self, group: str, topic: str, qid: int, offset: int) -> tuple[str, str, str | None, int] | None:
        """Who holds ``offset`` of the queue (protocol, peer, version or client id, ack deadline in epoch
        ms), or None when no client does. Walks the clients (at most :data:`MAX_CLIENTS`): for one
        operator's question, never on the message path."""
        holding = self._held.get((group, topic, qid), {}).get(offset)
        if holding is None or holding[1] <= self._now():
            return None
        for (protocol, peer, name), client in self._clients.items():
            if client is holding[0] and name == group:
                return protocol, peer, client.version, holding[1]
        return None  # forgotten (the longest idle past MAX_CLIENTS): its deliveries stay counted

    def _expire(self, now: int) -> None:
        for key in [key for key, client in self._clients.items() if now - client.last_ms > FORGET_AFTER_MS]:
            del self._clients[key]
        for place, held in list(self._held.items()):
            for offset in [offset for offset, (_, deadline) in held.items() if deadline <= now]:
                held.pop(offset)[0].holding -= 1
                self._held_count -= 1
            if not held:
                del self._held[place]

    def _make_room(self, now: int) -> None:
        if len(self._clients) >= MAX_CLIENTS:
            self._expire(now)
        while len(self._clients) >= MAX_CLIENTS:
            # Forgotten at once; what it held stays in the held map (bounded by MAX_HELD) until answered,
            # delivered again or due, so that forgetting never walks the map.
            del self._clients[min(self._clients, key=lambda key: self._clients[key].last_ms)]
