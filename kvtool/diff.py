"""Compare two reports (two recordings, or two sets of them) metric by metric.

Each side is one :func:`kvtool.report.build_report` (the numbers are the ones two ``kvtool
report`` runs print); rows are matched by their key (``kind``; ``sliding_window``;
``group_idx``, ``kind`` and ``sliding_window``), and every metric of DESIGN.md gets the value
on each side, the delta ``b - a`` and the relative change ``(b - a) / a``. A row present on one
side only is kept, flagged ``a_only``/``b_only``; its counts on the missing side are taken as 0
(the kind stored and removed nothing there) and its lifetimes as absent. Changes are ordered
largest first: by the size of the relative change (a count that grows from 0 counts as
infinite), then of the delta.

JSON schema of :meth:`Diff.to_dict` (``kvtool diff --format json``), version
``kvtool.diff/1``::

    {
      "schema": "kvtool.diff/1",
      "by": "kind" | "window" | "group",
      "a": SIDE, "b": SIDE,
      "changed": bool,          # some metric of some row (or of the totals) differs
      "failed": bool,           # some --fail-on threshold was crossed
      "totals": ROW,
      "rows": [ROW, ...],       # the --by table, largest change first
      "fail_on": [CHECK, ...]
    }
    SIDE  = {"recordings": [str], "batches": int, "events": int,
             "group_metadata": [str], "damaged": bool, "findings": [str]}
    ROW   = {"key": {KEY: value}, "label": str,
             "presence": "both" | "a_only" | "b_only", "changed": bool,
             "verdict": str,           # one line
             "metrics": [METRIC, ...]} # every report metric, largest change first
    KEY   = "kind" (str) | "sliding_window" (int or null) | "group_idx" (int or null);
            a group row's key has all three, the totals' key is {}
    METRIC = {"metric": str, "a": number | null, "b": number | null,
              "delta": number | null,      # b - a; null when a side has no value
              "rel_change": number | null, # (b - a) / a as a fraction (0.1 = +10 %);
                                           # null when a is 0 or null
              "changed": bool,
              "worse": bool}               # changed in the direction the metric
                                           # registry calls worse (e.g. more evictions)
    CHECK = {"expr": str, "crossed": bool, "matched_rows": int,
             "hits": [{"key": {...}, "label": str, "metric": str, "a": .., "b": ..,
                       "delta": .., "rel_change": ..}]}

``--fail-on`` expressions (:func:`parse_fail_on`)::

    METRIC[{FILTER[,FILTER...]}]:THRESHOLD
    FILTER    = kind=NAME | window=N|none | group=N|none     (NAME, N or * for every row)
    THRESHOLD = [+|-]NUMBER[%]

``+`` is crossed when the metric rises by more than the threshold, ``-`` when it falls by
more, no sign when it moves by more either way; ``%`` makes the threshold relative to A's
value, otherwise it is in the metric's own unit (blocks, events, tokens, seconds). Without a
filter the threshold applies to the totals; ``kind=`` alone to the by-kind rows, ``window=``
alone to the by-window rows, anything else to the by-group rows. A rise from 0 crosses every
``+`` or unsigned percentage; a lifetime with no value on one side crosses nothing.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

from kvtool.errors import UsageError
from kvtool.report.names import ALIASES, COLUMNS, COUNT_COLUMNS, LIFETIME_COLUMNS
from kvtool.report.registry import BY_NAME, SHORT_LABELS

if TYPE_CHECKING:
    from kvtool.report import Report

SCHEMA = "kvtool.diff/1"
"""The ``schema`` value of the JSON output; bumped on an incompatible change."""

# The report's own column lists (DESIGN.md's names and order, from the metric registry).
COUNT_METRICS = COUNT_COLUMNS
LIFETIME_METRICS = LIFETIME_COLUMNS
METRICS = COLUMNS
"""The metrics compared, in DESIGN.md's names and order (:mod:`kvtool.report.registry`)."""

_BY_SHORT = {short: name for name, short in SHORT_LABELS.items()}
"""Metric names by their registry short label (``--fail-on`` takes either)."""

BY = ("kind", "window", "group")
"""The tables ``--by`` can show."""

_TABLE = {"kind": "by_kind", "window": "by_window", "group": "by_group"}
_KEYS: dict[str, tuple[str, ...]] = {
    "kind": ("kind",),
    "window": ("sliding_window",),
    "group": ("group_idx", "kind", "sliding_window"),
}
_SPECIAL_KINDS = ("unannotated", "unattributed")

Presence = Literal["both", "a_only", "b_only"]
Number = int | float
KeyValue = str | int | None


@dataclass(frozen=True)
class MetricDelta:
    """One metric of one row on both sides.

    Attributes:
        metric: The report column.
        a: Its value in A (None: no value, e.g. no lifetime).
        b: Its value in B.
        delta: ``b - a``, or None when a side has no value.
        rel_change: ``(b - a) / a`` as a fraction; ``inf`` when a is 0 and b is not;
            None when a side has no value.
        changed: The two values differ.
    """

    metric: str
    a: Number | None
    b: Number | None
    delta: Number | None
    rel_change: float | None
    changed: bool

    @property
    def worse(self) -> bool:
        """The value moved the way the metric registry calls worse (``worse`` up/down)."""
        if self.delta is None or self.delta == 0:
            return False
        way = BY_NAME[self.metric].worse
        return (way == "up" and self.delta > 0) or (way == "down" and self.delta < 0)

    @property
    def magnitude(self) -> float:
        """How large the change is, for ordering: |relative change|, inf from 0 or None."""
        if not self.changed:
            return 0.0
        if self.rel_change is None:
            return math.inf
        return abs(self.rel_change)

    def to_dict(self) -> dict[str, object]:
        """Return the JSON form (``rel_change`` null when infinite).

        Returns:
            The ``METRIC`` object of the module's schema.
        """
        rel = self.rel_change
        return {
            "metric": self.metric,
            "a": self.a,
            "b": self.b,
            "delta": self.delta,
            "rel_change": rel if rel is not None and math.isfinite(rel) else None,
            "changed": self.changed,
            "worse": self.worse,
        }


@dataclass(frozen=True)
class RowDiff:
    """One row (a kind, a window, a group, or the totals) on both sides.

    Attributes:
        key: The row's key columns (empty for the totals).
        label: A short name for people, e.g. ``sliding_window`` or ``window 64``.
        presence: ``both``, ``a_only`` or ``b_only``.
        metrics: Every metric, largest change first.
    """

    key: Mapping[str, KeyValue]
    label: str
    presence: Presence
    metrics: tuple[MetricDelta, ...]

    @property
    def changed(self) -> bool:
        """Some metric differs (a one-sided row always counts as changed)."""
        return self.presence != "both" or any(m.changed for m in self.metrics)

    @property
    def changes(self) -> tuple[MetricDelta, ...]:
        """The metrics that differ, largest first."""
        return tuple(m for m in self.metrics if m.changed)

    @property
    def magnitude(self) -> float:
        """The largest change's magnitude (inf for a one-sided row)."""
        if self.presence != "both":
            return math.inf
        return max((m.magnitude for m in self.metrics), default=0.0)

    @property
    def verdict(self) -> str:
        """One line saying what changed in this row."""
        if self.presence != "both":
            side = "A" if self.presence == "a_only" else "B"
            vals = {m.metric: (m.a if side == "A" else m.b) for m in self.metrics}
            return (
                f"{self.label}: only in {side} ({format_number(vals['blocks_stored'])} blocks "
                f"stored, {format_number(vals['blocks_removed'])} removed)"
            )
        changes = self.changes
        if not changes:
            return f"{self.label}: no change"
        top = changes[0]
        return (
            f"{self.label}: {len(changes)} of {len(self.metrics)} metrics changed; largest "
            f"{top.metric} {format_rel(top)} ({format_number(top.a)} -> "
            f"{format_number(top.b)})"
        )

    def to_dict(self) -> dict[str, object]:
        """Return the JSON form.

        Returns:
            The ``ROW`` object of the module's schema.
        """
        return {
            "key": dict(self.key),
            "label": self.label,
            "presence": self.presence,
            "changed": self.changed,
            "verdict": self.verdict,
            "metrics": [m.to_dict() for m in self.metrics],
        }


@dataclass(frozen=True)
class FailOn:
    """A parsed ``--fail-on`` expression.

    Attributes:
        text: The expression as given.
        metric: The metric it watches.
        filters: ``(key, value)`` pairs; key is ``kind``, ``sliding_window`` or
            ``group_idx``; value ``"*"`` matches every row.
        threshold: The threshold's size (a fraction when ``relative``).
        relative: The threshold is a percentage of A's value.
        direction: +1 (a rise crosses), -1 (a fall crosses) or 0 (either).
        limit: The threshold exactly, as written (a fraction when ``relative``): what
            :meth:`crossed` compares with, so ``+1.1%`` means 11/1000 and not the float
            nearest 0.011 (issue 24). None: taken from ``threshold``.
        alias: The deprecated name the expression gave for ``metric``
            (``restored_blocks`` for ``stored_while_live``, issue 20), or None.
    """

    text: str
    metric: str
    filters: tuple[tuple[str, KeyValue], ...]
    threshold: float
    relative: bool
    direction: int
    limit: Fraction | None = None
    alias: str | None = None

    @property
    def deprecation(self) -> str | None:
        """The note to print when the expression used a deprecated metric name, or None."""
        if self.alias is None:
            return None
        return (
            f"--fail-on {self.text!r}: {self.alias} is the deprecated name of {self.metric} "
            f"(kept in JSON for one release); watching {self.metric}, write that instead"
        )

    @property
    def table(self) -> str:
        """The table whose rows it watches: ``totals``, ``kind``, ``window`` or ``group``."""
        keys = {k for k, _ in self.filters}
        if not keys:
            return "totals"
        if keys == {"kind"}:
            return "kind"
        if keys == {"sliding_window"}:
            return "window"
        return "group"

    def matches(self, key: Mapping[str, KeyValue]) -> bool:
        """Return True when a row's key passes every filter.

        Args:
            key: The row's key.

        Returns:
            Whether the row is watched.
        """
        return all(v == "*" or key.get(k) == v for k, v in self.filters)

    def crossed(self, m: MetricDelta) -> bool:
        """Return True when this metric moved past the threshold.

        Args:
            m: The metric on both sides.

        Returns:
            Whether the threshold is crossed.
        """
        if not m.changed or m.a is None or m.b is None:
            return False
        limit = self.limit if self.limit is not None else _exact(self.threshold)
        a, b = _exact(m.a), _exact(m.b)
        if self.relative and a == 0:
            # A rise from 0 is infinitely large: it crosses every + or unsigned percentage.
            return self.direction >= 0
        moved = (b - a) / abs(a) if self.relative else b - a
        if self.direction > 0:
            return moved > limit
        if self.direction < 0:
            return moved < -limit
        return abs(moved) > limit


def _exact(v: float | int) -> Fraction:
    """A metric value or threshold as an exact rational: a float as the decimal it prints as.

    Counts are integers; lifetimes are floats rounded to the millisecond, so their shortest
    decimal (``repr``) is the value a person reads, and the one compared (``0.3 -> 0.4`` is a
    rise of exactly 0.1, not 0.10000000000000003).
    """
    if isinstance(v, float):
        return Fraction(repr(v)) if math.isfinite(v) else Fraction(0)
    return Fraction(v)


@dataclass(frozen=True)
class FailOnResult:
    """What one ``--fail-on`` expression found.

    Attributes:
        rule: The expression.
        matched_rows: How many rows it watched.
        hits: The rows whose metric crossed the threshold, with that metric.
    """

    rule: FailOn
    matched_rows: int
    hits: tuple[tuple[RowDiff, MetricDelta], ...]

    @property
    def crossed(self) -> bool:
        """Some watched row crossed the threshold."""
        return bool(self.hits)

    def to_dict(self) -> dict[str, object]:
        """Return the JSON form.

        Returns:
            The ``CHECK`` object of the module's schema.
        """
        hits: list[dict[str, object]] = []
        for row, m in self.hits:
            d = m.to_dict()
            del d["changed"]
            hits.append({"key": dict(row.key), "label": row.label, **d})
        return {
            "expr": self.rule.text,
            "crossed": self.crossed,
            "matched_rows": self.matched_rows,
            "hits": hits,
        }


@dataclass
class Diff:
    """Two reports compared.

    Attributes:
        by: The table shown: ``kind``, ``window`` or ``group``.
        a: Side A's source summary (the ``SIDE`` object of the schema).
        b: Side B's source summary.
        totals: The totals row.
        tables: Every table's rows (``kind``, ``window``, ``group``), largest change first.
        checks: The ``--fail-on`` results, in the order given.
        damaged: A side's input was damaged or partly skipped.
    """

    by: str
    a: dict[str, object]
    b: dict[str, object]
    totals: RowDiff
    tables: dict[str, list[RowDiff]]
    checks: list[FailOnResult] = field(default_factory=list)
    damaged: bool = False

    @property
    def rows(self) -> list[RowDiff]:
        """The rows of the ``by`` table."""
        return self.tables[self.by]

    @property
    def changed(self) -> bool:
        """Some metric differs in some row or in the totals."""
        return self.totals.changed or any(r.changed for t in self.tables.values() for r in t)

    @property
    def failed(self) -> bool:
        """Some ``--fail-on`` threshold was crossed."""
        return any(c.crossed for c in self.checks)

    def to_dict(self) -> dict[str, object]:
        """Return the JSON contract described in the module docstring.

        Returns:
            Plain Python objects (numbers, strings, None).
        """
        return {
            "schema": SCHEMA,
            "by": self.by,
            "a": self.a,
            "b": self.b,
            "changed": self.changed,
            "failed": self.failed,
            "totals": self.totals.to_dict(),
            "rows": [r.to_dict() for r in self.rows],
            "fail_on": [c.to_dict() for c in self.checks],
        }


def format_number(value: Number | None, *, signed: bool = False) -> str:
    """Format a metric value: thousands separators, 3 decimals for seconds, ``-`` for none.

    Args:
        value: The value.
        signed: Prefix ``+`` on positive values (deltas).

    Returns:
        The text.
    """
    if value is None:
        return "-"
    sign = "+" if signed else ""
    if isinstance(value, float):
        return f"{value:{sign},.3f}"
    return f"{int(value):{sign},}"


def format_rel(m: MetricDelta) -> str:
    """Format a relative change: ``+12.5%``, ``new`` (from 0), ``-`` (no value).

    Args:
        m: The metric.

    Returns:
        The text.
    """
    if m.rel_change is None:
        return "-"
    if math.isinf(m.rel_change):
        return "new"
    return f"{m.rel_change * 100:+.1f}%"


def _metric(name: str, a: Number | None, b: Number | None) -> MetricDelta:
    if a is None or b is None:
        return MetricDelta(name, a, b, None, None, a != b)
    delta: Number = b - a
    if isinstance(delta, float):
        # Lifetimes are rounded to the ms: keep their difference free of binary noise.
        delta = round(delta, 9)
    rel = (0.0 if b == 0 else math.inf) if a == 0 else delta / abs(a)
    return MetricDelta(name, a, b, delta, rel, a != b)


def _value(row: Mapping[str, object] | None, metric: str) -> Number | None:
    if row is None:
        # The row is absent on this side: it stored and removed nothing there.
        return 0 if metric in COUNT_METRICS else None
    v = row.get(metric)
    if isinstance(v, float) and not math.isfinite(v):
        # NaN or inf is no measurement: as a value it would read "changed" on identical
        # sides (NaN != NaN), sort nowhere, and turn the JSON output invalid (NaN token).
        return None
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _label(by: str, key: Mapping[str, KeyValue]) -> str:
    if by == "totals":
        return "total"
    window = key.get("sliding_window")
    wtext = f"window {window}" if window is not None else "no window"
    if by == "kind":
        return str(key.get("kind"))
    if by == "window":
        return wtext
    g = key.get("group_idx")
    return f"group {g if g is not None else '-'} ({key.get('kind')}, {wtext})"


def _row(
    by: str,
    key: Mapping[str, KeyValue],
    a: Mapping[str, object] | None,
    b: Mapping[str, object] | None,
) -> RowDiff:
    metrics = [_metric(name, _value(a, name), _value(b, name)) for name in METRICS]
    # Largest change first, values present on one side only after those with a change to
    # measure; sort() is stable, so ties keep DESIGN.md's order.
    metrics.sort(
        key=lambda m: (not m.changed, m.rel_change is None, -m.magnitude, -abs(m.delta or 0))
    )
    presence: Presence = (
        "both" if a is not None and b is not None else ("a_only" if a is not None else "b_only")
    )
    return RowDiff(dict(key), _label(by, key), presence, tuple(metrics))


def _key(by: str, row: Mapping[str, object]) -> tuple[KeyValue, ...]:
    out: list[KeyValue] = []
    for k in _KEYS[by]:
        v = row.get(k)
        out.append(v if isinstance(v, str | int) else None)
    return tuple(out)


def _table(
    by: str, a_rows: Iterable[Mapping[str, object]], b_rows: Iterable[Mapping[str, object]]
) -> list[RowDiff]:
    a_map = {_key(by, r): r for r in a_rows}
    b_map = {_key(by, r): r for r in b_rows}
    order = list(a_map) + [k for k in b_map if k not in a_map]
    rows = [
        _row(by, dict(zip(_KEYS[by], k, strict=True)), a_map.get(k), b_map.get(k)) for k in order
    ]
    rows.sort(key=lambda r: -r.magnitude)
    return rows


def _side(report: Report) -> dict[str, object]:
    src = report.source
    return {
        "recordings": [str(r) for r in src.recordings],
        "batches": src.batches,
        "events": src.events,
        "group_metadata": [str(m) for m in src.group_metadata],
        "damaged": report.damaged,
        "findings": list(report.findings),  # each a Finding: its text, kind and path
    }


_EXPR = re.compile(
    r"""^\s*(?P<metric>[A-Za-z0-9_]+)\s*
        (?:\{(?P<filters>[^{}]*)\}\s*)?
        :\s*(?P<sign>[+-])?\s*(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<pct>%)?\s*$""",
    re.VERBOSE,
)
_FILTER_KEYS = {
    "kind": "kind",
    "window": "sliding_window",
    "sliding_window": "sliding_window",
    "group": "group_idx",
    "group_idx": "group_idx",
}

FAIL_ON_SYNTAX = "METRIC[{kind=K,window=N,group=N}]:[+|-]NUMBER[%]"
"""The ``--fail-on`` grammar in one line (see the module docstring)."""


def parse_fail_on(text: str) -> FailOn:
    """Parse a ``--fail-on`` expression.

    Args:
        text: E.g. ``blocks_removed:+10%`` or ``live_blocks_end{kind=sliding_window}:-50``.

    Returns:
        The parsed expression.

    Raises:
        UsageError: The expression does not follow the syntax, or names an unknown metric
            or filter key.
    """
    where = f"--fail-on {text!r}"
    m = _EXPR.match(text)
    if m is None:
        raise UsageError(
            f"{where}: expected {FAIL_ON_SYNTAX}, e.g. 'blocks_removed:+10%' or "
            "'live_blocks_end{kind=sliding_window}:-100'"
        )
    metric = m["metric"]
    # A deprecated JSON name (issue 20: restored_blocks) watches the column it repeats.
    alias = metric if metric in ALIASES else None
    metric = ALIASES.get(metric, metric)
    # A short label (what a diff table too wide for the console shows) names its metric.
    metric = _BY_SHORT.get(metric, metric) if metric not in METRICS else metric
    if metric not in METRICS:
        raise UsageError(f"{where}: unknown metric {metric!r}; metrics: {', '.join(METRICS)}")
    filters: list[tuple[str, KeyValue]] = []
    if m["filters"] is not None:
        for part in m["filters"].split(","):
            name, eq, raw = part.partition("=")
            name, raw = name.strip(), raw.strip().strip("'\"")
            key = _FILTER_KEYS.get(name)
            if not eq or key is None or not raw:
                raise UsageError(
                    f"{where}: bad filter {part.strip()!r}; expected kind=NAME, window=N|none "
                    "or group=N|none (or * for every row)"
                )
            if any(k == key for k, _ in filters):
                raise UsageError(f"{where}: filter {name!r} given twice")
            filters.append((key, _filter_value(where, key, raw)))
    num = float(m["num"])
    if not math.isfinite(num):
        raise UsageError(f"{where}: threshold {m['num'][:20]}... is too large to compare")
    relative = m["pct"] is not None
    sign = m["sign"]
    return FailOn(
        text=text,
        metric=metric,
        filters=tuple(filters),
        threshold=num / 100 if relative else num,
        relative=relative,
        direction=1 if sign == "+" else -1 if sign == "-" else 0,
        limit=Fraction(m["num"]) / 100 if relative else Fraction(m["num"]),
        alias=alias,
    )


def _filter_value(where: str, key: str, raw: str) -> KeyValue:
    if raw == "*" or key == "kind":
        return raw
    if raw.lower() in ("none", "null", "-"):
        return None
    # ASCII digits only: int() also takes "1_0" and other scripts' digits, which would
    # watch a row the user did not name.
    if re.fullmatch(r"-?[0-9]+", raw) is None:
        what = "window" if key == "sliding_window" else "group"
        raise UsageError(f"{where}: {what} must be an integer, none or *, not {raw!r}")
    return int(raw)


def _check(rule: FailOn, d: Diff) -> FailOnResult:
    rows = [d.totals] if rule.table == "totals" else d.tables[rule.table]
    watched = [r for r in rows if rule.matches(r.key)]
    kind = dict(rule.filters).get("kind")
    if not watched and isinstance(kind, str) and kind != "*":
        known = {str(r.key.get("kind")) for r in d.tables["kind"]}
        if kind not in known and kind not in (*_known_kinds(), *_SPECIAL_KINDS):
            raise UsageError(
                f"--fail-on {rule.text!r}: unknown kind {kind!r}; kinds in the inputs: "
                f"{', '.join(sorted(known)) or 'none'}"
            )
    hits: list[tuple[RowDiff, MetricDelta]] = []
    for r in watched:
        m = next(x for x in r.metrics if x.metric == rule.metric)
        if rule.crossed(m):
            hits.append((r, m))
    return FailOnResult(rule, len(watched), tuple(hits))


def _known_kinds() -> tuple[str, ...]:
    from kvtool.annotate import KINDS

    return KINDS


def diff_reports(a: Report, b: Report, *, by: str = "kind", fail_on: Sequence[FailOn] = ()) -> Diff:
    """Compare two reports.

    Args:
        a: The baseline.
        b: The report compared with it.
        by: The table to show: ``kind``, ``window`` or ``group``.
        fail_on: Thresholds to check (:func:`parse_fail_on`).

    Returns:
        The comparison.

    Raises:
        UsageError: ``by`` is not a table name, or a ``--fail-on`` kind is unknown.
    """
    if by not in BY:
        raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
    da, db = a.to_dict(), b.to_dict()
    ta, tb = da.get("totals"), db.get("totals")
    totals = _row(
        "totals", {}, ta if isinstance(ta, dict) else {}, tb if isinstance(tb, dict) else {}
    )
    tables: dict[str, list[RowDiff]] = {}
    for name in BY:
        ra, rb = da.get(_TABLE[name]), db.get(_TABLE[name])
        tables[name] = _table(
            name,
            [r for r in ra if isinstance(r, dict)] if isinstance(ra, list) else [],
            [r for r in rb if isinstance(r, dict)] if isinstance(rb, list) else [],
        )
    out = Diff(
        by=by, a=_side(a), b=_side(b), totals=totals, tables=tables, damaged=a.damaged or b.damaged
    )
    out.checks = [_check(rule, out) for rule in fail_on]
    return out


def diff_recordings(
    paths_a: Sequence[str | os.PathLike[str]],
    paths_b: Sequence[str | os.PathLike[str]],
    *,
    by: str = "kind",
    fail_on: Sequence[FailOn] = (),
    groups_file: str | os.PathLike[str] | None = None,
    group_flags: Sequence[str] | None = None,
    report_mode: str = "auto",
    report_mode_b: str | None = None,
) -> Diff:
    """Build a report of each side (several recordings: one combined report) and compare.

    Args:
        paths_a: Side A's recordings.
        paths_b: Side B's recordings.
        by: The table to show.
        fail_on: Thresholds to check.
        groups_file: ``--groups FILE``, used for both sides.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags, used for both sides.
        report_mode: ``--report-mode`` (``auto``, ``full``, ``incremental``) of side A, and
            of side B too unless ``report_mode_b`` is given.
        report_mode_b: Side B's report mode (``--report-mode`` given twice); None: A's.

    Returns:
        The comparison.

    Raises:
        UsageError: A side has no recording, or ``by`` is unknown.
        RecordingError: A recording cannot be opened.
        MetadataError: Invalid group metadata.
    """
    if not paths_a or not paths_b:
        raise UsageError("diff needs a recording on each side: A B, or A1 A2 -- B1 B2")
    if by not in BY:
        raise UsageError(f"--by {by!r}: expected one of {', '.join(BY)}")
    from kvtool.report import build_report

    mode_b = report_mode if report_mode_b is None else report_mode_b
    rep_a = build_report(
        paths_a, groups_file=groups_file, group_flags=group_flags, report_mode=report_mode
    )
    rep_b = build_report(
        paths_b, groups_file=groups_file, group_flags=group_flags, report_mode=mode_b
    )
    return diff_reports(rep_a, rep_b, by=by, fail_on=fail_on)


__all__ = [
    "BY",
    "COUNT_METRICS",
    "FAIL_ON_SYNTAX",
    "LIFETIME_METRICS",
    "METRICS",
    "SCHEMA",
    "Diff",
    "FailOn",
    "FailOnResult",
    "MetricDelta",
    "RowDiff",
    "diff_recordings",
    "diff_reports",
    "format_number",
    "format_rel",
    "parse_fail_on",
]
