"""What an admin route names: the group and topic, found among this proxy's groups or refused with the
error that says what it serves (404 through the errors middleware), and the query's integers. Every
admin module looks them up here, so the message and the rule are one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from ddmq.proxy.core.errors import BadRequestError, UnknownGroupError, UnknownTopicError
from ddmq.proxy.groups.group import ConsumerGroup

if TYPE_CHECKING:
    from ddmq.proxy.servers.http.view import ProxyView

__all__ = ["find_group", "find_topic", "query_int"]


def find_group(service: ProxyView, request: web.Request) -> ConsumerGroup:
    """The group of the route's ``{group}``."""
    name = request.match_info["group"]
    group = service.groups.get(name)
    if group is None:
        raise UnknownGroupError(f"unknown group {name!r}; this proxy serves {sorted(service.groups)}")
    return group


def find_topic(group: ConsumerGroup, topic: str | None) -> str | None:
    """``topic`` when ``group`` consumes it (None stays None: every topic)."""
    if topic is not None and topic not in group.consumers:
        raise UnknownTopicError(f"group {group.name!r} does not consume topic {topic!r}")
    return topic


def query_int(request: web.Request, name: str, low: int, high: int) -> int | None:
    """Query parameter ``name`` as an integer in ``low..high`` (None when absent). A whole number
    written with a fraction (``20.0``) is taken, as in the JSON bodies: the document's ``integer``
    admits it."""
    raw = request.query.get(name)
    if raw is None:
        return None
    whole, dot, fraction = raw.partition(".")
    if whole.isascii() and whole.isdigit() and (not dot or (fraction and set(fraction) == {"0"})):
        value = int(whole)
        if low <= value <= high:
            return value
    raise BadRequestError(f"{name} must be an integer {low}..{high}, got {raw[:100]!r}")
