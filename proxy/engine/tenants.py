"""TenantShares: each tenant's share of a group's topic window (``fair_key``; docs/design/engine.md, "Tenants").

A group and topic with ``fair_key`` names a tenant per message (in the ``Order`` action). The window
(``concurrency``: jobs read and not finished) is shared by the tenants that have messages here, in
memory or left in Redis: tenant *t* holds at most ``concurrency * 7/8 * weight(t) / W`` jobs in the key
gate (at least one), where W sums the weights of those tenants and the eighth left is :data:`RESERVE`. A
message of a tenant at its share is *held* as a key past its cap is
(:class:`~ddmq.proxy.engine.held_keys.HeldKeys`: left in Redis, its offset remembered under its order
key, everything read later for that key held behind it), so the reader goes on past the tenant's
backlog to the other tenants' messages: a tenant with 90 % of the traffic holds its share of the
window, not 90 % of it. Pulls then serve the tenants in turns
(:class:`~ddmq.proxy.engine.ready_line.FairReadyLine`), so each gets its share of the deliveries too.

As a tenant drains (a quarter of its share free, so that a refill reads several messages at once; then
one more for each message finished), the keys held for it are *wanted*, in turns, and the chain's
resumer reads them again by offset, its room split between its held keys (:meth:`TenantShares.part`).
A tenant whose last message finished leaves W, so the others' shares grow and their held keys are
wanted too.

A held key counts under the tenant of the message that began its hold: when one key's messages name
several tenants (a rider who changed fleets), its later messages wait behind that one whatever their
tenant, which keeps the key's order. Messages without an order key are held under one record per tenant
(:class:`Unkeyed`).

What the hot path calls is O(1); a tenant leaving looks at the tenants with held keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

__all__ = ["NAME_CHARS", "RESERVE", "TenantShares", "TenantView", "Unkeyed", "shown_name"]

#: The part of the window kept for tenants not seen yet. A tenant alone takes all but this, not the whole
#: window: a reader that had filled the window with one tenant would wait for room, and never read on to
#: find the others behind its backlog. Small, because a tenant's throughput follows its share (what its
#: consumers can have in flight): an eighth costs a tenant alone an eighth of its window, no more.
RESERVE = 0.125


#: Longest tenant name shown (admin API, status, console, metric labels): a tenant is whatever a
#: producer's message says, so one of megabytes must not make every answer about it that large.
NAME_CHARS = 200


def shown_name(tenant: str) -> str:
    """``tenant`` as operators see it: cut past :data:`NAME_CHARS`, with a digest of the whole so that
    two long names cut alike stay two (two series with one label set would break a scrape)."""
    if len(tenant) <= NAME_CHARS:
        return tenant
    digest = hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{tenant[:NAME_CHARS]}...{digest}"


@dataclass(frozen=True, slots=True)
class Unkeyed:
    """The held-key record of a tenant's messages that have no order key: never equal to an order key."""

    tenant: str


@dataclass(frozen=True, slots=True)
class TenantView:
    """One tenant as operators see it."""

    tenant: str
    in_memory: int
    held_keys: int
    weight: float
    #: Most jobs it may hold in memory now (its share of the window).
    share: int


class TenantShares:
    """The tenants of one group's topic and their shares of ``window()`` jobs (see the module's docstring).
    ``want(key)`` asks for a held key's messages to be read again."""

    def __init__(
        self, window: Callable[[], int], weights: Mapping[str, float], want: Callable[[Hashable], None]
    ) -> None:
        self._window = window
        self._want = want
        self.weights: dict[str, float] = dict(weights)
        #: Jobs in the key gate per tenant (entries only while above 0).
        self.linked: dict[str, int] = {}
        #: Per tenant, its held keys in the order their holds began (a dict as an ordered set).
        self.held: dict[str, dict[Hashable, None]] = {}
        #: Sum of the weights of the tenants with linked jobs or held keys.
        self.active_weight = 0.0

    # shares ----------------------------------------------------------------------------------------

    def weight(self, tenant: str) -> float:
        return self.weights.get(tenant, 1.0)

    def _active(self, tenant: str) -> bool:
        return tenant in self.linked or tenant in self.held

    def share(self, tenant: str) -> int:
        """Most jobs ``tenant`` may hold in the key gate now."""
        weight = self.weight(tenant)
        total = self.active_weight if self._active(tenant) else self.active_weight + weight
        return max(1, int(self._window() * (1 - RESERVE) * weight / total))

    def full(self, tenant: str) -> bool:
        """Whether ``tenant`` holds its share already (its next message is held)."""
        return self.linked.get(tenant, 0) >= self.share(tenant)

    def room(self, tenant: str) -> int:
        """How many more jobs ``tenant`` may hold now."""
        return self.share(tenant) - self.linked.get(tenant, 0)

    def part(self, tenant: str) -> int:
        """Most messages one of ``tenant``'s held keys may hold in memory while it is read again: the
        tenant's share split between its held keys (one at least), so that the share goes to many keys
        (each runs one message at a time) and not to the oldest few."""
        return max(1, self.share(tenant) // max(1, len(self.held.get(tenant, ()))))

    # the key gate's ---------------------------------------------------------------------------------

    def linked_one(self, tenant: str) -> None:
        """A job of ``tenant`` entered the key gate."""
        count = self.linked.get(tenant, 0)
        if not count and tenant not in self.held:
            self.active_weight += self.weight(tenant)
        self.linked[tenant] = count + 1

    def released(self, tenant: str) -> None:
        """A job of ``tenant`` in the key gate finished."""
        count = self.linked.get(tenant, 0) - 1
        if count < 0:
            return  # never linked here (so never counted): nothing to give back
        if count:
            self.linked[tenant] = count
        else:
            del self.linked[tenant]
            if tenant not in self.held:
                self._left(tenant)
                return
        keys = self.held.get(tenant)
        if keys:
            share = self.share(tenant)
            low = share - max(1, share // 4)
            if count == low:  # a quarter of its share free: a refill of all of it
                self._want_keys(keys, share - count)
            elif count < low:  # and one key more for each message done since
                self._want_keys(keys, 1)

    # the held keys' --------------------------------------------------------------------------------

    def held_key(self, tenant: str, key: Hashable) -> None:
        """``key``'s hold began with a message of ``tenant``."""
        keys = self.held.get(tenant)
        if keys is None:
            if tenant not in self.linked:
                self.active_weight += self.weight(tenant)
            keys = self.held[tenant] = {}
        keys[key] = None

    def unheld_key(self, tenant: str, key: Hashable) -> None:
        """``key`` has no held messages left (read again, or its queue moved away)."""
        keys = self.held.get(tenant)
        if keys is None:
            return
        keys.pop(key, None)
        if not keys:
            del self.held[tenant]
            if tenant not in self.linked:
                self._left(tenant)

    def _left(self, tenant: str) -> None:
        """``tenant`` has nothing here any more: the others' shares grow, so their held keys may be read."""
        # Summed and taken back as floats: once no tenant is left, no rounding is left over either.
        self.active_weight = self.active_weight - self.weight(tenant) if self.linked or self.held else 0.0
        for other, keys in self.held.items():
            room = self.room(other)
            if room > 0:
                self._want_keys(keys, room)

    def _want_keys(self, keys: dict[Hashable, None], n: int) -> None:
        """Want ``n`` of ``keys`` (a tenant's held keys), each moved to the end: the keys take turns."""
        for _ in range(min(n, len(keys))):
            key = next(iter(keys))
            del keys[key]
            keys[key] = None
            self._want(key)

    # views -----------------------------------------------------------------------------------------

    def views(self, top: int = 20) -> list[TenantView]:
        """The ``top`` tenants with the most here (in memory plus held keys), most first."""
        tenants = set(self.linked) | set(self.held)
        ranked = sorted(tenants, key=lambda t: (-(self.linked.get(t, 0) + len(self.held.get(t, ()))), str(t)))
        return [
            TenantView(shown_name(t), self.linked.get(t, 0), len(self.held.get(t, ())), self.weight(t),
                       self.share(t))
            for t in ranked[:top]
        ]

    def __len__(self) -> int:
        return len(set(self.linked) | set(self.held))
