"""Keeping deliveries alive: what a puller holds, and when to tell the proxy "still working on it".

The proxy redelivers a message that is not answered within the group's ``timeout_ms`` of its delivery,
counting an attempt. A puller holds every message of its last pull until its next pull carries the
results, so a slow handler delays the answers of the whole batch, not only its own. Each puller keeps a
:class:`Held` record of that batch; the consumer's keeper (a thread, or a task) looks at them every
eighth of ``timeout_ms`` and, for a batch held past half of it since its delivery or its last
extension, sends the batch's offsets as ``extendOffsets`` in a ``submit`` on the puller's own
connection: the proxy restarts their deadline (up to its configured number of extensions per delivery).

The consumer cannot ask the proxy for ``timeout_ms`` over the pull protocol, so it is told:
``group_timeout_ms`` of :class:`~ddmq.client.consumer.PullConsumer` (default: the proxy's default,
:data:`DEFAULT_GROUP_TIMEOUT_MS`). Told a smaller value than the group's, it only extends more often;
told a larger one, extensions may come after the deadline (the message is then redelivered anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from ddmq.client.pull_parts import ConsumedMessage, PendingResults
from ddmq.protocol.wire import ConsumeResult

__all__ = ["DEFAULT_GROUP_TIMEOUT_MS", "Held", "extend_every_s"]

#: The proxy's default ``timeout_ms`` of a group (``config/schema/groups.py``; a test holds the two equal).
DEFAULT_GROUP_TIMEOUT_MS: Final = 30_000


def extend_every_s(group_timeout_ms: int | None) -> float | None:
    """Seconds between extensions of a held batch: half the group's timeout (None: never extend)."""
    if group_timeout_ms is None:
        return None
    if group_timeout_ms <= 0:
        raise ValueError(f"group_timeout_ms must be positive (or None to never extend), got {group_timeout_ms}")
    return group_timeout_ms / 2000


class Held:
    """The messages a puller's last pull delivered whose results it has not reported yet. The caller
    serialises access (a lock per puller): the keeper must never extend a batch whose results are
    already on their way, or it would extend offsets the proxy no longer holds."""

    def __init__(self, group: str) -> None:
        self._group = group
        self._messages: list[ConsumedMessage] = []
        self._since = 0.0

    def hold(self, messages: Sequence[ConsumedMessage], now: float) -> None:
        self._messages = list(messages)
        self._since = now

    def let_go(self) -> None:
        self._messages = []

    def __len__(self) -> int:
        return len(self._messages)

    def extension(self, now: float, every_s: float) -> ConsumeResult | None:
        """The ``extendOffsets`` to send now, if the batch has been held ``every_s`` since its delivery
        or its last extension (which this call then counts as made)."""
        if not self._messages or now - self._since < every_s:
            return None
        self._since = now
        pending = PendingResults(self._group)
        for message in self._messages:
            pending.extend(message)
        return pending.to_wire()
