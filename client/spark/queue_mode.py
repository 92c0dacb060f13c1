"""``mode=queue``: Spark reads offset ranges per (topic, qid) through the low-level ``fetch``.

Offsets are the next offset to read per queue, ``{"<topic>": {"<qid>": n}}``. A micro-batch from
``start`` to ``end`` has one partition per queue with new messages, reading ``[start, end)`` of that
queue from any proxy (from the next server of the list when one fails). Queue offsets are dense and
never change, so a partition read twice (or a batch rerun after a restart) yields exactly the same
rows, in offset order: with a checkpoint and an idempotent sink the query is exactly-once, and every
key (which lives in one queue) stays in order.

Progress is stored with ``ack`` (the group's fetch positions, separate from the ordered pull path's
offsets) once Spark committed a batch: in ``latestOffset`` for the batch ending at ``start`` (it is in
Spark's commit log by then) and in ``commit``. A new query without a checkpoint starts from those
positions; a restarted one from its checkpoint. This mode has no per-key gate, retries or dead
letters: those belong to ``mode=pull``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any, Final

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ddmq.client.spark.options import SourceOptions
from ddmq.client.spark.rows import to_record_batch
from ddmq.client.thrift_client import ProxyClient, ProxyClientError
from ddmq.protocol.errors import DdmqError
from ddmq.protocol.wire import AckResult, ConsumeStatsRequest, FetchRequest

__all__ = ["DataLossError", "Positions", "QueueBatchReader", "QueuePartition", "QueueStreamReader", "read_range"]

log = logging.getLogger(__name__)

#: topic -> qid (string) -> offset
Positions = dict[str, dict[str, int]]
_CLUSTER = "spark"
#: A partition goes on trying the servers, round after round, for at least this long.
_RETRY_FOR_S: Final = 10.0


class DataLossError(DdmqError, RuntimeError):
    """Offsets of a range the query reads are gone from Redis (``failOnDataLoss``, the default). Not
    retriable: what was trimmed does not come back."""

    retriable = False


def data_lost(options: SourceOptions, partition: QueuePartition, first: int, last: int) -> None:
    """Offsets ``first..last`` of the partition's queue were trimmed before the query read them."""
    what = (f"ddmq: offsets {first}..{last} of {partition.topic}#{partition.qid} ({last - first + 1} message(s)) "
            "are gone from Redis: trimmed (a retention cap or a producer's maxlen) before this query read them")
    if options.fail_on_data_loss:
        raise DataLossError(f"{what}. Set the option failOnDataLoss=false to skip them and go on")
    log.warning("%s; skipped (failOnDataLoss=false)", what)


class QueuePartition(InputPartition):
    """``[start, end)`` of one queue, read from one proxy."""

    def __init__(self, host: str, port: int, topic: str, qid: str, start: int, end: int) -> None:
        super().__init__((topic, qid, start, end))
        self.host = host
        self.port = port
        self.topic = topic
        self.qid = qid
        self.start = start
        self.end = end


def read_range(options: SourceOptions, partition: QueuePartition) -> Iterator[Any]:
    """The messages of ``[start, end)`` of the partition's queue, as record batches in offset order.

    Any proxy serves any range the same, so when the partition's proxy fails the read goes on from the
    next offset at the next server of the list (and so on, round after round, for ``timeoutSec``): a
    dead proxy costs the partition a reconnect, never a row twice or a row less.
    """
    offset = partition.start
    servers = _fallback_order(options, (partition.host, partition.port))
    clients = [ProxyClient(host, port, timeout_s=options.timeout_s) for host, port in servers]
    deadline = time.monotonic() + max(options.timeout_s, _RETRY_FOR_S)
    current = failures = 0
    try:
        while offset < partition.end:
            client = clients[current]
            request = FetchRequest(
                consumerId=options.consumer_id,
                groupId=options.group,
                cluster=_CLUSTER,
                fetchOffset={partition.topic: {partition.qid: offset}},
                maxBatchSize=min(options.max_batch_size, partition.end - offset),
                maxLingerTime=0,
            )
            try:
                response = client.fetch(request)
            except ProxyClientError as exc:
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                failures += 1
                current = (current + 1) % len(clients)
                log.warning("%s#%s: fetch from %s:%d failed (%s); going on from offset %d at %s:%d",
                            partition.topic, partition.qid, client.host, client.port, exc, offset,
                            clients[current].host, clients[current].port)
                if failures % len(clients) == 0:  # every server failed once more: pause before the next round
                    time.sleep(min(0.1 * 2 ** (failures // len(clients)), 2.0))
                continue
            failures = 0
            result = next(iter(response.results or []), None)
            messages = [m for m in (result.messages or []) if (m.offset or 0) < partition.end] if result else []
            if not messages:
                # Dense offsets: only a trimmed stream has holes. Skip to where the proxy says to go on.
                following = result.nextRequestOffset if result is not None else None
                if following is None or following <= offset:
                    data_lost(options, partition, offset, partition.end - 1)
                    return
                data_lost(options, partition, offset, min(following, partition.end) - 1)
                offset = following
                continue
            if (messages[0].offset or offset) > offset:
                data_lost(options, partition, offset, (messages[0].offset or offset) - 1)
            offset = (messages[-1].offset or offset) + 1
            yield to_record_batch(partition.topic, int(partition.qid), messages)
    finally:
        for client in clients:
            client.close()


def _fallback_order(options: SourceOptions, first: tuple[str, int]) -> list[tuple[str, int]]:
    """``first``, then the other servers of the list after it, wrapping around."""
    servers = list(options.servers)
    if first not in servers:
        return [first, *servers]
    at = servers.index(first)
    return servers[at:] + servers[:at]


class _Queues:
    """The driver's view of the group's queues through the proxies (connections never pickled)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._clients: dict[tuple[str, int], ProxyClient] = {}
        #: Servers whose last call failed: asked last, and left out of the plan while others answer.
        self.down: set[tuple[str, int]] = set()

    def live(self) -> list[tuple[str, int]]:
        """The servers to spread partitions over: those that did not fail last time (all if none did)."""
        return [server for server in self.options.servers if server not in self.down] or list(self.options.servers)

    def _each(self) -> Iterator[tuple[tuple[str, int], ProxyClient]]:
        # Every proxy answers these calls alike: the ones that answered last go first.
        for server in sorted(self.options.servers, key=lambda server: server in self.down):
            client = self._clients.get(server)
            if client is None:
                client = self._clients[server] = ProxyClient(*server, timeout_s=self.options.timeout_s)
            yield server, client

    def _first(self, what: str, call: Any) -> Any:
        errors = []
        for server, client in self._each():
            try:
                answer = call(client)
            except ProxyClientError as exc:
                errors.append(f"{client.host}:{client.port}: {exc}")
                self.down.add(server)
                continue
            self.down.discard(server)
            return answer
        raise ConnectionError(f"no ddmq proxy answered {what}: {'; '.join(errors)}")

    def stored(self) -> Positions:
        """The group's stored fetch positions (1 where none), every queue of its topics."""
        request = FetchRequest(
            consumerId=self.options.consumer_id,
            groupId=self.options.group,
            cluster=_CLUSTER,
            fetchOffset=None,
            maxBatchSize=0,
            maxLingerTime=0,
        )
        response = self._first("fetch", lambda client: client.fetch(request))
        positions: Positions = {}
        for result in response.results or []:
            if self.options.topic is None or result.topic == self.options.topic:
                positions.setdefault(result.topic or "", {})[result.qid or "0"] = result.nextRequestOffset or 1
        return positions

    def produced(self) -> Positions:
        """The next offset to be produced, per queue."""
        request = ConsumeStatsRequest(group=self.options.group, topic=self.options.topic)
        rows = self._first("getConsumeStats", lambda client: client.get_consume_stats(request))
        return {row.topic or "": dict(row.produceOffsets or {}) for row in rows}

    def ack(self, positions: Positions, strict: bool = False) -> None:
        """Store ``positions``; a failure is logged (the next batch stores them again) or, ``strict``, raised."""
        if not any(positions.values()):
            return
        result = AckResult(
            consumerId=self.options.consumer_id, groupId=self.options.group, cluster=_CLUSTER, offsets=positions
        )
        try:
            self._first("ack", lambda client: client.ack(result))
        except ConnectionError as exc:
            if strict:
                raise
            log.warning("storing fetch positions failed (stored again after the next batch): %s", exc)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


def plan_partitions(
    options: SourceOptions, start: Positions, end: Positions, servers: list[tuple[str, int]] | None = None
) -> list[QueuePartition]:
    """One partition per queue with messages between ``start`` and ``end``, spread round-robin over
    ``servers`` (default: all); the server is only where a partition starts reading (see :func:`read_range`)."""
    spread = servers or list(options.servers)
    partitions: list[QueuePartition] = []
    for topic in sorted(end):
        for qid in sorted(end[topic], key=int):
            first, last = start.get(topic, {}).get(qid, 1), end[topic][qid]
            if last > first:
                host, port = spread[len(partitions) % len(spread)]
                partitions.append(QueuePartition(host, port, topic, qid, first, last))
    return partitions


def capped(start: Positions, latest: Positions, max_rows: int | None) -> Positions:
    """``latest``, cut back so that no more than ``max_rows`` messages lie between ``start`` and it."""
    end = {
        topic: {qid: max(off, start.get(topic, {}).get(qid, 1)) for qid, off in qids.items()}
        for topic, qids in latest.items()
    }
    if max_rows is None:
        return end
    pending = [
        (topic, qid, start.get(topic, {}).get(qid, 1), off) for topic, qids in end.items() for qid, off in qids.items()
    ]
    budget = max_rows
    # Fair shares first, then whatever the small queues left over, queue by queue.
    share = math.ceil(max_rows / max(1, sum(1 for *_, a, b in pending if b > a)))
    taken = {}
    for topic, qid, first, last in pending:
        take = min(last - first, share, budget)
        taken[(topic, qid)] = take
        budget -= take
    for topic, qid, first, last in pending:
        extra = min(last - first - taken[(topic, qid)], budget)
        taken[(topic, qid)] += extra
        budget -= extra
    return {
        topic: {qid: start.get(topic, {}).get(qid, 1) + taken[(topic, qid)] for qid in qids}
        for topic, qids in end.items()
    }


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._queues: _Queues | None = None
        self._target: Positions | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_queues"] = None
        return state

    @property
    def queues(self) -> _Queues:
        if self._queues is None:
            self._queues = _Queues(self.options)
        return self._queues

    def initialOffset(self) -> Positions:
        return self.queues.stored()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.queues.produced()

    def latestOffset(self, start: Positions, limit: ReadLimit) -> Positions:
        self.queues.ack(start)  # the batch ending at `start` is in Spark's commit log by now
        latest = self._target if self._target is not None else self.queues.produced()
        latest = {t: q for t, q in latest.items() if self.options.topic is None or t == self.options.topic}
        end = capped(start, latest, limit.max_rows if isinstance(limit, ReadMaxRows) else None)
        return start if end == {t: {q: start.get(t, {}).get(q, 1) for q in qs} for t, qs in end.items()} else end

    def partitions(self, start: Positions, end: Positions) -> list[QueuePartition]:
        return plan_partitions(self.options, start, end, self.queues.live())

    def commit(self, end: Positions) -> None:
        self.queues.ack(end)

    def stop(self) -> None:
        if self._queues is not None:
            self._queues.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueuePartition):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        return read_range(self.options, partition)


class QueueBatchReader(DataSourceReader):
    """``spark.read.format("ddmq")``: from the stored positions up to what is produced now, at most
    ``maxMessages``; store progress by writing the rows back with ``df.write.format("ddmq")``."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[QueuePartition]:
        queues = _Queues(self.options)
        try:
            start = queues.stored()
            latest = {t: q for t, q in queues.produced().items() if t in start}
        finally:
            queues.close()
        return plan_partitions(self.options, start, capped(start, latest, self.options.max_messages), queues.live())

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueuePartition):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        return read_range(self.options, partition)
