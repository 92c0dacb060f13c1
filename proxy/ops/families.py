"""The engine's metric families: their names, help and finest labels, and the figures the collector
fills them with (:class:`~ddmq.proxy.ops.collector.EngineCollector`; the default mode's labels are
:mod:`~ddmq.proxy.ops.rollup`'s)."""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import TYPE_CHECKING, Final, NamedTuple

from ddmq.proxy.engine.end_to_end import Distribution
from ddmq.proxy.ops.exposition import COUNTER, GAUGE, GAUGE_HISTOGRAM, HISTOGRAM, Family

if TYPE_CHECKING:
    from ddmq.proxy.groups.group import ConsumerGroup, TopicConsumer

#: Upper bounds of the key-chain length histogram.
CHAIN_BUCKETS: Final = (1, 2, 4, 8, 16, 64, 256)
CHAIN_LES: Final = (*(str(float(bound)) for bound in CHAIN_BUCKETS), "+Inf")

QUEUE_LABELS: Final = ("group", "topic", "qid")
TOPIC_LABELS: Final = ("group", "topic")


class TopicFigures(NamedTuple):
    """What :meth:`ProxyMetrics.refresh <ddmq.proxy.ops.metrics.ProxyMetrics.refresh>` reads from Redis
    per (group, topic): the same on every proxy."""

    dead_letters: int
    unowned_queues: int


class QueueFigures(NamedTuple):
    """One opened queue's gauges at scrape time, or the sums over a (group, topic)'s opened queues."""

    in_flight: int
    ready: int
    retry_wait: int
    unfinished: int
    owned: int
    #: First unfinished offset (the live commit point).
    committed: int
    #: Next produce offset, None when this scrape could not read it (then no lag either).
    produced: int | None
    lag: int
    age_s: float


class QueueFamilies:
    """The queue-level gauges and the rollback counter: per queue with ``per_queue``; by default the
    collector sums each (group, topic)'s queues (the max age) and writes the sums at each family's
    default labels (:class:`~ddmq.proxy.ops.rollup.TopicRows`)."""

    def __init__(self, per_queue: bool) -> None:
        self.per_queue = per_queue
        labels = QUEUE_LABELS if per_queue else TOPIC_LABELS
        where = "per held queue" if per_queue else "over the queues this proxy holds"

        def gauge(name: str, doc: str) -> Family:
            return Family(name, GAUGE, doc, labels)

        self.in_flight = gauge("ddmq_messages_in_flight", "Pulled messages awaiting ack/fail.")
        self.ready = gauge("ddmq_messages_ready", "Messages ready to be pulled.")
        self.retry_wait = gauge("ddmq_messages_retry_wait", "Failed messages waiting for their retry interval.")
        self.unfinished = gauge(
            "ddmq_messages_unfinished",
            "Messages read from the queue and not finished yet (waiting behind their key, ready, in flight).",
        )
        self.owned = gauge("ddmq_queue_owned", "Queues this proxy holds the lease of (per queue: 1 or 0).")
        self.committed = gauge(
            "ddmq_consume_offset", "Next offset to commit (first unfinished message) per held queue."
        )
        self.produce = gauge("ddmq_produce_offset", "Next offset to be produced per held queue.")
        self.lag = gauge("ddmq_lag_messages", f"Produced but not yet finished messages {where}.")
        self.age = gauge(
            "ddmq_lag_seconds",
            f"Age of the oldest unfinished message {where} (now minus its produce time); 0 when caught up.",
        )
        self.rollbacks = Family(
            "ddmq_queue_rollbacks", COUNTER,
            "Times this proxy found Redis had lost writes it had read under a queue (a rollback).", labels,
        )

    def add(self, labels: tuple[str, ...], figures: QueueFigures) -> None:
        """One queue's figures (per queue), or a (group, topic)'s summed ones."""
        self.in_flight.add_metric(labels, figures.in_flight)
        self.ready.add_metric(labels, figures.ready)
        self.retry_wait.add_metric(labels, figures.retry_wait)
        self.unfinished.add_metric(labels, figures.unfinished)
        self.owned.add_metric(labels, figures.owned)
        self.committed.add_metric(labels, figures.committed)
        if figures.produced is not None:
            self.produce.add_metric(labels, figures.produced)
            self.lag.add_metric(labels, figures.lag)
            self.age.add_metric(labels, figures.age_s)

    def families(self) -> list[Family]:
        # An offset has no meaningful sum: the offsets are exported per queue only.
        offsets = [self.committed, self.produce] if self.per_queue else []
        return [self.in_flight, self.ready, self.retry_wait, self.unfinished, self.owned, *offsets,
                self.lag, self.age, self.rollbacks]


class TopicFamilies:
    """The series per (group, topic) with ``per_queue`` (per group or proxy by default): key chains,
    concurrency, engine events."""

    def __init__(self) -> None:
        labels = TOPIC_LABELS
        self.keys = Family("ddmq_order_keys", GAUGE, "Order keys with an unfinished message.", labels)
        self.waiting = Family(
            "ddmq_order_waiting_messages", GAUGE, "Messages waiting behind an unfinished one of the same key.", labels
        )
        self.longest = Family("ddmq_order_chain_length_max", GAUGE, "Unfinished messages of the busiest key.", labels)
        self.held_keys = Family(
            "ddmq_held_keys", GAUGE, "Order keys at their key_buffer cap with messages left in Redis.", labels
        )
        self.held = Family(
            "ddmq_held_messages", GAUGE, "Messages left in Redis behind keys at their cap, to be read again.", labels
        )
        self.chains = Family(
            "ddmq_order_chain_length", GAUGE_HISTOGRAM, "Order keys by their number of unfinished messages.", labels
        )
        self.unfinished = Family(
            "ddmq_topic_unfinished_messages", GAUGE,
            "Unfinished messages of the consumers (each capped by its topic's concurrency).", labels,
        )
        self.concurrency = Family(
            "ddmq_topic_concurrency_limit", GAUGE,
            "The configured concurrency: most unfinished messages (by default summed over the group's topics).", labels,
        )
        self.events = Family(
            "ddmq_consumer_events", COUNTER, "Engine events of the consumers (read, filtered, json_invalid, ...).",
            (*labels, "event"),
        )
        self.key_states = Family(
            "ddmq_keys", GAUGE,
            "Order keys with an unfinished message here, by state (parked, failing, in_flight, waiting).",
            (*labels, "state"),
        )

    def add(self, group: str, topic: str, consumer: TopicConsumer) -> None:
        labels = (group, topic)
        lengths, counts = chain_lengths(consumer)
        total = sum(lengths)
        self.keys.add_metric(labels, len(lengths))
        self.waiting.add_metric(labels, total - len(lengths))
        self.longest.add_metric(labels, max(lengths, default=0))
        held = consumer.jobs.held
        self.held_keys.add_metric(labels, len(held))
        self.held.add_metric(labels, sum(held.per_queue.values()))
        self.chains.add_histogram(labels, list(zip(CHAIN_LES, accumulate(counts), strict=True)), total)
        self.unfinished.add_metric(labels, consumer.unfinished)
        for state, count in consumer.parking.counts().items():
            self.key_states.add_metric((group, topic, state), count)
        self.concurrency.add_metric(labels, consumer.config.concurrency)
        for event, count in sorted(consumer.counters.items()):
            self.events.add_metric((group, topic, event), count)

    def families(self) -> list[Family]:
        return [self.keys, self.waiting, self.longest, self.held_keys, self.held, self.chains, self.unfinished,
                self.concurrency, self.events, self.key_states]


def chain_lengths(consumer: TopicConsumer) -> tuple[list[int], list[int]]:
    """Unfinished messages of each order key with one, and how many keys fall in each of
    :data:`CHAIN_BUCKETS` (not cumulative; the last: above them all)."""
    queue = consumer.blocking_queue
    lengths = [queue.chain_length(key) for key, _ in queue.heads()]
    counts = [0] * len(CHAIN_LES)
    for length in lengths:
        counts[bisect_left(CHAIN_BUCKETS, length)] += 1
    return lengths, counts


def end_to_end_families(groups: dict[str, ConsumerGroup], per_queue: bool) -> list[Family]:
    """Produce to first delivery and to ack (``stage``), the attempts of the messages acked and
    dead-lettered (``outcome``), and the observations a producer's clock put in the future: per (group,
    topic) with ``per_queue``, per group by default (a histogram is 19 series: per topic by default, a
    thousand topics would add 38,000 to every scrape; the console and ``ddmq status --http`` show each
    topic's quantiles whatever the mode). A (group, topic) has them from its first delivery here."""
    labels = TOPIC_LABELS if per_queue else ("group",)
    latency = Family(
        "ddmq_end_to_end_seconds", HISTOGRAM,
        "Time from a message's produce time (the producer's clock) to its first delivery (stage=delivered) "
        "and to its ack (stage=acked), on Redis's clock as this proxy knows it.", (*labels, "stage"),
    )
    attempts = Family(
        "ddmq_message_attempts", HISTOGRAM,
        "Deliveries a message took, counted when it was acked or dead-lettered (outcome).", (*labels, "outcome"),
    )
    ahead = Family(
        "ddmq_end_to_end_clock_ahead", COUNTER,
        "End-to-end observations whose produce time was later than now (the producer's clock is ahead of "
        "Redis's; counted as 0 s).", labels,
    )
    for name, group in sorted(groups.items()):
        rows = sorted(group.buffer.end_to_end.items())
        if not rows:
            continue
        if per_queue:
            for topic, figures in rows:
                _add(latency, (name, topic, "delivered"), [figures.delivered])
                _add(latency, (name, topic, "acked"), [figures.acked])
                _add(attempts, (name, topic, "acked"), [figures.attempts_acked])
                _add(attempts, (name, topic, "dead_lettered"), [figures.attempts_dead])
                ahead.add_metric((name, topic), figures.ahead)
            continue
        every = [figures for _, figures in rows]
        _add(latency, (name, "delivered"), [figures.delivered for figures in every])
        _add(latency, (name, "acked"), [figures.acked for figures in every])
        _add(attempts, (name, "acked"), [figures.attempts_acked for figures in every])
        _add(attempts, (name, "dead_lettered"), [figures.attempts_dead for figures in every])
        ahead.add_metric((name,), sum(figures.ahead for figures in every))
    return [latency, attempts, ahead]


def _add(family: Family, labels: tuple[str, ...], parts: list[Distribution]) -> None:
    """The sum of ``parts`` (same bounds) as one histogram of ``family``, in its exported unit."""
    first = parts[0]
    counts = [sum(column) for column in zip(*(part.counts for part in parts), strict=True)]
    # Each part in the exported unit first: the same figure as the finer series' sum, to the last bit.
    total = sum(part.total / part.divisor for part in parts)
    family.add_histogram(labels, list(zip(first.les, accumulate(counts), strict=True)), total)


#: Tenants exported per (group, topic): those with the most messages here (tenant values are the
#: producers', unbounded; the console and ``ddmq status --http`` list as many).
TOP_TENANTS: Final = 20


def tenant_families(groups: dict[str, ConsumerGroup]) -> list[Family]:
    """Per (group, topic) with ``fair_key``: how many tenants have messages here, and for the
    :data:`TOP_TENANTS` with the most, their messages in memory, keys held in Redis for them and share
    of the window now (``tenant`` label, per topic in both modes: a tenant's share is of one topic's
    window). None of the families while no topic has tenants, so a proxy without them exports what it did."""
    labels = (*TOPIC_LABELS, "tenant")
    count = Family("ddmq_tenants", GAUGE, "Tenants (fair_key) with messages here, in memory or held in Redis.",
                   TOPIC_LABELS)
    in_memory = Family("ddmq_tenant_messages", GAUGE,
                       "A tenant's unfinished messages in memory (the top tenants by backlog).", labels)
    held = Family("ddmq_tenant_held_keys", GAUGE,
                  "Order keys whose messages wait in Redis behind the tenant's share.", labels)
    share = Family("ddmq_tenant_share", GAUGE,
                   "Most messages the tenant may hold in memory now: its weighted share of concurrency.", labels)
    for name, group in sorted(groups.items()):
        for topic, consumer in sorted(group.consumers.items()):
            tenants = consumer.jobs.tenants
            if tenants is None:
                continue
            count.add_metric((name, topic), len(tenants))
            for view in tenants.views(TOP_TENANTS):
                row = (name, topic, view.tenant)
                in_memory.add_metric(row, view.in_memory)
                held.add_metric(row, view.held_keys)
                share.add_metric(row, view.share)
    return [count, in_memory, held, share] if count.rows else []
