"""``mode=pull``: a Spark stream over the proxy's ordered pull path, with replayable leased pulls.

Offsets are micro-batch numbers, ``{"seq": n, "flush": bool, "parts": P, "rows": R, "servers": [i, ...]}``.
Batch ``n`` has ``P`` partitions; partition ``p`` pulls up to ``R`` messages under the lease
``<consumerId>/<n>/<p>`` from the ``p mod len(servers)``-th of the proxies that answered when the batch
was planned (see :mod:`ddmq.proxy.engine.replays`), so every read of it (each action of a ``foreachBatch``, a
task retry, a rerun after a restart) sees the same rows. Nothing is acked until Spark has committed
the batch:

- ``latestOffset(start)`` runs after the batch ending at ``start`` is in Spark's commit log, so it
  first acks the leases of every batch up to ``start``; ``commit(end)`` does the same (idempotent).
- It then asks the proxies for the group's backlog (produce - consume offsets per queue; unacked
  leased messages count). Backlog → a new data batch. None, but ``start`` was a data batch → one empty
  *flush* batch, so that Spark commits ``start`` before the stream goes idle or stops. Neither →
  ``start`` (no batch).
- ``trigger(availableNow=True)`` records the produce offsets when the query starts and plans data
  batches until the consume offsets reach them (or have not moved for ``availableNowIdleBatches``).

Pulls ask for ordered runs (``maxPerKey``, default 1000): a partition's rows of one key are successive
messages in the key's order, and the lease's later pulls continue the runs its earlier pulls started,
so a key's backlog advances as far as the partition's pulls carry per micro-batch, not one message. The
pulls of a lease are read in index order, which keeps a key's rows in order. A replay of the lease
answers the very same runs. With
``maxPerKey`` 1 a key advances one message per micro-batch, the next going out only after the ack.

A proxy's death: a partition yields its whole lease or nothing, and nothing when its proxy refuses
connections (the lease died with it; its messages come back through the survivors): it then marks the
lease abandoned at another proxy, so that the batch's ack finishes none of it. Acks go to every proxy
that answers: the one holding the lease finishes it, the others finish what the lease's record in
Redis says it handed out, so the ack of a lease whose proxy died after Spark committed still keeps its
messages from coming again. docs/design/spark.md, "A proxy's death under a Spark query", says why nothing
weaker is safe.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from ddmq.client.spark.options import SourceOptions
from ddmq.client.spark.queue_mode import DataLossError
from ddmq.client.spark.rows import to_record_batch
from ddmq.client.thrift_client import ProxyClient, ProxyClientError, ProxyConnectionError
from ddmq.protocol.wire import ConsumeStatsRequest, LeaseAck, PullRequest

__all__ = ["PullPartition", "PullStreamReader", "read_leased", "refused"]

log = logging.getLogger(__name__)

#: After a restart the driver does not know which batches it acked already: it acks this many back.
ACK_LOOKBACK_BATCHES: Final = 16
#: With availableNow, stop after this many data batches in a row that moved no consume offset.
AVAILABLE_NOW_IDLE_BATCHES: Final = 20
#: A partition retries a proxy that fails without refusing connections for at least this long.
_RETRY_FOR_S: Final = 10.0


class PullPartition(InputPartition):
    """One Spark task's share of a micro-batch: a lease on one proxy."""

    def __init__(self, host: str, port: int, lease_id: str, max_rows: int) -> None:
        super().__init__(lease_id)
        self.host = host
        self.port = port
        self.lease_id = lease_id
        self.max_rows = max_rows


def refused(error: ProxyClientError) -> bool:
    """Nothing listens at the proxy's address: its process is gone, and its replay leases with it (a
    process that listens there later is another one, which knows none of them)."""
    return isinstance(error, ProxyConnectionError) and isinstance(error.__cause__, ConnectionRefusedError)


def read_leased(options: SourceOptions, partition: PullPartition) -> Iterator[Any]:
    """Pull the partition's lease (again): the same record batches on every call until it is acked.

    The lease's pulls are all taken before any row is handed to Spark, so the partition yields either
    the whole lease or nothing. When its proxy refuses connections (killed, or stopped) the partition
    yields nothing: the lease died with the proxy, its messages come back through the queues' next
    owner, and no row of it reaches this micro-batch. Other failures (a reset, a timeout, a proxy
    shutting down or without Redis) are retried from the lease's first pull (a replay answers the same
    rows) for ``timeoutSec``; past that the task fails as it would have.
    """
    deadline = time.monotonic() + max(options.timeout_s, _RETRY_FOR_S)
    backoff_s = 0.1
    while True:
        try:
            batches = _pull_lease(options, partition)
        except ProxyClientError as exc:
            if refused(exc):
                log.warning(
                    "lease %s: %s:%d refuses connections; the lease died with it and its messages come back "
                    "through the queues' next owner, in a later micro-batch (%s)",
                    partition.lease_id, partition.host, partition.port, exc,
                )
                abandon(options, partition)
                return
            if not exc.retriable or time.monotonic() + backoff_s > deadline:
                raise
            log.warning("lease %s: %s; reading it again from %s:%d", partition.lease_id, exc, partition.host,
                        partition.port)
            time.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 2.0)
            continue
        yield from batches
        return


def abandon(options: SourceOptions, partition: PullPartition) -> None:
    """Mark the partition's lease abandoned at every other proxy that answers: an earlier read of it (a
    failed task attempt) may have been recorded, and the batch's ack must not finish rows this read
    does not yield. Raises when no proxy took it (the task fails and Spark retries it)."""
    errors = []
    for host, port in options.servers:
        if (host, port) == (partition.host, partition.port):
            continue
        try:
            with ProxyClient(host, port, timeout_s=options.timeout_s) as client:
                client.ack_leases(LeaseAck(groupId=options.group, leaseIds=[partition.lease_id], abandon=True))
            return
        except ProxyClientError as exc:
            errors.append(f"{host}:{port}: {exc}")
    raise ProxyConnectionError(
        f"lease {partition.lease_id}: its proxy is gone and no other proxy took the lease's abandonment: "
        + ("; ".join(errors) or "no other proxy configured")
    )


def _pull_lease(options: SourceOptions, partition: PullPartition) -> list[Any]:
    """Every pull of the lease, from its first, as record batches (one connection)."""
    batches = []
    taken = 0
    with ProxyClient(partition.host, partition.port, timeout_s=options.timeout_s) as client:
        for index in range(options.pulls_per_partition):
            want = min(options.max_batch_size, partition.max_rows - taken)
            if want <= 0:
                break
            response = client.pull(
                PullRequest(
                    groupId=options.group,
                    topic=options.topic,
                    maxBatchSize=want,
                    maxLingerTime=options.linger_ms if index == 0 else 0,
                    leaseId=partition.lease_id,
                    leaseIndex=index,
                    leaseTimeoutMs=options.lease_timeout_ms,
                    maxPerKey=options.max_per_key if options.max_per_key > 1 else None,
                )
            )
            messages = response.messages or []
            if not messages or response.context is None:
                break
            taken += len(messages)
            batches.append(to_record_batch(response.context.topic or "", int(response.context.qid or 0), messages))
    return batches


class _Proxies:
    """The driver's connections to every proxy (never pickled)."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._clients: dict[tuple[str, int], ProxyClient] = {}
        #: Indexes (into ``options.servers``) of the proxies that answered the last ``positions()``.
        self.answered: list[int] = list(range(len(options.servers)))
        #: The longest queue lease time left that the last ``positions()`` saw, in seconds.
        self.lease_ttl_s = 0.0
        #: ``"topic#qid"`` -> (entries the group lost, the latest range), as the last ``positions()`` saw.
        self.expired: dict[str, tuple[int, str]] = {}

    def client(self, server: tuple[str, int]) -> ProxyClient:
        client = self._clients.get(server)
        if client is None:
            client = self._clients[server] = ProxyClient(*server, timeout_s=self.options.timeout_s)
        return client

    def positions(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(topic, qid) -> (consume, produce) offsets, the highest any proxy reports."""
        merged: dict[tuple[str, str], tuple[int, int]] = {}
        errors = []
        answered = []
        lease_ttl_s = 0.0
        expired: dict[str, tuple[int, str]] = {}
        for number, server in enumerate(self.options.servers):
            try:
                rows = self.client(server).get_consume_stats(
                    ConsumeStatsRequest(group=self.options.group, topic=self.options.topic)
                )
            except ProxyClientError as exc:
                errors.append(f"{server[0]}:{server[1]}: {exc}")
                continue
            answered.append(number)
            for row in rows:
                lease_ttl_s = max(lease_ttl_s, max((row.leaseTtlMs or {}).values(), default=0) / 1000)
                for qid, count in (row.expired or {}).items():
                    queue = f"{row.topic}#{qid}"
                    if count > expired.get(queue, (0, ""))[0]:
                        expired[queue] = (count, (row.expiredLast or {}).get(qid, "?"))
                produce = row.produceOffsets or {}
                for qid, consume in (row.consumeOffsets or {}).items():
                    key = (row.topic or "", qid)
                    old = merged.get(key, (0, 0))
                    merged[key] = (max(old[0], consume), max(old[1], produce.get(qid, 0)))
        if errors and len(errors) == len(self.options.servers):
            raise ConnectionError(f"no ddmq proxy answered getConsumeStats: {'; '.join(errors)}")
        if errors and answered != self.answered:  # once per change, not every micro-batch
            log.warning("planning without the proxies that did not answer: %s", "; ".join(errors))
        self.answered = answered
        self.lease_ttl_s = lease_ttl_s
        self.expired = expired
        return merged

    def ack_leases(self, server: int, lease_ids: list[str]) -> bool:
        """Ack ``lease_ids`` on proxy number ``server``: it finishes the leases it holds, and those another
        proxy served from their records in Redis. True when done, or when nothing listens there (its
        leases died with its process, and every proxy that answers gets the ack). False: try again later."""
        address = self.options.servers[server]
        try:
            self.client(address).ack_leases(LeaseAck(groupId=self.options.group, leaseIds=lease_ids))
        except ProxyClientError as exc:
            if refused(exc):
                log.info("not acking %d leases on %s:%d: it refuses connections, its leases are gone",
                         len(lease_ids), *address)
                return True
            log.warning("acking %d leases on %s:%d failed (retried later): %s", len(lease_ids), *address, exc)
            return False
        return True

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()


class PullStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._proxies: _Proxies | None = None
        #: Per proxy (index into ``options.servers``), the last batch whose leases it acked.
        self._acked_through: dict[int, int] = {}
        self._target: dict[tuple[str, str], int] | None = None
        self._last_consumed: int | None = None
        self._idle_batches = 0
        self._idle_since: float | None = None
        #: ``"topic#qid"`` -> entries the group had lost when this query last looked (None: not yet).
        self._expired_seen: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_proxies"] = None  # sockets stay in the driver
        return state

    @property
    def proxies(self) -> _Proxies:
        if self._proxies is None:
            self._proxies = _Proxies(self.options)
        return self._proxies

    # driver side -------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        return {"seq": 0, "flush": True, "parts": 0, "rows": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_messages_per_trigger is not None:
            return ReadMaxRows(self.options.max_messages_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {key: produce for key, (_, produce) in self.proxies.positions().items()}
        log.info("availableNow: reading up to produce offsets %s", self._target)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        seq = int(start["seq"])
        self._ack_through(seq)  # every batch up to `start` is in Spark's commit log by now
        backlog = self._has_backlog()
        expired = self._check_data_loss(start)
        if backlog:
            parts = self.options.num_partitions
            max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            return {
                "seq": seq + 1,
                "flush": False,
                "parts": parts,
                "rows": self.options.rows_per_partition(max_rows, parts),
                # The proxies that answered while planning: the batch's leases go to them only, and the
                # offset keeps the choice so that a rerun pulls every lease from the same proxy.
                "servers": list(self.proxies.answered),
                # What the group had lost so far: a restart from this offset reports only later losses.
                "expired": expired,
            }
        if not start.get("flush", True):
            return {"seq": seq + 1, "flush": True, "parts": 0, "rows": 0, "expired": expired}
        return start

    def _check_data_loss(self, start: dict[str, Any]) -> dict[str, int]:
        """``failOnDataLoss`` in pull mode: the proxies count the entries their group never received
        (trimmed before it read them); a count above what the query's offsets recorded fails the query,
        or, with ``failOnDataLoss=false``, is logged and recorded. A query without a recorded count
        starts from none: the group is the query's consumer, and what it lost before the query's first
        batch the query never saw either."""
        seen = self._expired_seen
        if seen is None:
            recorded = start.get("expired")
            seen = {str(queue): int(count) for queue, count in recorded.items()} if isinstance(recorded, dict) else {}
        for queue, (count, latest) in sorted(self.proxies.expired.items()):
            lost = count - seen.get(queue, 0)
            if lost <= 0:
                continue
            what = (f"ddmq: group {self.options.group} lost {lost} message(s) of {queue} (the latest offsets "
                    f"{latest}): trimmed from Redis (a retention cap, an idle group or a producer's maxlen) "
                    "before the group read them")
            if self.options.fail_on_data_loss:
                raise DataLossError(f"{what}. Set the option failOnDataLoss=false to go on")
            log.warning("%s; going on (failOnDataLoss=false)", what)
            seen[queue] = count
        self._expired_seen = seen
        return dict(seen)

    def _has_backlog(self) -> bool:
        positions = self.proxies.positions()
        if self._target is None:
            return any(produce > consume for consume, produce in positions.values())
        remaining = sum(max(0, target - positions.get(key, (0, 0))[0]) for key, target in self._target.items())
        if remaining == 0:
            return False
        consumed = sum(consume for consume, _ in positions.values())
        now = time.monotonic()
        if consumed == self._last_consumed:
            self._idle_batches += 1
            # A dead proxy's queues stand still until their leases expire and a survivor takes them:
            # give up only after two lease periods as well, or a proxy's death would end the run early.
            idle_s = now - (self._idle_since if self._idle_since is not None else now)
            if self._idle_batches >= AVAILABLE_NOW_IDLE_BATCHES and idle_s >= 2 * self.proxies.lease_ttl_s:
                log.warning(
                    "availableNow: %d messages below the target did not finish in %d batches (%.1f s); stopping",
                    remaining,
                    self._idle_batches,
                    idle_s,
                )
                return False
        else:
            self._idle_batches = 0
            self._idle_since = now
        self._last_consumed = consumed
        return True

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[PullPartition]:
        if end.get("flush") or int(end["seq"]) == int(start["seq"]):
            return []
        seq = int(end["seq"])
        servers = self.batch_servers(end)
        partitions = []
        for index in range(int(end["parts"])):
            host, port = servers[index % len(servers)]
            partitions.append(PullPartition(host, port, self.lease_id(seq, index), int(end["rows"])))
        return partitions

    def batch_servers(self, end: dict[str, Any]) -> list[tuple[str, int]]:
        """The proxies a batch's partitions are spread over (every one for offsets written before the
        offset recorded them, or when the list no longer matches the ``servers`` option)."""
        chosen = end.get("servers")
        count = len(self.options.servers)
        if isinstance(chosen, list) and chosen and all(isinstance(i, int) and 0 <= i < count for i in chosen):
            return [self.options.servers[i] for i in chosen]
        return list(self.options.servers)

    def commit(self, end: dict[str, Any]) -> None:
        self._ack_through(int(end["seq"]))

    def stop(self) -> None:
        if self._proxies is not None:
            self._proxies.close()

    def lease_id(self, seq: int, index: int) -> str:
        return f"{self.options.consumer_id}/{seq}/{index}"

    def _ack_through(self, seq: int) -> None:
        """Ack every batch's leases up to ``seq`` on every proxy. A proxy that fails is asked again next
        time for every batch since its last ack; one that refuses connections counts as acked (see
        :meth:`_Proxies.ack_leases`), so a dead proxy does not grow the list."""
        if seq <= 0:
            return
        self._wait_for_gate(seq)
        parts = self.options.num_partitions
        for server in range(len(self.options.servers)):
            done = self._acked_through.get(server)
            if done is not None and seq <= done:
                continue
            first = done + 1 if done is not None else max(1, seq - ACK_LOOKBACK_BATCHES + 1)
            lease_ids = [self.lease_id(s, p) for s in range(first, seq + 1) for p in range(parts)]
            if self.proxies.ack_leases(server, lease_ids):
                self._acked_through[server] = seq

    def _wait_for_gate(self, seq: int) -> None:
        """The ``testAckGate`` hook: lets a test act between Spark's commit of a batch and its ack."""
        gate = self.options.ack_gate
        if gate is None or not (Path(gate) / f"hold-{seq}").exists():
            return
        wait, go = Path(gate) / f"ack-{seq}.wait", Path(gate) / f"ack-{seq}.go"
        wait.touch()
        deadline = time.monotonic() + 120
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    # executor side -----------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, PullPartition):
            return iter(())  # Spark's stand-in partition when there is nothing to read
        return read_leased(self.options, partition)
