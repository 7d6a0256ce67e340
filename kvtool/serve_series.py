"""The series ``kvtool serve`` exports: its own metric table, label folding, lifetime histograms.

:class:`kvtool.serve.Exporter` reads the report metrics from the one registry
(:mod:`kvtool.report.registry`) and its own stream-health families from
:data:`EXPORTER_METRICS` here; label values past the limits fold into ``other``
(:class:`LabelFolder`), and the lifetime histograms are kept per label set (:class:`_Hist`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client.utils import floatToGoString as _go_float

from kvtool.report.registry import Metric, PromType
from kvtool.text import printable

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from kvtool.recording.ledger import GapLedger
    from kvtool.report import ReportBuilder
    from kvtool.report.snapshot import SecondsSnapshot

LABELS = ("endpoint", "rank", "group", "kind", "sliding_window", "medium")
"""The labels of every per-row family, coarsest first. ``medium`` is the events' own
(``GPU``, ``CPU`` ...; ``none`` when absent): the report rows of a rank are keyed by it too
(:class:`kvtool.report.ReportBuilder` ``by_medium``), over the one live-block state, so
the rows of a (group, kind, window) add up to its ``kvtool report`` row. That state is
keyed by (channel, group, hash) as report's: a block live in two media at once (a GPU copy
and its CPU offload) is one key with two copies, and a remove takes the oldest copy
whichever medium it names, so per-medium live blocks are exact only for keys live in one
medium at a time (their sum always is)."""

OTHER = "other"
"""The label value that label values past the limit fold into."""

NONE = "none"
"""The label value of an absent key (no ``dp_rank``, no ``group_idx``, no window)."""

DEFAULT_LABEL_LIMIT = 256
DEFAULT_MAX_SERIES = 2000

RESIDENCY_BUCKETS: tuple[float, ...] = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
)  # fmt: skip
"""vLLM's KV-cache residency buckets (``vllm:kv_block_lifetime_seconds``), seconds."""


@dataclass(frozen=True)
class ExporterMetric:
    """One family the exporter serves that is not a report metric (stream health and such).

    Attributes:
        name: What it is read from (a :class:`kvtool.streams.Health` field or an exporter key).
        prom: The Prometheus type.
        prom_name: The family name (counters without ``_total``: prometheus_client adds it).
        help: One line of help.
        labels: Its labels.
    """

    name: str
    prom: PromType
    prom_name: str
    help: str
    labels: tuple[str, ...] = ()


EXPORTER_METRICS: tuple[ExporterMetric, ...] = (
    ExporterMetric("batches", "counter", "kvtool_batches_received",
                   "Batches received (live or recovered over replay)."),
    ExporterMetric("gaps_recovered", "counter", "kvtool_batches_recovered",
                   "Missing batches recovered over the replay socket."),
    ExporterMetric("lost", "counter", "kvtool_batches_lost",
                   "Batches lost for good (neither received nor recovered)."),
    ExporterMetric("restarts", "counter", "kvtool_publisher_restarts",
                   "Publisher restarts seen (seq went back to the start)."),
    ExporterMetric("decode_errors", "counter", "kvtool_decode_errors",
                   "Payloads or events that did not decode, by reason (batch, event).",
                   ("reason",)),
    ExporterMetric("last_batch_age_s", "gauge", "kvtool_seconds_since_last_batch",
                   "Seconds since the last batch arrived (absent before the first)."),
    ExporterMetric("open_gaps", "gauge", "kvtool_open_gaps",
                   "Gaps in the gap ledger neither recovered nor lost yet."),
    ExporterMetric("publishers", "gauge", "kvtool_publishers",
                   "Publishers subscribed to (a recording: its channels)."),
    ExporterMetric("connected", "gauge", "kvtool_publishers_connected",
                   "Publishers connected now (a recording: channels seen so far)."),
    ExporterMetric("done", "gauge", "kvtool_source_done",
                   "1 once the source ended (end of the recording, or the recorder stopped)."),
    ExporterMetric("pool_occupancy", "gauge", "kvtool_pool_occupancy_ratio",
                   "Live blocks of a rank over its pool size (--pool-blocks).",
                   ("endpoint", "rank")),
    ExporterMetric("state_keys", "gauge", "kvtool_state_keys",
                   "Keys the report state of a rank holds (live, and gone but remembered "
                   "for recompute detection).", ("endpoint", "rank")),
    ExporterMetric("keys_forgotten", "counter", "kvtool_keys_forgotten",
                   "Gone keys recompute detection forgot (past --remember-keys): a re-store "
                   "of one counts as a first store, not a recompute.", ("endpoint", "rank")),
    ExporterMetric("recompute_horizon", "gauge", "kvtool_recompute_horizon_seconds",
                   "Seconds of the stream back to the oldest removal recompute detection "
                   "still remembers (the whole stream while nothing is forgotten).",
                   ("endpoint", "rank")),
    ExporterMetric("label_limit_reached", "gauge", "kvtool_label_limit_reached",
                   "1 when values of this label fold into 'other' (past --label-limit).",
                   ("label",)),
)  # fmt: skip
"""The exporter's own families: the one table of them (the report's are in the registry)."""

EXPORTER_BY_NAME = {m.name: m for m in EXPORTER_METRICS}

HISTOGRAM_SOURCES: dict[str, str] = {
    "kvtool_block_lifetime_seconds": "lifetime_s",
    "kvtool_recompute_gap_seconds": "recompute_gap_s",
}
"""Per histogram family, the report builder's sample family it is read from
(:data:`kvtool.report.snapshot.SAMPLE_FAMILIES`)."""


def histogram_samples(builder: ReportBuilder, family: str) -> SecondsSnapshot | None:
    """Return a builder's samples of a histogram family (its public snapshot).

    Args:
        builder: A :class:`kvtool.report.ReportBuilder`.
        family: A key of :data:`HISTOGRAM_SOURCES`.

    Returns:
        The samples, or None when the engine keeps none of this family.
    """
    from kvtool.report.snapshot import builder_samples

    return builder_samples(builder).families.get(HISTOGRAM_SOURCES[family])


# -- label folding ---------------------------------------------------------------------------


class LabelFolder:
    """Bounds label values: past the limits, values and label sets fold into ``other``.

    The first ``label_limit`` values of each label are kept, later ones become ``other``;
    past ``max_series`` label sets, new ones fold into all-``other``. Which value
    is kept never changes once decided, so a folded counter only ever grows.

    Args:
        label_limit: Values kept per label.
        max_series: Label sets kept.
        on_finding: Called once per label (and once for the series limit) with a finding.
    """

    def __init__(
        self,
        label_limit: int = DEFAULT_LABEL_LIMIT,
        max_series: int = DEFAULT_MAX_SERIES,
        on_finding: Callable[[str], None] | None = None,
    ) -> None:
        self.label_limit = max(1, label_limit)
        self.max_series = max(1, max_series)
        self._kept: dict[str, dict[str, None]] = {}
        self._series: dict[tuple[str, ...], None] = {}
        self.reached: dict[str, None] = {}
        self.findings: list[str] = []
        self._on_finding = on_finding

    def _note(self, key: str, text: str) -> None:
        if key in self.reached:
            return
        self.reached[key] = None
        self.findings.append(text)
        if self._on_finding is not None:
            self._on_finding(text)

    def value(self, label: str, value: str) -> str:
        """Return the value served for ``value`` of ``label`` (itself, or ``other``)."""
        kept = self._kept.setdefault(label, {})
        if value in kept:
            return value
        if len(kept) < self.label_limit:
            kept[value] = None
            return value
        self._note(
            label,
            f"label {label}: more than {self.label_limit} values; the rest are served as "
            f"{OTHER!r} (--label-limit)",
        )
        return OTHER

    def key(self, labels: Sequence[str], values: Sequence[str]) -> tuple[str, ...]:
        """Return the label set served for ``values`` (one per name in ``labels``)."""
        key = tuple(self.value(n, v) for n, v in zip(labels, values, strict=True))
        if key in self._series:
            return key
        if len(self._series) < self.max_series:
            self._series[key] = None
            return key
        self._note(
            "series",
            f"more than {self.max_series} label sets; the rest are served as {OTHER!r} "
            "(--max-series)",
        )
        return tuple(OTHER for _ in labels)


# -- histograms from a builder's lifetimes ------------------------------------------------------


_EDGES = np.asarray(RESIDENCY_BUCKETS, dtype=np.float64)
_NB = len(RESIDENCY_BUCKETS) + 1  # the last is +Inf


@dataclass
class _Hist:
    """Bucket counts per gkey of one builder's samples of one histogram family."""

    counts: NDArray[Any] = field(default_factory=lambda: np.zeros((0, _NB), dtype=np.int64))
    sums: NDArray[Any] = field(default_factory=lambda: np.zeros(0, dtype=np.float64))
    frames_done: int = 0

    def _grow(self, n: int) -> None:
        if n > len(self.counts):
            extra = n - len(self.counts)
            self.counts = np.vstack([self.counts, np.zeros((extra, _NB), dtype=np.int64)])
            self.sums = np.concatenate([self.sums, np.zeros(extra)])

    def _add(self, gkey: NDArray[Any], values: NDArray[Any], weight: NDArray[Any]) -> None:
        if len(gkey) == 0:
            return
        self._grow(int(gkey.max()) + 1)
        idx = np.searchsorted(_EDGES, values, side="left")  # bucket i: value <= le_i
        flat = np.bincount(gkey * _NB + idx, weights=weight, minlength=len(self.counts) * _NB)
        self.counts += flat.reshape(-1, _NB).astype(np.int64)
        self.sums += np.bincount(gkey, weights=values * weight, minlength=len(self.sums))

    def update(self, got: SecondsSnapshot | None) -> bool:
        """Take a builder's new samples; return False when it keeps none of this family."""
        if got is None:
            return False
        if got.binned is not None:
            # Past the exact limit the engine keeps a log histogram of every sample: the
            # buckets are taken again from its bin centres, never below what was served.
            gkey, v, n = got.binned
            old_c, old_s = self.counts, self.sums
            self.counts = np.zeros((0, _NB), dtype=np.int64)
            self.sums = np.zeros(0)
            self._add(gkey.astype(np.int64), v, n.astype(np.float64))
            self._grow(len(old_c))
            # Never below what was served, on the cumulative counts (what a histogram's
            # buckets are): a per-bucket maximum of two binnings counted samples near an
            # edge twice and made _count exceed the samples.
            n_old = len(old_c)
            cum = np.maximum(np.cumsum(self.counts[:n_old], axis=1), np.cumsum(old_c, axis=1))
            self.counts[:n_old] = np.diff(cum, axis=1, prepend=0)
            self.sums[: len(old_s)] = np.maximum(self.sums[: len(old_s)], old_s)
            self.frames_done = 0
            return True
        for gk, vals in got.exact[self.frames_done :]:
            self._add(
                np.asarray(gk, dtype=np.int64),
                np.asarray(vals, dtype=np.float64),
                np.ones(len(vals)),
            )
        self.frames_done = len(got.exact)
        return True

    def get(self, gkey: int) -> tuple[NDArray[Any], float] | None:
        """Return (per-bucket counts, sum) of a gkey, or None without samples."""
        if gkey >= len(self.counts):
            return None
        return self.counts[gkey], float(self.sums[gkey])


# -- the exporter -------------------------------------------------------------------------------


def _value(v: object) -> str:
    return NONE if v is None else printable(v)


def _number(row: Mapping[str, object], m: Metric) -> float | None:
    for name in (m.name, *m.aliases):
        v = row.get(name)
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            return float(v)
    return None


def open_gaps(ledger: GapLedger | None) -> int:
    """Return the gaps of a gap ledger not settled yet (neither all recovered nor lost).

    Args:
        ledger: The ledger (None: no gaps).

    Returns:
        How many.
    """
    if ledger is None:
        return 0
    n = 0
    for ch in ledger.channels:
        for g in ch.gaps:
            lost = sum(b - a + 1 for a, b in g.lost_ranges)
            if g.last is None or g.recovered + lost < g.last - g.first + 1:
                n += 1
    return n


def source_ledger(source: object) -> GapLedger | None:
    """Return a source's gap ledger as it stands (a recorder's live one, a recording's own).

    Args:
        source: A :class:`kvtool.streams.LiveSource` or :class:`kvtool.streams.RecordingSource`.

    Returns:
        The ledger, or None.
    """
    recorder = getattr(source, "recorder", None)
    if recorder is not None:
        # Read from another thread while the recorder runs: a channel added meanwhile
        # changes the dict under the iteration; the next snapshot reads it again.
        with contextlib.suppress(RuntimeError):
            ledger: GapLedger = recorder.ledger()
            return ledger
        return None
    return getattr(source, "gap_ledger", None)


@dataclass
class Family:
    """One metric family of a snapshot, before rendering.

    Attributes:
        name: The family name (a counter's without ``_total``).
        type: ``counter``, ``gauge`` or ``histogram``.
        help: Its help line.
        labels: Its label names.
        series: (label values, value) per label set; a histogram's value is (counts per
            bucket of :data:`RESIDENCY_BUCKETS` and +Inf, not cumulative; sum).
    """

    name: str
    type: str
    help: str
    labels: tuple[str, ...]
    series: list[tuple[tuple[str, ...], Any]] = field(default_factory=list)


floatToGoString: Callable[[float], str] = _go_float
"""prometheus_client's rendering of a sample value (``+Inf``, ``1e+06``, ``3.0``)."""


def _escape(value: str) -> str:
    # The text format's label-value escaping (what prometheus_client's generate_latest does).
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


_LE = (*(floatToGoString(b) for b in RESIDENCY_BUCKETS), "+Inf")
