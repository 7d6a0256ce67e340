"""``kvtool serve``: the report engine's numbers per kind as Prometheus metrics on /metrics.

The exporter computes nothing of its own about blocks. The same
:class:`kvtool.report.feed.ReportFeed` that ``kvtool top`` reads is fed the stream (live
through the recorder, with its gap recovery, or a recording played back); every interval
the report rows of each ``dp_rank`` are read
and turned into metric families whose names, types and help come from the one metric
registry (:mod:`kvtool.report.registry`), plus the exporter's own stream-health families
(:data:`EXPORTER_METRICS`, the one table of them). A counter therefore equals what
``kvtool report`` prints for the same events, up to the last snapshot.

The exposition text is rendered once per snapshot -- byte for byte what
``prometheus_client.generate_latest`` gives for the exporter's registry, but with each
bounded label set escaped once, not per sample -- and a scrape only sends those bytes (or
their gzip, compressed once): a scrape flood costs the stream nothing but the copying.
Label values are bounded: past ``label_limit`` values of one label, or ``max_series``
label sets, the rest fold into ``other`` (sums for counters and live blocks, the largest
for peaks) and a finding says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client.utils import floatToGoString as _go_float

from kvtool.report.registry import METRICS, Metric, PromType, usable_blocks
from kvtool.text import printable
from kvtool.top import FEED_BUDGET_S, TopView

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from prometheus_client.registry import CollectorRegistry

    from kvtool.recording.ledger import GapLedger
    from kvtool.report import ReportBuilder
    from kvtool.report.feed import ReportFeed
    from kvtool.report.snapshot import SecondsSnapshot
    from kvtool.streams import Health, Source

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


class Exporter:
    """The metrics of a :class:`kvtool.report.feed.ReportFeed`, as a prometheus_client collector.

    :meth:`update` takes a snapshot (report rows per rank, the source's health) and renders
    the exposition text once; :meth:`body` is what a scrape sends. The text is
    byte for byte what ``prometheus_client.generate_latest`` gives for :attr:`registry`
    (the tests check it), written with each label set's escaped labels kept (label sets are
    bounded and never change), so that 1,000 label sets render in tens of milliseconds.

    Args:
        label_limit: Values kept per label (the rest: ``other``).
        max_series: Label sets kept per family (the rest: ``other``).
        pool_blocks: The pool size in blocks of each rank (``--pool-blocks``), or None.
        on_finding: Called with each finding (a label limit reached).
    """

    def __init__(
        self,
        *,
        label_limit: int = DEFAULT_LABEL_LIMIT,
        max_series: int = DEFAULT_MAX_SERIES,
        pool_blocks: int | None = None,
        on_finding: Callable[[str], None] | None = None,
    ) -> None:
        from prometheus_client.registry import CollectorRegistry

        self.folder = LabelFolder(label_limit, max_series, on_finding)
        self.pool_blocks = pool_blocks
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=False)
        self.families: list[Family] = []
        self._hists: dict[tuple[int | None, str], _Hist] = {}
        self._served_hists: set[str] = set()
        self._generation = 0
        # Per (endpoint, rank) label pair: the state's keys, forgotten keys, horizon.
        self._state: dict[tuple[str, str], tuple[int, int, float | None]] = {}
        self._forgetting: set[int | None] = set()
        self._on_finding = on_finding
        self._labelstr: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, str]] = {}
        self._body = b""
        self._gz: tuple[bytes, bytes] | None = None
        self._gz_lock = threading.Lock()
        self.snapshots = 0
        self.render_s = 0.0
        self.registry.register(self)

    def collect(self) -> Iterator[Any]:
        """Yield the last snapshot as prometheus_client families (its Collector protocol).

        Yields:
            Metric families.
        """
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        for f in self.families:
            fam: Any
            if f.type == "histogram":
                fam = HistogramMetricFamily(f.name, f.help, labels=f.labels)
                for key, (counts, total) in f.series:
                    cum = np.cumsum(counts).tolist()
                    buckets = [(le, float(n)) for le, n in zip(_LE, cum, strict=True)]
                    fam.add_metric(list(key), buckets, total)
            else:
                cls = CounterMetricFamily if f.type == "counter" else GaugeMetricFamily
                fam = cls(f.name, f.help, labels=f.labels)
                for key, v in f.series:
                    fam.add_metric(list(key), v)
            yield fam

    def _finding(self, text: str) -> None:
        self.folder.findings.append(text)
        if self._on_finding is not None:
            self._on_finding(text)

    def body(self) -> bytes:
        """Return the exposition text of the last snapshot (what ``/metrics`` sends)."""
        return self._body

    def body_gzip(self) -> bytes:
        """Return :meth:`body` gzipped, compressed once per snapshot by the first scrape asking.

        Prometheus asks for gzip (``Accept-Encoding``); others get :meth:`body`.
        """
        import gzip

        with self._gz_lock:
            body = self._body
            if self._gz is None or self._gz[0] is not body:
                self._gz = (body, gzip.compress(body, compresslevel=1, mtime=0))
            return self._gz[1]

    def update(self, feed: ReportFeed, health: Health, ledger: GapLedger | None = None) -> None:
        """Take a snapshot of the feed and the source's health and render it.

        Args:
            feed: The report feed (fed by the caller, in this thread).
            health: The source's health now.
            ledger: The source's gap ledger as it stands (for the open gaps).
        """
        t0 = time.perf_counter()
        self.families = self._build(feed, health, ledger)
        self._body = self._render(self.families)
        self.snapshots += 1
        self.render_s = time.perf_counter() - t0

    # -- rendering ---------------------------------------------------------------------------

    def _labels(self, names: tuple[str, ...], key: tuple[str, ...]) -> tuple[str, str]:
        """The escaped label set, sorted by name, split where a bucket's ``le`` goes."""
        got = self._labelstr.get((names, key))
        if got is None:
            pairs = sorted(zip(names, key, strict=True))
            before = [f'{n}="{_escape(v)}"' for n, v in pairs if n < "le"]
            after = [f'{n}="{_escape(v)}"' for n, v in pairs if n >= "le"]
            got = self._labelstr[(names, key)] = (",".join(before), ",".join(after))
        return got

    def _render(self, families: Sequence[Family]) -> bytes:
        out: list[str] = []
        for f in families:
            name = f.name + ("_total" if f.type == "counter" else "")
            doc = f.help.replace("\\", r"\\").replace("\n", r"\n")
            out.append(f"# HELP {name} {doc}\n# TYPE {name} {f.type}\n")
            if f.type != "histogram":
                for key, v in f.series:
                    a, b = self._labels(f.labels, key)
                    lab = f"{{{a},{b}}}" if a and b else f"{{{a or b}}}" if a or b else ""
                    out.append(f"{name}{lab} {floatToGoString(v)}\n")
                continue
            for key, (counts, total) in f.series:
                a, b = self._labels(f.labels, key)
                pre = f'{name}_bucket{{{a + "," if a else ""}le="'
                post = f'",{b}}} ' if b else '"} '
                cum = np.cumsum(counts).tolist()
                out.extend(
                    f"{pre}{le}{post}{floatToGoString(float(n))}\n"
                    for le, n in zip(_LE, cum, strict=True)
                )
                lab = f"{{{a},{b}}}" if a and b else f"{{{a or b}}}" if a or b else ""
                out.append(f"{name}_count{lab} {floatToGoString(float(cum[-1]))}\n")
                out.append(f"{name}_sum{lab} {floatToGoString(total)}\n")
        return "".join(out).encode("utf-8")

    # -- building the families ---------------------------------------------------------------

    def _rows(
        self, feed: ReportFeed
    ) -> list[tuple[tuple[str, ...], Mapping[str, object], dict[str, tuple[Any, float]]]]:
        """(served label set, report row, histogram samples per family) of every rank x row."""
        endpoints: dict[int | None, set[str]] = {}
        for ref in feed.stats.channels.values():
            endpoints.setdefault(ref.info.dp_rank, set()).add(ref.info.endpoint)
        out: list[tuple[tuple[str, ...], Mapping[str, object], dict[str, tuple[Any, float]]]] = []
        from kvtool.report.snapshot import builder_samples

        state: set[tuple[str, str]] = set()
        # Rows that a re-feed may still re-attribute are held back, so that no served
        # counter goes down (README, serve); a re-feed's builders are new, so their
        # samples are taken afresh (the same samples for every row served before).
        held = feed.pending_groups()
        if feed.generation != self._generation:
            self._generation = feed.generation
            self._hists.clear()
        for rank, builder in sorted(
            feed.builders().items(), key=lambda kv: (kv[0] is None, kv[0] or 0)
        ):
            snap = builder_samples(builder)
            hists: dict[str, _Hist] = {}
            for fam, source in HISTOGRAM_SOURCES.items():
                h = self._hists.setdefault((rank, fam), _Hist())
                if h.update(snap.families.get(source)):
                    hists[fam] = h
                    self._served_hists.add(fam)
            # A channel with no rank of its own whose payloads carry one serves that rank.
            eps = endpoints.get(rank) or endpoints.get(None) or set()
            endpoint = printable(",".join(sorted(eps))) or NONE
            pair = (
                self.folder.value("endpoint", endpoint),
                self.folder.value("rank", _value(rank)),
            )
            old = self._state.get(pair, (0, 0, None))
            self._state[pair] = (
                old[0] + snap.keys if pair in state else snap.keys,
                old[1] + snap.forgotten if pair in state else snap.forgotten,
                snap.horizon_s,
            )
            state.add(pair)
            if snap.forgotten and rank not in self._forgetting:
                self._forgetting.add(rank)
                self._finding(
                    f"rank {_value(rank)}: recompute detection keeps a bounded number of keys "
                    "(--remember-keys) and forgot the oldest removed ones; a re-store of one "
                    "counts as a first store, not a recompute (kvtool_keys_forgotten_total, "
                    "kvtool_recompute_horizon_seconds)"
                )
            # The percentiles are served as histograms, from the samples: not computed.
            for row in builder.tables(quantiles=False)["by_group"].to_dicts():
                g, k, w = row.get("group_idx"), row.get("kind"), row.get("sliding_window")
                if g in held and k in (None, "unannotated"):
                    continue
                med = row.get("medium")
                key = (g, k, w, med) if "medium" in row else (g, k, w)
                gkey = snap.rows.get(key)  # type: ignore[arg-type]
                samples: dict[str, tuple[Any, float]] = {}
                for fam, h in hists.items():
                    got = None if gkey is None else h.get(gkey)
                    if got is not None:
                        samples[fam] = got
                values = (endpoint, _value(rank), _value(g), _value(k), _value(w), _value(med))
                out.append((self.folder.key(LABELS, values), row, samples))
        return out

    def _build(self, feed: ReportFeed, health: Health, ledger: GapLedger | None) -> list[Family]:
        rows = self._rows(feed)
        fams: list[Family] = []
        seen: set[str] = set()
        for m in METRICS:
            if m.prom == "none" or m.prom_name in seen:
                continue
            seen.add(m.prom_name)
            if m.prom == "histogram":
                if m.prom_name not in self._served_hists:
                    continue  # the engine does not keep these samples (yet): not served
                agg_h: dict[tuple[str, ...], tuple[Any, float]] = {}
                for key, _row, samples in rows:
                    got = samples.get(m.prom_name)
                    if got is None:
                        continue
                    c, s = got
                    old = agg_h.get(key)
                    agg_h[key] = (c, s) if old is None else (old[0] + c, old[1] + s)
                fams.append(Family(m.prom_name, "histogram", m.help, LABELS, list(agg_h.items())))
                continue
            agg: dict[tuple[str, ...], float] = {}
            present = False
            for key, row, _s in rows:
                v = _number(row, m)
                if v is None:
                    continue
                present = True
                old_v = agg.get(key)
                if old_v is None:
                    agg[key] = v
                elif m.merge == "max":
                    agg[key] = max(old_v, v)
                else:
                    agg[key] = old_v + v
            if not present and rows:
                continue  # the engine does not compute it (yet): not served
            fams.append(Family(m.prom_name, m.prom, m.help, LABELS, list(agg.items())))
        fams.extend(self._health(feed, health, ledger, rows))
        return fams

    def _health(
        self,
        feed: ReportFeed,
        health: Health,
        ledger: GapLedger | None,
        rows: Iterable[tuple[tuple[str, ...], Mapping[str, object], object]],
    ) -> Iterator[Family]:
        values: dict[str, float | None] = {
            "batches": health.batches,
            "gaps_recovered": health.gaps_recovered,
            "lost": health.lost,
            "restarts": health.restarts,
            "last_batch_age_s": health.last_batch_age_s,
            "open_gaps": open_gaps(ledger),
            "publishers": health.publishers,
            "connected": health.connected,
            "done": 1.0 if health.done else 0.0,
        }
        for em in EXPORTER_METRICS:
            fam = Family(em.prom_name, em.prom, em.help, em.labels)
            if em.name == "decode_errors":
                fam.series.append((("batch",), float(feed.stats.bad_batches)))
                fam.series.append((("event",), float(feed.stats.skipped_events)))
            elif em.name == "pool_occupancy":
                if not self.pool_blocks:
                    continue
                live: dict[tuple[str, ...], float] = {}
                for key, row, _s in rows:
                    v = row.get("live_blocks_end")
                    k2 = (key[0], key[1])
                    live[k2] = live.get(k2, 0.0) + (float(v) if isinstance(v, int) else 0.0)
                usable = usable_blocks(self.pool_blocks)
                fam.series.extend((k, n / usable) for k, n in live.items())
            elif em.name in ("state_keys", "keys_forgotten", "recompute_horizon"):
                for pair, (keys, forgotten, horizon) in self._state.items():
                    v = (keys, forgotten, horizon)[
                        ("state_keys", "keys_forgotten", "recompute_horizon").index(em.name)
                    ]
                    if v is not None:
                        fam.series.append((pair, float(v)))
            elif em.name == "label_limit_reached":
                fam.series.extend(((label,), 1.0) for label in self.folder.reached)
            else:
                v = values.get(em.name)
                if v is None:
                    continue
                fam.series.append(((), float(v)))
            yield fam


# -- the loops -------------------------------------------------------------------------------


@dataclass
class ExportingView(TopView):
    """``kvtool top --metrics``: the view, whose every tick also snapshots into ``exporter``.

    Args:
        exporter: Where snapshots go (None: none).
    """

    exporter: Exporter | None = None

    def tick(self, now: float) -> None:
        """Feed what arrived, update the view (unless paused) and the exporter.

        Args:
            now: Monotonic seconds.
        """
        health, ledger = self.source.health(), source_ledger(self.source)
        super().tick(now)
        if self.exporter is not None:
            self.exporter.update(self.feed, _fed(health, self.feed), ledger)


def warm_up() -> None:
    """Load the decoder's and the state kernel's compiled code, and polars', before a stream.

    numba loads a cached kernel on its first call (~0.7 s, more on a cold cache): done on
    the first batches of a max-speed burst, that is lag the stream waits through. A
    throwaway feed is fed a store, a remove and a clear (nothing of it is served).
    """
    import msgspec

    from kvtool.recording.reader import ChannelInfo, RecordedMessage
    from kvtool.report.feed import ReportFeed

    chan = ChannelInfo(0, "warm-up", "warm-up", "", 0)
    events = [
        {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
         "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
         "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU", "group_idx": 0},
        {"type": "AllBlocksCleared"},
    ]  # fmt: skip
    data = msgspec.msgpack.encode([1.0, events, 0])
    feed = ReportFeed(whole_stream=False)
    feed.add([RecordedMessage(chan, 0, 1_000_000_000, 1_000_000_000, data, 0)])
    from kvtool.streams import Health

    Exporter().update(feed, Health(), None)


def run_serve(
    source: Source,
    feed: ReportFeed,
    exporter: Exporter,
    *,
    interval_s: float = 1.0,
    duration_s: float | None = None,
    exit_at_end: bool = False,
    stop: threading.Event | None = None,
) -> None:
    """Feed the source into the report feed and snapshot it into ``exporter`` every interval.

    Runs until ``duration_s``, ``stop`` is set, a live source fails, or (``exit_at_end``)
    the source ends; a recording that ended keeps being served otherwise. The source is
    stopped on the way out (a ``--record`` file closed); its error, if any, is raised then.

    Args:
        source: A :class:`kvtool.streams.LiveSource` or :class:`kvtool.streams.RecordingSource`
            (not started).
        feed: The report feed.
        exporter: Where snapshots go.
        interval_s: Seconds between snapshots.
        duration_s: Stop after this long (None: never on its own).
        exit_at_end: Return once the source has ended and its last snapshot is taken.
        stop: Set to stop.
    """
    start = time.monotonic()
    exporter.update(feed, source.health(), source_ledger(source))
    source.start(start)
    end = None if duration_s is None else start + duration_s
    next_snap = start + interval_s
    ended = False
    try:
        while stop is None or not stop.is_set():
            now = time.monotonic()
            done = source.done
            if (done and not ended) or now >= next_snap:
                # The health is read before the batches are taken: every batch it counts
                # is in the feed by the snapshot (a live recorder goes on meanwhile).
                health, ledger = source.health(), source_ledger(source)
                _feed(source, feed, None if done else now + FEED_BUDGET_S)
                if done:
                    feed.finish()  # rows held back for re-attribution are final now
                exporter.update(feed, _fed(health, feed), ledger)
                next_snap = now + interval_s
                ended = done
            elif not ended:
                _feed(source, feed, now + FEED_BUDGET_S)
            if ended and (exit_at_end or source.error is not None):
                return
            if end is not None and now >= end:
                return
            wait = min(0.05, max(0.0, next_snap - now))
            if stop is not None:
                stop.wait(wait)
            else:
                time.sleep(wait)
    finally:
        source.stop()
        health, ledger = source.health(), source_ledger(source)
        _feed(source, feed, None)  # what the recorder wrote while stopping, all of it
        feed.finish()
        exporter.update(feed, _fed(health, feed), ledger)


def _fed(health: Health, feed: ReportFeed) -> Health:
    """The health as of what the feed holds: batches received counts only batches fed.

    Under a flood the feed lags the recorder by a bounded backlog; a snapshot whose
    ``batches_received`` counted batches its block counters do not hold yet would not add
    up (the counters equal ``kvtool report`` of the first ``batches_received`` batches).
    """
    return dataclasses.replace(health, batches=min(health.batches, feed.stats.messages))


def _feed(source: Source, feed: ReportFeed, until: float | None) -> None:
    """Feed what the source holds, chunk by chunk (a source hands out bounded chunks).

    Args:
        source: The source.
        feed: The report feed.
        until: Stop at this monotonic time even with a backlog (a flood: the next snapshot
            takes the rest); None: until nothing is left (the source has ended).
    """
    while True:
        msgs = source.take(time.monotonic())
        if msgs:
            feed.add(msgs)
        if not msgs or not source.backlog:
            return
        if until is not None and time.monotonic() >= until:
            return


__all__ = [
    "EXPORTER_METRICS",
    "HISTOGRAM_SOURCES",
    "LABELS",
    "OTHER",
    "RESIDENCY_BUCKETS",
    "Exporter",
    "ExporterMetric",
    "ExportingView",
    "Family",
    "LabelFolder",
    "histogram_samples",
    "open_gaps",
    "run_serve",
    "source_ledger",
    "warm_up",
]
