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

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtool.report.registry import METRICS, usable_blocks
from kvtool.serve_series import (
    _LE,
    DEFAULT_LABEL_LIMIT,
    DEFAULT_MAX_SERIES,
    EXPORTER_METRICS,
    HISTOGRAM_SOURCES,
    LABELS,
    NONE,
    OTHER,
    RESIDENCY_BUCKETS,
    ExporterMetric,
    Family,
    LabelFolder,
    _escape,
    _Hist,
    _number,
    _value,
    floatToGoString,
    histogram_samples,
    open_gaps,
    source_ledger,
)
from kvtool.text import printable
from kvtool.top import FEED_BUDGET_S, TopView

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from kvtool.recording.ledger import GapLedger
    from kvtool.report.feed import ReportFeed
    from kvtool.streams import Health, Source


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
            parts: dict[tuple[str, ...], tuple[float, float]] = {}
            present = False
            for key, row, _s in rows:
                v = _number(row, m)
                if v is None:
                    continue
                present = True
                if m.merge == "ratio":  # rows folded into one series: from their summed parts
                    num, whole = m.ratio_of
                    n, d = parts.get(key, (0.0, 0.0))
                    parts[key] = (n + _part(row, num), d + sum(_part(row, w) for w in whole))
                    agg[key] = round(parts[key][0] / parts[key][1], 6) if parts[key][1] else v
                    continue
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


def _part(row: Mapping[str, object], name: str) -> float:
    """A ratio's part in a report row (0 where it has none)."""
    v = row.get(name)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


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
    end = None if duration_s is None else start + duration_s
    next_snap = start + interval_s
    ended = False
    try:
        # Started inside the try: a signal the moment the recorder runs still stops it.
        source.start(start)
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
