"""What makes a queue appendable: the produce script, and a topic's metadata.

Every producer (``ddmq.protocol.produce.producer``) writes through the produce script (``PRODUCE_LUA`` in
:mod:`ddmq.protocol.redis.scripts`), and the proxy calls
:func:`ensure_topic` at start-up and :func:`repair_queue` after foreign entries; both sides share this
module so they agree on the stream, sequence and metadata keys (:mod:`ddmq.protocol.redis.keys`).

Redis failures surface as :class:`ProduceError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ddmq.protocol.errors import DdmqError
from ddmq.protocol.redis import keys
from ddmq.protocol.redis.connection import REDIS_ERRORS, AsyncRedis, eval_script
from ddmq.protocol.redis.scripts import PRODUCE_LUA

__all__ = [
    "ProduceError",
    "TopicMismatchError",
    "check_declared",
    "check_queue_count",
    "ensure_topic",
    "parse_queues",
    "redis_errors",
    "repair_queue",
    "topic_queues",
]


class ProduceError(DdmqError):
    """Redis failed or holds data the producer cannot use. The message names the topic.

    Retriable when Redis failed (as the proxy's :class:`~ddmq.proxy.core.errors.BrokerError`), not when
    what it holds is wrong (``retriable=False``): the same call would find the same data.
    """

    retriable = True

    def __init__(self, message: str, retriable: bool | None = None) -> None:
        super().__init__(message)
        if retriable is not None:
            self.retriable = retriable


class TopicMismatchError(ProduceError):
    """A topic exists with a different number of queues than declared. Not retriable.

    Changing the number of queues would move keys to other queues and break per-key order, so it is
    never done implicitly.
    """

    retriable = False


def parse_queues(topic: str, raw: object) -> int:
    try:
        queues = int(raw.decode() if isinstance(raw, bytes) else str(raw))
    except ValueError:
        queues = 0
    if queues < 1:
        meta = keys.topic_meta(topic)
        raise ProduceError(f"topic {topic!r}: {meta!r} holds a bad queues value {raw!r}", retriable=False)
    return queues


def check_declared(topic: str, stored: int, declared: int) -> int:
    if stored != declared:
        raise TopicMismatchError(
            f"topic {topic!r} has {stored} queues in Redis but {declared} are declared; changing the "
            "number of queues would move keys between queues and break per-key order. Declare "
            f"queues: {stored}, or use a new topic."
        )
    return stored


def check_queue_count(queues: int) -> None:
    if isinstance(queues, bool) or not isinstance(queues, int) or queues < 1:
        raise ValueError(f"a topic has at least one queue, not {queues!r}")


@contextmanager
def redis_errors(topic: str) -> Iterator[None]:
    """Map redis-py errors into :class:`ProduceError` at the edge."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise ProduceError(f"producing to topic {topic!r} failed: {exc}") from exc


async def topic_queues(client: AsyncRedis, topic: str, queues: int) -> int:
    with redis_errors(topic):
        pipe = client.pipeline(transaction=False)
        pipe.hsetnx(keys.topic_meta(topic), "queues", queues)
        pipe.hget(keys.topic_meta(topic), "queues")
        pipe.sadd(keys.topics(), topic)
        _, raw, _ = await pipe.execute()
    return parse_queues(topic, raw)


async def ensure_topic(client: AsyncRedis, topic: str, queues: int) -> int:
    """Create ``topic`` with ``queues`` queues if it is missing; otherwise check the stored number.

    Returns the number of queues. Raises :class:`TopicMismatchError` when the topic exists with a
    different number, :class:`ProduceError` when Redis fails. The proxy calls this at start-up for
    every topic its config declares.
    """
    keys.check_name("topic", topic)
    check_queue_count(queues)
    return check_declared(topic, await topic_queues(client, topic, queues), queues)


async def repair_queue(client: AsyncRedis, topic: str, qid: int) -> int:
    """Make a queue appendable again after another writer added entries the producer would not have
    (see the produce script): renumber time-based ids after the last offset, raise the sequence to the
    highest ``0-<n>`` id. Returns the next offset to be produced; ProduceError when Redis fails."""
    stream, sequence = keys.stream(topic, qid), keys.sequence(topic, qid)
    with redis_errors(topic):
        return int(await eval_script(client, PRODUCE_LUA, [stream, sequence], [0, b""]))
