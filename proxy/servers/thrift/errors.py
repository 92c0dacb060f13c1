"""ChannelClosedError, in a module of its own: the channel and the frame loop are compiled
(``protocol/native.py``), and a compiled class cannot subclass ``ConnectionError``."""

from __future__ import annotations

__all__ = ["ChannelClosedError"]


class ChannelClosedError(ConnectionError):
    """The peer closed its side (or the connection was lost) before the bytes awaited arrived;
    ``partial`` bytes were buffered."""

    def __init__(self, partial: int) -> None:
        super().__init__(f"connection closed with {partial} byte(s) of a frame buffered")
        self.partial = partial
