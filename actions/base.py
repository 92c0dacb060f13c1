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

A job is a :class:`~ddmq.actions.job.Job`; what an action may ask of its consumer is
:class:`ChainContext`, declared here as Protocols of what the actions use, which the proxy's consumer
satisfies: this folder imports nothing of the proxy.

>>> @register("Noop")
... class Noop:
...     def __init__(self, ctx: ChainContext) -> None: ...
...     def act(self, job: Job) -> Status:
...         return Status.CONTINUE
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from ddmq.actions.job import Job
from ddmq.config.errors import ConfigError

if TYPE_CHECKING:
    from ddmq.config.schema import TopicGroupConfig


class Status(Enum):
    CONTINUE = "continue"
    FINISH = "finish"
    FAIL = "fail"
    ASYNC = "async"


# The consumer's structures below take the engine's own job (a subclass of Job, the one the chain was
# handed), and an action passes them only the job it was given: their job parameters are Any, as a Job
# parameter would refuse the engine's narrower signatures.


class KeyGate(Protocol):
    """The consumer's per-key gate, which ``Order`` puts every job through."""

    def admit(self, job: Any) -> bool:
        """Let ``job`` (its order key set) in behind its key's unfinished jobs: True when the chain goes
        on with it now, False when the gate holds it and the consumer continues it later."""
        ...


class PullSink(Protocol):
    """The consumer's pull buffer, where ``PullServer`` leaves a job for the pull clients."""

    def add(self, job: Any) -> None: ...

    def push_hold(self, topic: str) -> asyncio.Event | None:
        """None while ``topic``'s messages may be pushed; else an event set when an operator's pause
        is lifted (ask again then: another pause may hold it still)."""
        ...


class Retries(Protocol):
    """The consumer's retry schedule and dead-letter writer, which push actions hand failures to."""

    def route_retries(self, topic: str, requeue: Callable[[Any], None]) -> None:
        """Jobs of ``topic`` are pushed, not pulled: when a retry is due, hand the job to ``requeue``."""
        ...

    def retry_later(self, job: Any, reason: str) -> None:
        """An attempt of ``job`` failed: retry it on schedule, or dead-letter it after the last retry."""
        ...

    def dead_letter(self, job: Any, reason: str) -> None:
        """Write ``job`` to the dead-letter stream, then finish it."""
        ...


class ChainContext(Protocol):
    """What an action may use: its config and the consumer's shared structures."""

    @property
    def group(self) -> str: ...

    @property
    def topic(self) -> str: ...

    @property
    def config(self) -> TopicGroupConfig: ...

    @property
    def blocking_queue(self) -> KeyGate: ...

    @property
    def buffer(self) -> PullSink: ...

    @property
    def redelivery(self) -> Retries: ...

    def count(self, what: str, n: int = 1) -> None:
        """Add to one of the consumer's named counters (exported as metrics)."""


class Action(Protocol):
    def act(self, job: Job) -> Status: ...


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
