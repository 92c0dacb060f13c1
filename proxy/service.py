"""ProxyService: the consume proxy as one object with a start/close lifecycle.

It owns the Redis connection (and the embedded redis-server when configured), one
:class:`~ddmq.proxy.groups.group.ConsumerGroup` per configured group, the offset committer and the server
adapters. Each adapter holds an :class:`~ddmq.proxy.api.requests.Endpoint` (:meth:`endpoint`): the
:class:`~ddmq.proxy.api.surface.ConsumeService` surface (:meth:`pull`, :meth:`submit`, :meth:`ack_leases`,
:meth:`consume_stats`, :meth:`fetch`, :meth:`ack`) with that server's limits, and calls nothing else.
The request rules (:mod:`ddmq.proxy.api.requests`) and the group and topic checks are applied here.

>>> async with ProxyService(load("proxy.yaml")) as service:
...     await service.wait_closed()
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter
from types import TracebackType

from ddmq.config.schema import ProxyConfig
from ddmq.protocol.connection import (
    AsyncRedis,
    async_redis,
    is_cluster_url,
    quiet_dropped_cluster_nodes,
    redact_url,
)
from ddmq.protocol.queues import ProduceError, TopicMismatchError, ensure_topic
from ddmq.proxy.api.fetch import LowLevelApi
from ddmq.proxy.api.requests import Endpoint, RequestRules, batch_size, in_group, per_key, result_offsets
from ddmq.proxy.cluster.audit import ReadAudit
from ddmq.proxy.cluster.commits import commit_periodically, flush_groups
from ddmq.proxy.cluster.leases import LeaseStore
from ddmq.proxy.cluster.membership import Membership
from ddmq.proxy.core.errors import (
    BadRequestError,
    BrokerError,
    ConfigError,
    UnavailableError,
    UnknownGroupError,
    UnknownTopicError,
)
from ddmq.proxy.core.types import (
    ConsumeStatsRow,
    FetchedQueue,
    PullBatch,
    PullLease,
    QueueId,
    QueueResult,
    ReplySize,
)
from ddmq.proxy.engine.pull_buffer import THRIFT_REPLY
from ddmq.proxy.engine.replays import ReplayLeases
from ddmq.proxy.engine.verbs import apply_verbs, noted_fails_once
from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer, build_groups
from ddmq.proxy.ops.metrics import ProxyMetrics
from ddmq.proxy.ops.reload import ConfigChange, apply_config
from ddmq.proxy.servers.clients import ClientTracker
from ddmq.proxy.servers.exposure import exposure_warnings
from ddmq.proxy.servers.http import HttpServer
from ddmq.proxy.servers.thrift.server import ThriftServer
from ddmq.proxy.store.broker import Broker, ConnectionCounter, map_redis_errors
from ddmq.proxy.store.embedded import EmbeddedRedis, EmbeddedRedisError

log = logging.getLogger(__name__)

#: The ack deadline assumed for a group or topic this proxy no longer serves (the config's default).
DEFAULT_ACK_TIMEOUT_MS = 5000

#: Results with more offsets than this are applied in slices of it, letting other connections'
#: requests run in between (a slice takes a few milliseconds; bench/edges.py measures the effect).
APPLY_SLICE_OFFSETS = 4096


@contextmanager
def _listening(what: str, host: str, port: int) -> Iterator[None]:
    """A port that cannot be bound (in use, not allowed) becomes one clear error, not a socket traceback."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UnavailableError(f"cannot listen on {host}:{port} ({what}): {reason}") from exc


class ProxyService:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.counters: Counter[str] = Counter()
        self.groups: dict[str, ConsumerGroup] = {}
        self.redis_url = config.redis
        self.redis: AsyncRedis | None = None
        self.broker: Broker | None = None
        self.leases: LeaseStore | None = None
        self.membership: Membership | None = None
        self.thrift_port: int | None = None
        self.http_port: int | None = None
        self.metrics = ProxyMetrics(self)
        #: The clients pulling, for the console (fed by the server adapters).
        self.clients = ClientTracker(self._ack_timeout_ms)
        self._embedded: EmbeddedRedis | None = None
        self._thrift: ThriftServer | None = None
        self._http: HttpServer | None = None
        self._low_level: LowLevelApi | None = None
        self._audit: ReadAudit | None = None
        self._committer: asyncio.Task[None] | None = None
        #: Per group: its replay leases (Spark's replayable pulls); ``leases`` are the queue leases.
        self.replays: dict[str, ReplayLeases] = {}
        self._state = "new"
        self._closed = asyncio.Event()
        self._reloading = asyncio.Lock()

    # lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._state != "new":
            raise RuntimeError("ProxyService.start() called twice")
        self._state = "starting"
        try:
            await self._start()
        except BaseException:
            # Groups may have joined and taken leases before a later step failed (a port in use): leave
            # at once, or the other proxies would wait out the lease TTL for queues nobody reads.
            await asyncio.gather(*(g.release_leases() for g in self.groups.values()), return_exceptions=True)
            await self._release()
            raise
        self._state = "running"

    async def _start(self) -> None:
        config = self.config
        if config.embedded:
            embedded = config.embedded_redis
            self._embedded = EmbeddedRedis(embedded.data_dir, port=embedded.port, executable=embedded.executable)
            try:
                await asyncio.to_thread(self._embedded.start)
            except EmbeddedRedisError as exc:
                self._embedded = None
                raise UnavailableError(f"cannot start the embedded redis-server: {exc}") from exc
            self.redis_url = self._embedded.url
            log.info("embedded redis-server at %s (data in %s)", redact_url(self.redis_url), embedded.data_dir)
        connections = ConnectionCounter()  # lets readers notice a Redis restart or failover (see QueueReader)
        self.redis = async_redis(self.redis_url, decode_responses=False, redis_connect_func=connections.on_connect)
        if is_cluster_url(self.redis_url):
            quiet_dropped_cluster_nodes(asyncio.get_running_loop())
        with map_redis_errors(f"connecting to {redact_url(self.redis_url)}"):
            await self.redis.ping()
        self.broker = Broker(self.redis, connections)
        self._low_level = LowLevelApi(self.broker)
        self.leases = LeaseStore(self.redis, config.instance_id, config.leases.ttl_ms)
        for topic, topic_config in config.topics.items():
            try:
                await ensure_topic(self.redis, topic, topic_config.queues)
            except TopicMismatchError as exc:
                raise ConfigError(f"topics.{topic}.queues: {exc}") from exc
            except ProduceError as exc:
                raise BrokerError(str(exc)) from exc
        self.membership = Membership(self.redis, config.instance_id, config.leases.ttl_ms)
        self.groups = build_groups(config, self.broker, self.leases, self.membership)
        if config.http.enabled:  # action timings are only read through /metrics
            self.metrics.instrument(self.groups.values())
        if config.audit_log:
            self._audit = ReadAudit(config.audit_log, config.instance_id)
            for group in self.groups.values():
                group.read_audit = self._audit
                for consumer in group.consumers.values():
                    consumer.read_audit = self._audit
        for group in self.groups.values():
            group.start()
        self._committer = asyncio.create_task(
            commit_periodically(config.commit_interval_ms, lambda: self._state in ("starting", "running"),
                                lambda: self.groups.values()),
            name="offset-committer",
        )
        thrift = config.thrift
        self._thrift = ThriftServer(
            self.endpoint(thrift.max_linger_ms),
            thrift.host,
            thrift.port,
            thrift.max_frame_bytes,
            max_connections=thrift.max_connections,
            idle_timeout_ms=thrift.idle_timeout_ms,
            frame_timeout_ms=thrift.request_timeout_ms,
            max_buffered_bytes=thrift.max_buffered_bytes,
            allowed_clients=thrift.allowed_clients,
            clients=self.clients,
        )
        with _listening("thrift", thrift.host, thrift.port):
            await self._thrift.start()
        self.thrift_port = self._thrift.port
        if config.http.enabled:
            self._http = HttpServer(self, config.http)
            with _listening("http", config.http.host, config.http.port):
                await self._http.start()
            self.http_port = self._http.port
        log.info(
            "ddmq-proxy %s ready: thrift %s:%d, http %s, redis %s, groups %s",
            config.instance_id, thrift.host, self.thrift_port,
            f"{config.http.host}:{self.http_port}" if self.http_port is not None else "off",
            redact_url(self.redis_url), sorted(self.groups),
        )
        for warning in exposure_warnings(config):
            log.warning("%s", warning)

    async def close(self) -> None:
        """Graceful stop: stop reading, answer parked pulls, let clients ack for ``shutdown_grace_ms``,
        flush offsets, stop the servers, and stop Redis if it is embedded."""
        if self._state in ("closing", "closed"):
            await self._closed.wait()
            return
        was_running = self._state == "running"
        self._state = "closing"
        async with self._reloading:  # a reload under way finishes first (its drain is bounded)
            pass
        try:
            if was_running:
                await asyncio.gather(*(g.stop_reading() for g in self.groups.values()))
                await self._grace()
                if self._committer is not None:
                    self._committer.cancel()
                    await asyncio.gather(self._committer, return_exceptions=True)
                await flush_groups(self.groups.values())
                # Free the queues now rather than letting the leases expire: a successor starts at once.
                await asyncio.gather(*(g.release_leases() for g in self.groups.values()), return_exceptions=True)
        finally:
            await self._release()
            self._state = "closed"
            self._closed.set()

    async def _grace(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.shutdown_grace_ms / 1000
        # Polling keeps the hot ack path free of shutdown bookkeeping; this runs once per process.
        while loop.time() < deadline and any(g.buffer.in_flight for g in self.groups.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    async def _release(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._thrift is not None:
            await self._thrift.close()
        await asyncio.gather(*(g.close() for g in self.groups.values()), return_exceptions=True)
        if self._committer is not None and not self._committer.done():
            self._committer.cancel()
            await asyncio.gather(self._committer, return_exceptions=True)
        if self._audit is not None:
            self._audit.close()
        if self.redis is not None:
            await self.redis.aclose()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)

    def server_stats(self) -> dict[str, dict[str, int]]:
        """Per server ("thrift", "http"): its connection counters and gauges (see ThriftServer.stats)."""
        stats = {}
        if self._thrift is not None:
            stats["thrift"] = self._thrift.stats()
        if self._http is not None:
            stats["http"] = self._http.connections.stats()
        return stats

    @property
    def running(self) -> bool:
        """True from the end of start() until close() begins (what ``/readyz`` reports)."""
        return self._state == "running"

    @property
    def read_audit(self) -> ReadAudit | None:
        """The read audit (``audit_log``): every consumer records into it, also those a reload adds."""
        return self._audit

    async def reload(self, config: ProxyConfig) -> ConfigChange:
        """Apply a new, already validated config: groups and topics change live (see
        :mod:`ddmq.proxy.ops.reload`). Raises ConfigError, and changes nothing, when it cannot apply."""
        if self._state != "running":
            raise UnavailableError(f"cannot reload the config of a proxy that is {self._state}")
        async with self._reloading:
            if self._state != "running":
                raise UnavailableError(f"cannot reload the config of a proxy that is {self._state}")
            return await apply_config(self, config)

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> ProxyService:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # the ConsumeService surface ----------------------------------------------------------------

    def _ack_timeout_ms(self, group: str, topic: str) -> int:
        consumer = self.groups[group].consumers.get(topic) if group in self.groups else None
        return consumer.config.timeout_ms if consumer is not None else DEFAULT_ACK_TIMEOUT_MS

    def endpoint(self, max_linger_ms: int) -> Endpoint:
        """The ConsumeService a server adapter calls, bounding long polls to ``max_linger_ms``."""
        return Endpoint(self, RequestRules(max_linger_ms))

    @property
    def rules(self) -> RequestRules:
        """The rules of calls made on the service itself (tests, embedding): the Thrift server's."""
        return RequestRules(self.config.thrift.max_linger_ms)

    def _group(self, name: str, draining: bool = False) -> ConsumerGroup:
        """The group ``name``; a removed group is unknown, unless ``draining`` (it still takes acks)."""
        group = self.groups.get(name)
        if group is None or (group.removed and not draining):
            serves = sorted(n for n, g in self.groups.items() if not g.removed)
            raise UnknownGroupError(f"unknown group {name!r}; this proxy serves {serves}")
        return group

    async def pull(
        self,
        group: str,
        topic: str | None,
        max_batch: int | None,
        linger_ms: int | None,
        results: list[QueueResult],
        lease: PullLease | None = None,
        max_per_key: int | None = None,
        reply: ReplySize | None = None,
        *,
        rules: RequestRules | None = None,
    ) -> PullBatch:
        """Serve one pull: apply ``results``, then answer ready messages of one queue. ``max_per_key``
        (None or 1: one per key) lets the reply carry ordered runs of a key (see ``PullBuffer``);
        ``reply`` counts the reply's bytes against the topic's ``max_reply_bytes`` (None: as a Thrift
        frame)."""
        if results:  # first: acks count even when the group was just removed
            await self._apply(in_group(results, group))
        consumer_group = self._group(group)
        topic = topic or None
        if topic is not None:
            consumer = consumer_group.consumers.get(topic)
            if consumer is None:
                raise UnknownTopicError(f"group {group!r} does not consume topic {topic!r}")
            consumers = [consumer]
        else:
            consumers = list(consumer_group.consumers.values())
        batch = batch_size(max_batch, max(c.config.max_pull_batch_size for c in consumers))
        run = per_key(max_per_key)
        linger = self._linger(linger_ms, rules)
        buffer = consumer_group.buffer
        reply = reply or THRIFT_REPLY
        started = perf_counter()
        if results and not buffer.ready:
            # The acks may have released their keys' successors; the dispatcher hands them to the
            # buffer on its next step. Let it run once, so this pull can take them at once instead of
            # parking until then (with QID order this is every pull).
            await asyncio.sleep(0)
        if lease is not None:
            timeout_ms = lease.timeout_ms
            if timeout_ms is None:
                timeout_ms = max(c.config.timeout_ms for c in consumers)
            answer = await self._replays(consumer_group).pull(
                lease.lease_id, lease.pull_index, timeout_ms, topic, batch, linger, run, reply
            )
        else:
            answer = await buffer.pull(topic, batch, linger, None, run, (), reply)
        self.metrics.observe_pull(group, answer, perf_counter() - started)
        return answer

    def _replays(self, group: ConsumerGroup) -> ReplayLeases:
        replays = self.replays.get(group.name)
        if replays is None:
            replays = self.replays[group.name] = ReplayLeases(group.buffer, group)
        return replays

    async def ack_leases(self, group: str, lease_ids: list[str], abandon: bool = False) -> int:
        replays = self._replays(self._group(group))
        if abandon:
            await replays.abandon(lease_ids)
            return 0
        return await replays.ack(lease_ids)

    async def submit(self, results: list[QueueResult], group: str | None = None) -> None:
        if group is not None:
            self._group(group, draining=True)
            results = in_group(results, group)
        await self._apply(results)

    def _linger(self, linger_ms: int | None, rules: RequestRules | None) -> int:
        """The wait a request gets: as the rules bound it, none once shutdown began (parked pulls
        are answered then, and new ones must not park). A pull that arrives while the service is
        still starting (the Thrift server listens before the HTTP server) waits like any other."""
        if self._state not in ("starting", "running"):
            return 0
        return (rules or self.rules).linger(linger_ms)

    async def fetch(
        self,
        group: str,
        offsets: dict[str, dict[str, int]] | None,
        max_batch: int | None,
        linger_ms: int | None,
        *,
        rules: RequestRules | None = None,
    ) -> list[FetchedQueue]:
        consumer_group = self._group(group)
        if self._low_level is None:
            raise UnavailableError("the proxy is not started")
        return await self._low_level.fetch(consumer_group, offsets, max_batch, self._linger(linger_ms, rules))

    async def ack(self, group: str, offsets: dict[str, dict[str, int]]) -> None:
        consumer_group = self._group(group)
        if self._low_level is None:
            raise UnavailableError("the proxy is not started")
        await self._low_level.ack(consumer_group, offsets)

    async def _apply(self, results: list[QueueResult]) -> None:
        """Apply acks and fails: all of them, or none when there are more than MAX_RESULT_OFFSETS."""
        try:
            total = result_offsets(results)
        except BadRequestError:
            self.counters["results_refused"] += 1
            raise
        results = [noted_fails_once(r) if r.fail_details else r for r in results]
        if total <= APPLY_SLICE_OFFSETS:
            self._apply_now(results)
            return
        since_yield = 0
        for piece in _slices(results, APPLY_SLICE_OFFSETS):
            self._apply_now([piece])
            since_yield += piece.size
            if since_yield >= APPLY_SLICE_OFFSETS:
                since_yield = 0
                await asyncio.sleep(0)

    def _apply_now(self, results: list[QueueResult]) -> None:
        for result in results:
            group = self.groups.get(result.group)
            consumer = None
            if group is not None:  # a topic being removed still takes acks while it drains
                consumer = group.consumers.get(result.topic) or group.retiring.get(result.topic)
            try:
                qid = int(result.qid)
            except ValueError:
                qid = -1
            if group is None or consumer is None or not 0 <= qid < max(consumer.queues, 1):
                self.counters["unknown_results"] += result.size
                log.debug("ignoring results for unknown %s/%s#%s", result.group, result.topic, result.qid)
                continue
            queue = QueueId(result.topic, qid)
            if result.success:
                group.buffer.ack(queue, result.success)
            if result.fail:
                group.buffer.fail(queue, result.fail)
            if result.fail_details or result.release or result.extend:
                apply_verbs(group.buffer, queue, result)

    async def consume_stats(self, group: str, topic: str | None) -> list[ConsumeStatsRow]:
        consumer_group = self._group(group)
        topic = topic or None
        if topic is not None and topic not in consumer_group.consumers:
            raise UnknownTopicError(f"group {group!r} does not consume topic {topic!r}")
        rows = []
        for consumer in consumer_group.consumers.values():
            if topic is None or consumer.topic == topic:
                rows.append(await self._stats_row(consumer))
        return rows

    async def _stats_row(self, consumer: TopicConsumer) -> ConsumeStatsRow:
        assert self.broker is not None
        produce = await self.broker.produce_offsets(consumer.topic, consumer.queues) if consumer.queues else []
        consume = {}
        for qid in range(consumer.queues):
            tracker = consumer.trackers.get(qid)
            if tracker is not None:
                consume[str(qid)] = tracker.commit_point
            else:
                committed = await self.broker.committed_offset(consumer.group, consumer.topic, qid)
                consume[str(qid)] = committed if committed is not None else 1
        assert self.leases is not None
        holders = await asyncio.gather(
            *(self.leases.holder(consumer.group, consumer.topic, qid) for qid in range(consumer.queues))
        )
        live = [(str(qid), holder) for qid, holder in enumerate(holders) if holder is not None]
        return ConsumeStatsRow(
            consumer.group,
            consumer.topic,
            consume,
            {str(qid): off for qid, off in enumerate(produce)},
            owners={qid: holder.owner for qid, holder in live},
            lease_ttl_ms={qid: holder.expires_in_ms for qid, holder in live},
            lease_terms={qid: holder.term for qid, holder in live},
        )


def _slices(results: list[QueueResult], size: int) -> list[QueueResult]:
    """``results`` cut into pieces of at most ``size`` offsets each, in order (a result's acks before its fails)."""
    pieces = []
    for r in results:
        pieces += [r._replace(success=r.success[i : i + size], fail=[], release=(), extend=(), fail_details=())
                   for i in range(0, len(r.success), size)]
        pieces += [r._replace(success=[], fail=r.fail[i : i + size], release=(), extend=(), fail_details=())
                   for i in range(0, len(r.fail), size)]
        if r.release or r.extend or r.fail_details:
            pieces.append(r._replace(success=[], fail=[]))  # the verbs, at most MAX_RESULT_OFFSETS together
    return pieces
