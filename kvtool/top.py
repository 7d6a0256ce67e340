"""The model behind ``kvtool top``: report snapshots in, rates, peaks and sparklines out.

``top`` computes nothing of its own about blocks. Every interval it takes a snapshot of the
report engine's tables (the same live-block state ``kvtool report`` uses, fed with the events
seen so far) and turns two successive snapshots into per-second rates. So live blocks, peaks,
restored and orphan counts shown for a stream are, at the same seq, exactly what ``kvtool
report`` prints for the same events.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The views a key switches between, and the row key columns of each.
VIEWS = {
    "kind": ("kind",),
    "window": ("sliding_window",),
    "group": ("group_idx", "kind"),
    "rank": ("dp_rank", "kind"),
}
VIEW_KEYS = {"k": "kind", "w": "window", "g": "group", "r": "rank"}
HISTORY_S = 60.0
SPARK = "▁▂▃▄▅▆▇█"

Row = Mapping[str, object]


@dataclass(frozen=True)
class Health:
    """The stream's health, as the source (recorder or recording) sees it.

    Attributes:
        source: What is watched (endpoints or a file), printable.
        publishers: Publishers (channels) known.
        connected: Publishers connected now (a recording: channels seen).
        batches: Batches received so far.
        gaps_recovered: Missing seqs recovered over replay.
        lost: Seqs lost for good.
        restarts: Publisher restarts seen.
        last_batch_age_s: Seconds since the last batch, or None before the first.
        done: The source has ended (end of recording, or the recorder stopped).
    """

    source: str = ""
    publishers: int = 0
    connected: int = 0
    batches: int = 0
    gaps_recovered: int = 0
    lost: int = 0
    restarts: int = 0
    last_batch_age_s: float | None = None
    done: bool = False


@dataclass(frozen=True)
class TopRow:
    """One line of the view.

    Attributes:
        label: The row's key, printable (``sliding_window``, ``window 64``, ``rank 1 mamba``).
        live: Live blocks now.
        peak: Peak live blocks so far.
        stores_per_s: Blocks stored per second over the last interval.
        evictions_per_s: Blocks removed per second over the last interval.
        restored_per_s: Blocks re-stored while live, per second over the last interval.
        orphans: Orphan removes so far.
        lifetime_p50_s: Median block lifetime (store -> remove) so far, or None.
        spark: Live blocks over the last minute, oldest first.
    """

    label: str
    live: int
    peak: int
    stores_per_s: float
    evictions_per_s: float
    restored_per_s: float
    orphans: int
    lifetime_p50_s: float | None
    spark: tuple[int, ...]


def row_label(view: str, row: Row) -> str:
    """Return the label of a report row in a view.

    Args:
        view: One of :data:`VIEWS`.
        row: A report row (``by_kind``, ``by_window``, ``by_group`` or per-rank row).

    Returns:
        A short label.
    """
    if view == "kind":
        return str(row.get("kind"))
    if view == "window":
        w = row.get("sliding_window")
        return "no window" if w is None else f"window {w}"
    if view == "group":
        g = row.get("group_idx")
        return f"{'-' if g is None else g} {row.get('kind')}"
    r = row.get("dp_rank")
    return f"rank {'-' if r is None else r} {row.get('kind')}"


def _int(row: Row | None, col: str) -> int:
    v = None if row is None else row.get(col)
    return int(v) if isinstance(v, int | float) else 0


def sparkline(values: Sequence[int], width: int = 12) -> str:
    """Draw ``values`` (the last ``width`` of them) as block characters scaled to their max.

    Args:
        values: Samples, oldest first.
        width: Characters at most.

    Returns:
        The sparkline; spaces pad it on the left to ``width``.
    """
    tail = list(values)[-width:]
    top = max(tail, default=0)
    if top <= 0:
        chars = [SPARK[0]] * len(tail)
    else:
        chars = [SPARK[min(len(SPARK) - 1, v * (len(SPARK) - 1) // top)] for v in tail]
    return "".join(chars).rjust(width)


@dataclass
class TopModel:
    """Successive report snapshots turned into what ``top`` shows.

    Args:
        history_s: How much live-block history the sparklines keep.
    """

    history_s: float = HISTORY_S
    t: float | None = None
    health: Health = field(default_factory=Health)
    _tables: dict[str, dict[str, Row]] = field(default_factory=dict)
    _rates: dict[str, dict[str, tuple[float, float, float]]] = field(default_factory=dict)
    _history: dict[str, dict[str, deque[tuple[float, int]]]] = field(default_factory=dict)
    batches_per_s: float = 0.0

    def update(self, t: float, tables: Mapping[str, Sequence[Row]], health: Health) -> None:
        """Take one snapshot.

        Args:
            t: Seconds on the stream's clock (monotonic within one run).
            tables: Report rows per view name of :data:`VIEWS` (views left out keep nothing).
            health: The source's health now.
        """
        dt = None if self.t is None else t - self.t
        if dt is not None and dt > 0:
            self.batches_per_s = max(0, health.batches - self.health.batches) / dt
        for view, rows in tables.items():
            new = {row_label(view, r): r for r in rows}
            old = self._tables.get(view, {})
            rates: dict[str, tuple[float, float, float]] = {}
            hist = self._history.setdefault(view, {})
            for label, r in new.items():
                if dt is not None and dt > 0:
                    prev = old.get(label)
                    rates[label] = tuple(  # type: ignore[assignment]
                        max(0, _int(r, c) - _int(prev, c)) / dt
                        for c in ("blocks_stored", "blocks_removed", "restored_blocks")
                    )
                h = hist.setdefault(label, deque())
                h.append((t, _int(r, "live_blocks_end")))
                while h and h[0][0] < t - self.history_s:
                    h.popleft()
            self._tables[view] = new
            self._rates[view] = rates
        self.t = t
        self.health = health

    def rows(self, view: str) -> list[TopRow]:
        """Return the view's rows, most live blocks first.

        Args:
            view: One of :data:`VIEWS`.

        Returns:
            The rows.
        """
        out = []
        rates = self._rates.get(view, {})
        hist = self._history.get(view, {})
        for label, r in self._tables.get(view, {}).items():
            s, e, rs = rates.get(label, (0.0, 0.0, 0.0))
            p50 = r.get("lifetime_p50_s")
            out.append(
                TopRow(
                    label=label,
                    live=_int(r, "live_blocks_end"),
                    peak=_int(r, "peak_live_blocks"),
                    stores_per_s=s,
                    evictions_per_s=e,
                    restored_per_s=rs,
                    orphans=_int(r, "orphan_removes"),
                    lifetime_p50_s=float(p50) if isinstance(p50, int | float) else None,
                    spark=tuple(v for _, v in hist.get(label, ())),
                )
            )
        out.sort(key=lambda x: (-x.live, -x.peak, x.label))
        return out


__all__ = [
    "HISTORY_S",
    "VIEWS",
    "VIEW_KEYS",
    "Health",
    "TopModel",
    "TopRow",
    "row_label",
    "sparkline",
]
