"""UpstreamJobBlockingQueue: per-order-key chains where only the head may run.

Jobs arrive in queue order. A job whose key has no unfinished job becomes its key's head and goes to
the *main* queue (or, through :meth:`~UpstreamJobBlockingQueue.admit`, runs at once when nothing
waits to run); otherwise it is linked behind the key's tail and waits. When a head finishes, its
successor moves to the *reactivation* queue, which is served before the main queue so a key that
was waiting does not wait again behind newer keys. Jobs without an order key are always runnable.
A successor handed to a client in its head's ordered run (``PullBuffer``, ``maxPerKey``) is in flight
already when the head finishes: it becomes the head without being run again.

Keys are compared exactly (dict lookup on the key itself), so two keys never serialise each other by
a hash collision. Every operation is O(1).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable
from typing import Final

from ddmq.proxy.engine.held_keys import HeldKeys
from ddmq.proxy.engine.job import JobState, UpstreamJob
from ddmq.proxy.engine.tenants import TenantShares, Unkeyed

# Enum members read through their class cost ~5x a plain global on Python 3.11; the hot path uses these.
# Final: the compiled build keeps them in C statics, where a plain global is a dict lookup per use.
_WAITING: Final = JobState.WAITING
_RUNNABLE: Final = JobState.RUNNABLE


class _Signal:
    """``asyncio.Event``'s set, clear and wait, compiled with the key gate: Event's are Python methods,
    and with one message per key in flight the gate is set, waited on and cleared once per ack."""

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] = []

    def set(self) -> None:
        self._set = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        if self._set:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            self._waiters.remove(waiter)


class UpstreamJobBlockingQueue:
    """The key gate of one group's topic (see the module's docstring). With ``held`` (the topic's
    :class:`~ddmq.proxy.engine.held_keys.HeldKeys`), a key holds at most ``key_cap`` jobs: a job past
    it, or of a key with held messages, is held (left in Redis) instead of linked; with ``tenants``
    (:class:`~ddmq.proxy.engine.tenants.TenantShares`) so is a job of a tenant at its share."""

    def __init__(self, held: HeldKeys | None = None, key_cap: int = 0, tenants: TenantShares | None = None) -> None:
        self._heads: dict[Hashable, UpstreamJob] = {}
        self._tails: dict[Hashable, UpstreamJob] = {}
        #: Unfinished jobs linked per key (heads and successors).
        self._lengths: dict[Hashable, int] = {}
        self.held = held
        #: Most jobs linked per key while ``held`` is set (a reload changes it in place).
        self.key_cap = key_cap
        #: The key whose held messages the chain's resumer runs now: linked whatever its length.
        self.resuming: Hashable | None = None
        #: The topic's tenants (``fair_key``; needs ``held``): a job of a tenant at its share is held.
        self.tenants = tenants
        self._main: deque[UpstreamJob] = deque()
        self._reactivated: deque[UpstreamJob] = deque()
        self._nonempty = _Signal()
        #: Mirrors ``_nonempty``: put() runs once per message read, and a flag is cheaper than a call.
        self._signalled = False

    def put(self, job: UpstreamJob) -> bool:
        """Add a job in queue order; returns True when it is runnable now (head of its key)."""
        if not self._link(job):
            return False
        self._main.append(job)
        if not self._signalled:
            self._signalled = True
            self._nonempty.set()
        return True

    def admit(self, job: UpstreamJob) -> bool:
        """:meth:`put`, except that a job runnable now while no other job waits to run is not queued:
        True tells the caller to run it on the spot. The order of a key is the same either way (the
        job is its key's head), and nothing waiting to run is overtaken: a reactivated successor or an
        earlier head queued first puts this one in the queue behind it. A read's batch then goes down
        the chain in the reader's step, not one loop iteration later in the dispatcher's."""
        if self._main or self._reactivated:
            self.put(job)
            return False
        return self._link(job)

    def _link(self, job: UpstreamJob) -> bool:
        """Link ``job`` at its key's tail: True (RUNNABLE) when it is the key's head, else WAITING; or
        hold it (False, and the job is gone from the engine) when its key is at its cap or has held
        messages (those go first, so nothing read later may overtake them), or its tenant holds its
        share of the window."""
        key = job.order_key
        tenants = self.tenants
        tenant = ""
        if tenants is not None:
            if job.tenant is None:  # named by Order; "" is the tenant of what names none
                job.tenant = ""
            else:
                tenant = job.tenant
        if key is not None:
            held = self.held
            length = self._lengths.get(key, 0)
            if held is not None and (
                length >= self.key_cap or (held.keys and key in held.keys)
                or (tenants is not None and tenants.full(tenant))
            ) and key != self.resuming:
                held.hold(job)
                return False
            if tenants is not None:
                tenants.linked_one(tenant)
            self._lengths[key] = length + 1
            tail = self._tails.get(key)
            self._tails[key] = job
            if tail is not None:
                tail.next = job
                job.state = _WAITING
                return False
            self._heads[key] = job
        elif tenants is not None and self.held is not None:
            if tenants.full(tenant) and self.resuming != (unkeyed := Unkeyed(tenant)):
                self.held.hold(job, unkeyed)
                return False
            tenants.linked_one(tenant)
        job.state = _RUNNABLE
        return True

    def release(self, job: UpstreamJob) -> UpstreamJob | None:
        """The head ``job`` finished: make its successor runnable. Returns the successor."""
        key = job.order_key
        tenants = self.tenants
        if tenants is not None and job.tenant is not None:
            tenants.released(job.tenant)
        if key is None:
            return None
        successor = job.next
        held = self.held
        if successor is None:
            if self._tails.get(key) is job:
                del self._tails[key]
                del self._heads[key]
                del self._lengths[key]
                if held is not None and held.keys:
                    held.want(key)
            return None
        job.next = None
        self._heads[key] = successor
        length = self._lengths[key] - 1
        self._lengths[key] = length
        if held is not None and held.keys and length <= self.key_cap // 2:
            held.want(key)
        if successor.state is _WAITING:
            successor.state = _RUNNABLE
            self._reactivated.append(successor)
            if not self._signalled:
                self._signalled = True
                self._nonempty.set()
        # Otherwise the successor went out in the same ordered run as ``job`` and is in flight already
        # (see ``PullBuffer``): it is the key's head now, with nothing to run.
        return successor

    def pop(self) -> UpstreamJob | None:
        """The next runnable job, reactivated ones first; None when there is none."""
        if self._reactivated:
            return self._reactivated.popleft()
        if self._main:
            return self._main.popleft()
        self._signalled = False
        self._nonempty.clear()
        return None

    def is_head(self, job: UpstreamJob) -> bool:
        """Whether ``job`` is the head of its key (every job without a key is)."""
        key = job.order_key
        return key is None or self._heads.get(key) is job

    async def wait(self) -> None:
        """Wait until a job may be runnable."""
        await self._nonempty.wait()

    @property
    def runnable(self) -> int:
        return len(self._main) + len(self._reactivated)

    @property
    def active_keys(self) -> int:
        """Keys with at least one unfinished job."""
        return len(self._heads)

    def heads(self) -> list[tuple[Hashable, UpstreamJob]]:
        """Every key with an unfinished job, and its head (a copy: for admin views and metrics)."""
        return list(self._heads.items())

    def chain_length(self, key: Hashable) -> int:
        """Unfinished jobs of ``key`` linked here (its held messages not counted)."""
        return self._lengths.get(key, 0)
