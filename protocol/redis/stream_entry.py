"""A message as a Redis stream entry: the producer writes it, the proxy reads it and dead-letters it.

An entry's fields (all values bytes):

======  =====================================================================
field   value
======  =====================================================================
``v``   the body, exactly as given (``str`` is encoded as UTF-8)
``k``   the key, UTF-8; ``""`` when there is none
``t``   the tag; ``""`` when there is none
``p``   properties as a compact JSON object of string to string; omitted when empty
``ts``  produce time, milliseconds since the epoch, decimal
======  =====================================================================

The entry id is ``0-<offset>`` (:func:`ddmq.protocol.redis.keys.offset_of`). A dead letter is the same entry
plus fields of its own (``qid``, ``offset``, ``attempts``, ``error``, ``dead_ms``).

One property name is the project's own: :data:`REPLAY_GROUP`. A dead-letter replay produces its messages
back into the topic with it, naming the group whose dead letters they were; every other group of the
topic takes such a message as finished without delivering it (the proxy's chain does, and its low-level
``fetch`` leaves it out).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

__all__ = [
    "KEY",
    "PRODUCE_TIME",
    "PROPERTIES",
    "REPLAY_GROUP",
    "TAG",
    "VALUE",
    "PropertiesMemo",
    "StoredMessage",
    "decode_properties",
    "encode_entry",
    "encode_properties",
]

VALUE: Final = b"v"
KEY: Final = b"k"
TAG: Final = b"t"
PROPERTIES: Final = b"p"
PRODUCE_TIME: Final = b"ts"
#: The property a replayed dead letter carries: the group it is for. Other groups never deliver it, so a
#: group that already finished the message does not get it again after its key's later messages.
REPLAY_GROUP: Final = "ddmq.replay.group"


class StoredMessage(NamedTuple):
    """A message as read from a queue's stream; pull replies carry it as the wire's ``Message``
    (:mod:`ddmq.proxy.core.pull_codec`)."""

    offset: int
    value: bytes
    key: str
    tag: str
    properties: dict[str, str]
    produce_ms: int


_NO_PROPERTIES: Final[dict[str, str]] = {}


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """The ``p`` field: a compact JSON object (TypeError unless it maps str to str)."""
    for name, text in properties.items():
        if not isinstance(name, str) or not isinstance(text, str):
            raise TypeError("properties must map str to str")
    return json.dumps(dict(properties), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _orjson_loads() -> Callable[[bytes], Any] | None:
    try:
        import orjson
    except ImportError:  # no wheel for this platform: json alone
        return None
    return orjson.loads


#: orjson's ``loads`` where its wheel installs: a traced producer's every message has properties (its
#: trace context), and orjson reads them in a tenth of json's time.
_FAST_LOADS: Final = _orjson_loads()


def decode_properties(raw: bytes | None) -> dict[str, str]:
    """The ``p`` field back as a dict (a shared empty one when absent); ValueError unless an object."""
    if not raw:
        return _NO_PROPERTIES
    properties: Any = None
    if _FAST_LOADS is not None:
        try:
            properties = _FAST_LOADS(raw)
        except ValueError:  # what orjson refuses and json may accept (NaN, lone surrogates): json decides
            properties = None
        # orjson reads an integer past 64 bits as a float where json keeps it exact: only an object of
        # strings (what the producer writes) is taken as orjson read it (a loop: a generator costs more
        # than the parse of a trace context)
        if isinstance(properties, dict):
            for text in properties.values():
                if type(text) is not str:
                    properties = None
                    break
    if properties is None:
        properties = json.loads(raw)
    if not isinstance(properties, dict):
        raise ValueError("its properties are not a JSON object")
    return properties


#: Properties encoded during one batch's encoding, by the mapping's id (the mapping kept, so its id stays
#: its own): :func:`encode_entry`'s ``memo``.
PropertiesMemo = dict[int, tuple[Mapping[str, str], bytes]]


def encode_entry(
    value: bytes | str, key: str | None, tag: str | None, properties: Mapping[str, str] | None, produce_ms: int,
    memo: PropertiesMemo | None = None,
) -> list[bytes]:
    """The entry's field/value items, flat, in the order ``XADD`` takes them: ``v k t [p] ts``. The
    proxy's reader recognises that order without properties, the common case, without building a dict.
    With ``memo`` (one per batch), the same properties mapping is encoded once: a traced send gives
    every message of a batch one trace context, the same dict.

    TypeError when a value has the wrong type: nothing is written for a message that cannot be read back.
    """
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif not isinstance(value, bytes):
        raise TypeError(f"value must be bytes or str, not {type(value).__name__}")
    for name, text in (("key", key), ("tag", tag)):
        if text is not None and not isinstance(text, str):
            raise TypeError(f"{name} must be a str or None, not {type(text).__name__}")
    items = [VALUE, value, KEY, (key or "").encode("utf-8"), TAG, (tag or "").encode("utf-8")]
    if properties:
        if memo is None:
            encoded = encode_properties(properties)
        else:
            known = memo.get(id(properties))
            if known is None:
                known = memo[id(properties)] = (properties, encode_properties(properties))
            encoded = known[1]
        items += [PROPERTIES, encoded]
    items += [PRODUCE_TIME, str(produce_ms).encode("ascii")]
    return items
