"""RetriedPulls: what the pulls that named a request id answered, so a retry gets the same messages.

A pull whose reply is lost (its connection reset after the proxy wrote it) leaves its messages in
flight with nobody working on them, until ``timeout_ms`` redelivers them. A client that names each
logical pull with a request id (``PullRequest.requestId``, ``request_id`` over HTTP) and retries the
same pull with the same id after a lost reply gets those messages again at once, as SQS's
``ReceiveRequestAttemptId`` and RocketMQ's POP ``attemptId`` allow. The rules:

- the proxy remembers, per group and request id, which messages a pull answered (the queue and each
  message's offset and delivery: its attempt, its deadline and its extensions), never their bodies;
- a retry answers those still in flight under that same delivery, in the same order and with the same
  deadlines; a message acked, failed, timed out, released, extended or redelivered since is left out
  (so no message already handed to someone else goes out twice), and when none is left the retry is
  served as a new pull, remembered under the same id;
- a retry's piggy-backed results are not applied again: the first try applied them (its id is
  remembered from before its results are applied), so a fail or a release never reaches a later
  delivery of the same message;
- a retry that arrives while the first try still waits (a long poll whose client gave up) waits for
  its answer and then takes what it answered;
- ids are local to the proxy that served the pull: a retry that reaches another proxy is a new pull
  there (its results applied, which the acks' rule makes harmless: an ack counts once per delivery);
- memory is bounded per group: at most :data:`MAX_IDS` ids and :data:`MAX_OFFSETS` remembered
  offsets, the oldest forgotten first; ids are at most 128 characters (``REQUEST_BOUNDS``). A retry of
  a forgotten id is a new pull.

A pull without an id is served exactly as before and costs nothing here. A pull under a replay lease
(``leaseId``) ignores the id: its lease replays it already.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Final

from ddmq.proxy.core.types import PullBatch, QueueId
from ddmq.proxy.engine.job import JobState
from ddmq.proxy.engine.offsets import OffsetTracker
from ddmq.proxy.engine.pull_buffer import PullBuffer
from ddmq.proxy.engine.queue_slot import DELIVERY_FIELDS, not_held
from ddmq.proxy.groups.group import ConsumerGroup

__all__ = ["MAX_IDS", "MAX_OFFSETS", "Answer", "RetriedPulls"]

#: Request ids remembered per group.
MAX_IDS: Final = 4096
#: Offsets remembered per group, over all its ids (a few tens of bytes each: no bodies are kept).
MAX_OFFSETS: Final = 32_768

_IN_FLIGHT: Final = JobState.IN_FLIGHT


class Answer:
    """One remembered pull: ``settled`` once it was answered (or failed), then the queue it answered
    from, that queue's tracker (which names the read: a queue dropped and read again has a new one), its
    messages' deliveries and its runs."""

    __slots__ = ("_waiter", "count", "owner", "queue", "request_id", "runs", "sent", "settled", "tracker")

    def __init__(self, request_id: str, owner: _GroupAnswers) -> None:
        self.request_id = request_id
        self.owner = owner
        self.settled = False
        # Made only when a retry finds its first try still waiting: every pull of the SDK names an id,
        # and almost none is ever retried, so a future per pull would be paid for nothing.
        self._waiter: asyncio.Future[None] | None = None
        self.queue: QueueId | None = None
        self.tracker: OffsetTracker | None = None
        #: Its messages' deliveries, :data:`DELIVERY_FIELDS` ints each (``QueueSlot.deliveries``), and how
        #: many messages that is.
        self.sent: list[int] = []
        self.count = 0
        self.runs: list[int] | None = None

    def waiter(self) -> asyncio.Future[None]:
        """A future done once this pull is settled (for a retry that arrives while it still waits)."""
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
            if self.settled:
                self._waiter.set_result(None)
        return self._waiter

    def settle(self) -> None:
        if self.settled:
            return
        self.settled = True
        if self._waiter is not None:  # made before this settled, so not done yet
            self._waiter.set_result(None)


class _GroupAnswers:
    """A group's remembered pulls, oldest first, and how many offsets they hold."""

    def __init__(self, group: ConsumerGroup, max_ids: int, max_offsets: int) -> None:
        self.group = group
        self.max_ids = max_ids
        self.max_offsets = max_offsets
        self.answers: OrderedDict[str, Answer] = OrderedDict()
        self.offsets = 0

    def add(self, answer: Answer) -> None:
        old = self.answers.pop(answer.request_id, None)
        if old is not None:
            self.offsets -= old.count
        self.answers[answer.request_id] = answer
        self.trim()

    def holds(self, answer: Answer) -> bool:
        return self.answers.get(answer.request_id) is answer

    def trim(self) -> None:
        while len(self.answers) > self.max_ids or (self.offsets > self.max_offsets and len(self.answers) > 1):
            _, oldest = self.answers.popitem(last=False)
            self.offsets -= oldest.count


class RetriedPulls:
    """Every group's remembered pulls on this proxy (shared by the Thrift and HTTP views of the API), at
    most ``max_ids`` ids and ``max_offsets`` offsets per group."""

    def __init__(self, max_ids: int = MAX_IDS, max_offsets: int = MAX_OFFSETS) -> None:
        self.max_ids = max_ids
        self.max_offsets = max_offsets
        self._groups: dict[str, _GroupAnswers] = {}

    def held(self, group: str) -> tuple[int, int]:
        """How many ids, and offsets over them, are remembered for ``group``."""
        answers = self._groups.get(group)
        return (len(answers.answers), answers.offsets) if answers is not None else (0, 0)

    def known(self, group: str, request_id: str) -> Answer | None:
        """The pull ``request_id`` of ``group`` remembered here, if any."""
        answers = self._groups.get(group)
        return answers.answers.get(request_id) if answers is not None else None

    def begin(self, group: ConsumerGroup, request_id: str) -> Answer:
        """Remember pull ``request_id`` of ``group`` from now on (before its results are applied)."""
        answers = self._groups.get(group.name)
        if answers is None or answers.group is not group:  # a group rebuilt by a reload starts afresh
            answers = self._groups[group.name] = _GroupAnswers(group, self.max_ids, self.max_offsets)
        answer = Answer(request_id, answers)
        answers.add(answer)
        return answer

    @staticmethod
    def answered(answer: Answer, batch: PullBatch) -> None:
        """``answer``'s pull answered ``batch``: remember each message's delivery as it is now."""
        queue = batch.queue
        if answer.settled:
            return
        owner = answer.owner
        if queue is not None and batch.messages and owner.holds(answer):
            slot = owner.group.buffer.slot(queue)
            if slot is None:
                tracker, sent = None, not_held(batch.messages)
            else:
                tracker, sent = slot.deliveries(batch.messages)
            answer.queue, answer.tracker, answer.sent, answer.runs = queue, tracker, sent, batch.runs
            answer.count = len(batch.messages)
            owner.offsets += answer.count
            owner.trim()
        answer.settle()

    @staticmethod
    def replay(answer: Answer, buffer: PullBuffer, topic: str | None) -> PullBatch | None:
        """What ``answer`` answered that is still in flight under the same delivery, as a batch (None
        when nothing is, or the retry names another topic than the answer's)."""
        queue = answer.queue
        if queue is None or (topic is not None and queue.topic != topic):
            return None
        live: list[bool] = []
        messages = []
        sent = answer.sent
        for i in range(0, len(sent), DELIVERY_FIELDS):
            job = buffer.job(queue, sent[i])
            same = (
                job is not None and job.tracker is answer.tracker and job.state is _IN_FLIGHT
                and job.attempts == sent[i + 1] and job.deadline == sent[i + 2] and job.extensions == sent[i + 3]
            )
            live.append(same)
            if same and job is not None:
                messages.append(job.message)
        if not messages:
            return None
        return PullBatch(queue, messages, _runs_left(answer.runs, live))


def _runs_left(runs: list[int] | None, live: list[bool]) -> list[int] | None:
    """The sizes of ``runs`` counting only the messages still ``live``; a run left empty is dropped."""
    if runs is None:
        return None
    left, start = [], 0
    for size in runs:
        count = sum(live[start:start + size])
        if count:
            left.append(count)
        start += size
    return left
