"""Family, and render(): the engine's metric families, written in Prometheus' text format directly.

prometheus-client's families keep each series as a ``Sample`` whose labels are a dict, and
``generate_latest`` sorts and escapes every sample's labels as it writes it. That is fine for a few
hundred series and takes most of a scrape at tens of thousands (a proxy serving a thousand
(group, topic) pairs). A :class:`Family` keeps a series as a tuple of label values; :func:`render`
writes the label string of a tuple once per scrape, however many families share it, and the text is
byte for byte what ``generate_latest`` writes for :meth:`Family.metric` (the same family as a
prometheus-client one, which ``EngineCollector.collect`` yields for anything that reads the registry;
a test holds the two outputs equal).

>>> lag = Family("ddmq_lag_messages", GAUGE, "Produced but unfinished.", ["group", "topic"])
>>> lag.add_metric(["g", "t"], 3)
>>> print(render([lag]), end="")
# HELP ddmq_lag_messages Produced but unfinished.
# TYPE ddmq_lag_messages gauge
ddmq_lag_messages{group="g",topic="t"} 3.0
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

COUNTER: Final = "counter"
GAUGE: Final = "gauge"
HISTOGRAM: Final = "histogram"
#: A histogram of a gauge (the key chains' lengths now): ``_gcount`` / ``_gsum`` instead of ``_count`` / ``_sum``.
GAUGE_HISTOGRAM: Final = "gaugehistogram"

Buckets = list[tuple[str, float]]


class Family:
    """One metric family: its series as label-value tuples, added as prometheus-client's are."""

    __slots__ = ("documentation", "histograms", "kind", "labels", "name", "rows")

    def __init__(self, name: str, kind: str, documentation: str, labels: Sequence[str] = ()) -> None:
        if kind not in (COUNTER, GAUGE, HISTOGRAM, GAUGE_HISTOGRAM):
            raise ValueError(f"unknown metric kind {kind!r}")
        self.name, self.kind, self.documentation, self.labels = name, kind, documentation, tuple(labels)
        #: (label values, value): a counter's or a gauge's series.
        self.rows: list[tuple[tuple[str, ...], float]] = []
        #: (label values, cumulative ``(le, count)`` buckets ending with ``+Inf``, sum): a histogram's.
        self.histograms: list[tuple[tuple[str, ...], Buckets, float]] = []

    def add_metric(self, values: Sequence[str], value: float) -> None:
        self.rows.append((values if type(values) is tuple else tuple(values), value))

    def add_histogram(self, values: Sequence[str], buckets: Buckets, total: float) -> None:
        self.histograms.append((values if type(values) is tuple else tuple(values), buckets, total))

    def metric(self) -> Metric:
        """The same family as a prometheus-client one."""
        labels = list(self.labels)
        if self.kind in (COUNTER, GAUGE):
            family: CounterMetricFamily | GaugeMetricFamily = (
                CounterMetricFamily(self.name, self.documentation, labels=labels) if self.kind == COUNTER
                else GaugeMetricFamily(self.name, self.documentation, labels=labels)
            )
            for values, value in self.rows:
                family.add_metric(values, value)
            return family
        if self.kind == HISTOGRAM:
            histogram = HistogramMetricFamily(self.name, self.documentation, labels=labels)
            for values, buckets, total in self.histograms:
                histogram.add_metric(values, buckets, total)
            return histogram
        gauge_histogram = GaugeHistogramMetricFamily(self.name, self.documentation, labels=labels)
        for values, buckets, total in self.histograms:
            gauge_histogram.add_metric(values, buckets, total)
        return gauge_histogram


def _number(value: float) -> str:
    """``value`` as prometheus-client's ``floatToGoString`` writes it (Go's formatting); counts, the
    common case, without going through a float's repr."""
    if type(value) is int and -10**15 < value < 1_000_000:
        return f"{value}.0"
    number = float(value)
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    if math.isnan(number):
        return "NaN"
    text = repr(number)
    dot = text.find(".")
    if number > 0 and dot > 6:  # Go switches to an exponent from 1e6 on
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


class _LabelStrings:
    """``name="value"`` lists by label names and values, made once per scrape: a thousand (group,
    topic) pairs each appear in some twenty families."""

    def __init__(self) -> None:
        self._made: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}

    def pairs(self, names: tuple[str, ...], values: tuple[str, ...]) -> list[str]:
        """The pairs sorted by label name, as prometheus-client writes them."""
        key = (names, values)
        made = self._made.get(key)
        if made is None:
            pairs = sorted(zip(names, values, strict=True))
            made = self._made[key] = [f'{name}="{_escape(value)}"' for name, value in pairs]
        return made

    def braces(self, names: tuple[str, ...], values: tuple[str, ...]) -> str:
        return "{" + ",".join(self.pairs(names, values)) + "}" if names else ""


def render(families: Iterable[Family]) -> str:
    """The families in Prometheus' text format (version 0.0.4), as ``generate_latest`` writes them."""
    out: list[str] = []
    labels = _LabelStrings()
    for family in families:
        name = family.name + "_total" if family.kind == COUNTER else family.name
        kind = HISTOGRAM if family.kind == GAUGE_HISTOGRAM else family.kind
        doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for values, value in family.rows:
            out.append(f"{name}{labels.braces(family.labels, values)} {_number(value)}\n")
        if family.histograms:
            _histograms(family, labels, out, doc)
    return "".join(out)


def _histograms(family: Family, labels: _LabelStrings, out: list[str], doc: str) -> None:
    name, names = family.name, family.labels
    at = sum(1 for label in names if label < "le")  # where ``le`` goes among the sorted label names
    gauge = family.kind == GAUGE_HISTOGRAM
    les: dict[str, str] = {}
    counts: list[str] = []
    sums: list[str] = []
    for values, buckets, total in family.histograms:
        pairs = labels.pairs(names, values)
        head = f"{name}_bucket{{" + "".join(f"{pair}," for pair in pairs[:at])
        tail = "".join(f",{pair}" for pair in pairs[at:]) + "} "
        for le, count in buckets:
            le_pair = les.get(le)
            if le_pair is None:
                le_pair = les[le] = f'le="{_escape(le)}"'
            out.append(f"{head}{le_pair}{tail}{_number(count)}\n")
        braces = labels.braces(names, values)
        count_line = f"{name}_{'gcount' if gauge else 'count'}{braces} {_number(buckets[-1][1])}\n"
        sum_line = f"{name}_{'gsum' if gauge else 'sum'}{braces} {_number(total)}\n"
        if gauge:  # prometheus-client writes a gauge histogram's count and sum as two gauges after it
            counts.append(count_line)
            sums.append(sum_line)
        elif float(buckets[0][0]) >= 0:  # as prometheus-client: no count and sum with a negative bucket
            out += (count_line, sum_line)
    for suffix, lines in (("_gcount", counts), ("_gsum", sums)):
        if lines:
            out.append(f"# HELP {name}{suffix} {doc}\n# TYPE {name}{suffix} gauge\n")
            out += lines
