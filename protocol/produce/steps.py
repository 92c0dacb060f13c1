"""The work of a producer written once, as steps that the sync and the async producer carry out.

A step is a pipeline to execute (:class:`Execute`) or the seconds to sleep before a retry; the work is
a generator of steps (:data:`Steps`) that gets each pipeline's replies sent in, or its Redis error
thrown in, and returns its result. :class:`~ddmq.protocol.produce.producer.Producer` carries the steps out
with blocking calls, :class:`~ddmq.protocol.produce.producer.AsyncProducer` with awaited ones; what the work
is (the queue count, a batch's script calls and their retries) is :class:`ProducerCore`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Generic, NamedTuple, TypeVar

from ddmq.protocol.produce.calls import OutgoingMessage, Planner, Send, SendResult, Sequences
from ddmq.protocol.produce.delivery import RetryPolicy
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import REDIS_ERRORS, AsyncRedis, SyncRedis
from ddmq.protocol.redis.queues import check_declared, check_queue_count, parse_queues

__all__ = ["Execute", "ProducerCore", "Stepper", "Steps"]

T = TypeVar("T")


class Execute(NamedTuple):
    """A step of a producer's work: execute ``pipe`` (``raise_on_error`` as redis-py's ``execute``
    takes it) and send the replies back in, or throw the Redis error in."""

    pipe: Any
    raise_on_error: bool


#: A producer's work: it yields pipelines to execute and seconds to sleep, and returns its result.
Steps = Generator[Execute | float, Any, T]


class Stepper(Generic[T]):
    """Advances ``steps``: :meth:`next` gives the next step, or None once they returned (:attr:`result`);
    what the driver sets in :attr:`value` or :attr:`error` goes in at the next :meth:`next`."""

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self.value: Any = None
        self.error: BaseException | None = None
        self.result: T

    def next(self) -> Execute | float | None:
        error, self.error = self.error, None
        try:
            return self._steps.throw(error) if error is not None else self._steps.send(self.value)
        except StopIteration as stop:
            self.result = stop.value
            return None


class ProducerCore:
    """What the sync and async producers both do, written once as :data:`Steps`: the topic's queue
    count, and sending a batch with retries. Each producer drives the steps with its own I/O."""

    def __init__(self, planner: Planner, policy: RetryPolicy, redis: SyncRedis | AsyncRedis, script_sha: str) -> None:
        self.planner = planner
        self.policy = policy
        self.redis = redis
        self.script_sha = script_sha
        #: retries made by every send so far (``ddmq produce`` reports it)
        self.retries = 0

    def queue_count(self, topic: str) -> Steps[int]:
        keys.check_name("topic", topic)
        cached = self.planner.queues.get(topic)
        if cached is None:
            cached = yield from self._topic_queues(topic, self.planner.default_queues)
            self.planner.queues[topic] = cached
        return cached

    def ensure_topic(self, topic: str, queues: int) -> Steps[int]:
        keys.check_name("topic", topic)
        check_queue_count(queues)
        stored = check_declared(topic, (yield from self._topic_queues(topic, queues)), queues)
        self.planner.queues[topic] = stored
        return stored

    def find_topic(self, topic: str) -> Steps[tuple[int | None, list[str]]]:
        """The topic's number of queues (None when Redis has no metadata for it) and every topic Redis
        lists, read without writing anything; retried as a send is, so a failover does not end it."""
        keys.check_name("topic", topic)

        def commands(pipe: Any) -> None:
            pipe.hget(keys.topic_meta(topic), "queues")
            pipe.smembers(keys.topics())

        raw, names = yield from self._retried(topic, commands)
        known = sorted(name.decode() for name in names)
        return (None if raw is None else parse_queues(topic, raw)), known

    def _topic_queues(self, topic: str, queues: int) -> Steps[int]:
        def commands(pipe: Any) -> None:
            pipe.hsetnx(keys.topic_meta(topic), "queues", queues)
            pipe.hget(keys.topic_meta(topic), "queues")
            pipe.sadd(keys.topics(), topic)

        _, raw, _ = yield from self._retried(topic, commands)
        return parse_queues(topic, raw)

    def _retried(self, topic: str, commands: Callable[[Any], None]) -> Steps[list[Any]]:
        """One pipeline of ``commands`` (no produce call: no sequence to give up), its replies, retried on
        retriable Redis errors until the delivery timeout."""
        send = Send(topic, [], 0, Sequences(), self.policy)
        while True:
            try:
                pipe = self.redis.pipeline(transaction=False)
                commands(pipe)
                return list((yield Execute(pipe, True)))
            except REDIS_ERRORS as exc:
                send.lost([], exc)
            yield send.before_retry()
            self.retries += 1

    def send_batch(self, topic: str, batch: list[OutgoingMessage], queues: int) -> Steps[list[SendResult]]:
        """``batch`` in one round trip (one script call per queue), retried as a whole; results keep the
        input order. The caller holds the producer's lock (one send at a time)."""
        calls = self.planner.plan(topic, batch, queues)
        send = Send(topic, calls, len(batch), self.planner.sequences, self.policy)
        try:
            while send.pending:
                chosen = send.round()
                backoff = False
                try:
                    pipe = self.redis.pipeline(transaction=False)
                    for index in chosen:
                        # the raw command: redis-py's cluster pipelines refuse evalsha(), yet route this by its keys
                        pipe.execute_command(*send.command(index, self.script_sha))
                    backoff = send.absorb(chosen, (yield Execute(pipe, False)))
                except REDIS_ERRORS as exc:
                    send.lost(chosen, exc)
                    backoff = True
                if backoff and send.pending:
                    yield send.before_retry()
        finally:
            self.retries += send.retries
        return send.results()
