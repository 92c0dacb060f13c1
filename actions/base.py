"""The plug-in contract for actions, in one place.

An action is built once per (group, topic) from its :class:`ChainContext` and then called for every
job with ``action.act(job)``, a plain (not ``async``) call. It answers a :class:`Status`:

- ``CONTINUE``: go on with the next action;
- ``FINISH``: the job is done (e.g. filtered out); its offset may be committed, its key released;
- ``FAIL``: the job cannot be processed; it is dead-lettered with ``job.last_error``, then finished;
- ``ASYNC``: the action took the job over and will resume or finish it later (Order parks it in the
  key gate, PullServer hands it to the pull buffer).

``act`` never waits: the chain runs inside the queue reader and the dispatcher, one job after the
other, and a coroutine per action per message cost more CPU than the actions themselves. I/O-bound
actions (the push sinks) return ``ASYNC`` and finish the job from their own bounded tasks.
An action that owns tasks or connections also has ``start()`` (called once the loop runs) and
``async close()``; the consumer calls them through :func:`start_chain` / :func:`close_chain`.

>>> @register("Noop")
... class Noop:
...     def __init__(self, ctx: ChainContext) -> None: ...
...     def act(self, job: UpstreamJob) -> Status:
...         return Status.CONTINUE
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

from ddmq.config.errors import ConfigError

if TYPE_CHECKING:
    from ddmq.config.schema import TopicGroupConfig
    from ddmq.proxy.engine.job import UpstreamJob
    from ddmq.proxy.engine.ordering import UpstreamJobBlockingQueue
    from ddmq.proxy.engine.pull_buffer import PullBuffer
    from ddmq.proxy.engine.redelivery import Redelivery


class Status(Enum):
    CONTINUE = "continue"
    FINISH = "finish"
    FAIL = "fail"
    ASYNC = "async"


class ChainContext(Protocol):
    """What an action may use: its config and the consumer's shared structures."""

    group: str
    topic: str
    config: TopicGroupConfig
    blocking_queue: UpstreamJobBlockingQueue
    buffer: PullBuffer
    redelivery: Redelivery

    def count(self, what: str, n: int = 1) -> None:
        """Add to one of the consumer's named counters (exported as metrics)."""


class Action(Protocol):
    def act(self, job: UpstreamJob) -> Status: ...


@runtime_checkable
class ServiceAction(Protocol):
    """An action with a lifecycle (push actions: worker tasks, connection pools)."""

    def start(self) -> None: ...

    async def close(self) -> None: ...


ActionFactory = Callable[[ChainContext], Action]
_T = TypeVar("_T", bound=ActionFactory)
_REGISTRY: dict[str, ActionFactory] = {}


def register(name: str) -> Callable[[_T], _T]:
    """Class decorator: make an action available to configs under ``name``."""

    def decorate(factory: _T) -> _T:
        if name in _REGISTRY:
            raise ValueError(f"action {name!r} is registered twice")
        _REGISTRY[name] = factory
        return factory

    return decorate


def registered_names() -> frozenset[str]:
    return frozenset(_REGISTRY)


def build_chain(names: list[str], ctx: ChainContext) -> list[Action]:
    unknown = [n for n in names if n not in _REGISTRY]
    if unknown:
        raise ConfigError(f"unknown action(s) {unknown}; known: {sorted(_REGISTRY)}")
    return [_REGISTRY[name](ctx) for name in names]


def start_chain(chain: list[Action]) -> None:
    """Start the actions of ``chain`` that have a lifecycle."""
    for action in chain:
        if isinstance(action, ServiceAction):
            action.start()


async def close_chain(chain: list[Action]) -> None:
    """Close the actions of ``chain`` that have a lifecycle (their unfinished jobs stay uncommitted)."""
    for action in chain:
        if isinstance(action, ServiceAction):
            await action.close()
