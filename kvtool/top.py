"""The model behind ``kvtool top``: report snapshots in, rates, peaks and sparklines out.

``top`` computes nothing of its own about blocks. Every interval it takes a snapshot of the
report engine's tables (the same live-block state ``kvtool report`` uses, fed with the events
seen so far) and turns two successive snapshots into per-second rates. So live blocks, peaks,
recomputed and orphan counts shown for a stream are, at the same seq, exactly what ``kvtool
report`` prints for the same events.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

# The feed and the sources live in their own modules; their names stay importable here.
from kvtool.report.feed import CHUNK_BYTES, CHUNK_MAX, KEEP_BYTES, KEEP_MIN, ReportFeed
from kvtool.streams import (
    INBOX_BYTES,
    INBOX_MAX,
    LIVE_RCVHWM,
    MAX_PLAYBACK_GAP_NS,
    MAX_SPEED,
    Health,
    LiveSource,
    RecordingSource,
    Source,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

# The views a key switches between, and the row key columns of each.
VIEWS = {
    "kind": ("kind",),
    "window": ("sliding_window",),
    "group": ("group_idx", "kind", "sliding_window"),
    "rank": ("dp_rank", "kind"),
}
VIEW_KEYS = {"k": "kind", "w": "window", "g": "group", "r": "rank"}
HISTORY_S = 60.0
SPARK = "▁▂▃▄▅▆▇█"

FEED_BUDGET_S = 0.25
"""A refresh feeds chunks for at most this long before the screen is drawn (health current)."""
DRAIN_AT = 256
"""Between refreshes, a backlog of this many batches is fed (in chunks) instead of waiting."""

Row = Mapping[str, object]


@dataclass(frozen=True)
class TopRow:
    """One line of the view.

    Attributes:
        label: The row's key, printable (``sliding_window``, ``window 64``, ``rank 1 mamba``).
        live: Live blocks now.
        peak: Peak live blocks so far.
        stores_per_s: Blocks stored per second over the last interval.
        evictions_per_s: Blocks removed per second over the last interval.
        recomputed_per_s: Blocks stored again after they were evicted or cleared
            (``blocks_recomputed``), per second over the last interval.
        orphans: Orphan removes so far.
        lifetime_p50_s: Median block lifetime (store -> remove) so far, or None.
        hit_rate: ``hit_rate`` so far (only with ``--report-mode full``), or None.
        spark: Live blocks over the last minute, oldest first.
    """

    label: str
    live: int
    peak: int
    stores_per_s: float
    evictions_per_s: float
    recomputed_per_s: float
    orphans: int
    lifetime_p50_s: float | None
    spark: tuple[int, ...]
    hit_rate: float | None = None


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
        # The group's whole key: one group seen with two windows is two rows (issue 24).
        g = row.get("group_idx")
        w = row.get("sliding_window")
        return f"{'-' if g is None else g} {row.get('kind')}" + ("" if w is None else f":{w}")
    r = row.get("dp_rank")
    return f"rank {'-' if r is None else r} {row.get('kind')}"


def row_key(view: str, row: Row) -> tuple[object, ...]:
    """Return the key of a report row in a view: every key column of :data:`VIEWS`.

    Rows are told apart by this key, never by their label, so two rows whose labels print
    alike (a kind spelled with an invisible character) stay two rows.

    Args:
        view: One of :data:`VIEWS`.
        row: A report row.

    Returns:
        The values of the view's key columns.
    """
    return tuple(row.get(c) for c in VIEWS[view])


_ESCAPE_FINAL = range(0x40, 0x7F)


def split_keys(data: str) -> list[str]:
    """Split what the terminal sent into key presses, dropping escape sequences.

    Function and arrow keys arrive as escape sequences (F1 is ``ESC O P``, F5 ``ESC [ 1 5 ~``):
    their letters are not key presses (issue 24: F1/F2 acted as ``p``/``q``).

    Args:
        data: The characters read.

    Returns:
        The plain keys, in order.
    """
    keys: list[str] = []
    i, n = 0, len(data)
    while i < n:
        ch = data[i]
        if ch != "\x1b":
            keys.append(ch)
            i += 1
            continue
        i += 1  # ESC
        if i < n and data[i] in "[O":
            intro = data[i]
            i += 1
            if intro == "O":
                i += 1  # SS3: one final character
                continue
            while i < n and ord(data[i]) not in _ESCAPE_FINAL:
                i += 1  # CSI parameters
            while i < n and not ("@" <= data[i] <= "~"):
                i += 1
            i += 1  # the final byte
        elif i < n:
            i += 1  # ESC + one character (Alt-key)
    return keys


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
    _tables: dict[str, dict[tuple[object, ...], Row]] = field(default_factory=dict)
    _rates: dict[str, dict[tuple[object, ...], tuple[float, float, float]]] = field(
        default_factory=dict
    )
    _history: dict[str, dict[tuple[object, ...], deque[tuple[float, int]]]] = field(
        default_factory=dict
    )
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
            new = {row_key(view, r): r for r in rows}
            old = self._tables.get(view, {})
            rates: dict[tuple[object, ...], tuple[float, float, float]] = {}
            hist = self._history.setdefault(view, {})
            for label, r in new.items():
                if dt is not None and dt > 0:
                    prev = old.get(label)
                    rates[label] = tuple(  # type: ignore[assignment]
                        max(0, _int(r, c) - _int(prev, c)) / dt
                        for c in ("blocks_stored", "blocks_removed", "blocks_recomputed")
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
        for key, r in self._tables.get(view, {}).items():
            s, e, rs = rates.get(key, (0.0, 0.0, 0.0))
            p50 = r.get("lifetime_p50_s")
            hit = r.get("hit_rate")
            out.append(
                TopRow(
                    label=row_label(view, r),
                    live=_int(r, "live_blocks_end"),
                    peak=_int(r, "peak_live_blocks"),
                    stores_per_s=s,
                    evictions_per_s=e,
                    recomputed_per_s=rs,
                    orphans=_int(r, "orphan_removes"),
                    lifetime_p50_s=float(p50) if isinstance(p50, int | float) else None,
                    spark=tuple(v for _, v in hist.get(key, ())),
                    hit_rate=float(hit) if isinstance(hit, int | float) else None,
                )
            )
        out.sort(key=lambda x: (-x.live, -x.peak, x.label))
        return out


# -- the loops -----------------------------------------------------------------------------


@dataclass
class TopView:
    """The state of the screen: the model, the view shown, paused or not.

    Args:
        source: Where batches come from.
        feed: The report adapter.
    """

    source: Source
    feed: ReportFeed
    model: TopModel = field(default_factory=TopModel)
    view: str = "kind"
    paused: bool = False

    def tick(self, now: float) -> None:
        """Feed what arrived and, unless paused, take a snapshot into the model.

        Args:
            now: Monotonic seconds.
        """
        # Chunks until nothing is waiting or the budget is spent: under a flood the screen
        # is drawn less often (health current), never with batches left out.
        until = time.monotonic() + FEED_BUDGET_S
        while True:
            self.feed.add(self.source.take(now))
            if not self.source.backlog or time.monotonic() >= until:
                break
        if not self.paused or self.source.done:
            self.model.update(self.source.clock(), self.feed.snapshot(), self.source.health())

    def drain(self, seconds: float) -> None:
        """Between refreshes: feed a backlog of at least :data:`DRAIN_AT` batches, in chunks.

        Args:
            seconds: At most this long.
        """
        until = time.monotonic() + seconds
        while self.source.backlog >= DRAIN_AT and time.monotonic() < until:
            self.feed.add(self.source.take(time.monotonic()))

    def key(self, ch: str, now: float | None = None) -> bool:
        """Apply a key; return False for quit.

        ``p`` pauses the view and, on a recording, its playback too (issue 24).

        Args:
            ch: One character.
            now: Monotonic seconds (default: now).

        Returns:
            False when the key quits.
        """
        if ch in ("q", "Q"):
            return False
        if ch in VIEW_KEYS:
            self.view = VIEW_KEYS[ch]
        elif ch in ("p", "P"):
            self.paused = not self.paused
            self.source.pause(time.monotonic() if now is None else now, self.paused)
        return True


def run_plain(
    top: TopView,
    out: TextIO,
    *,
    interval_s: float = 1.0,
    duration_s: float | None = None,
    render: Callable[[TopModel, str], str],
) -> None:
    """Print one plain block every ``interval_s`` until the end of input or ``duration_s``.

    Args:
        top: The view (its source not started).
        out: Where blocks go.
        interval_s: Seconds between blocks.
        duration_s: Stop after this long (None: at the end of input only).
        render: Turns the model into a block (:func:`kvtool.render.top.plain_block`).
    """
    start = time.monotonic()
    top.model.update(0.0, top.feed.snapshot(), top.source.health())
    end = None if duration_s is None else start + duration_s
    next_tick = start + interval_s
    first = True
    try:
        # Started inside the try: a Ctrl-C the moment the recorder runs still stops it
        # (its --record file closed, not left to a daemon thread killed at exit).
        top.source.start(start)
        while True:
            now = time.monotonic()
            wake = top.source.wake(now)
            due = min(x for x in (next_tick, end, wake) if x is not None)
            if due > now:
                if top.source.backlog >= DRAIN_AT:
                    top.drain(min(due - now, 0.2))
                else:
                    time.sleep(min(due - now, 0.2))
                if not top.source.done:
                    continue
            now = time.monotonic()
            top.tick(now)
            final = top.source.done or (end is not None and now >= end)
            if now >= next_tick or final:
                if not first:
                    out.write("\n")
                out.write(render(top.model, top.view))
                out.flush()
                first = False
                next_tick += interval_s * max(1, int((now - next_tick) // interval_s) + 1)
            if final:
                return
    finally:
        top.source.stop()


@contextlib.contextmanager
def cbreak(fd: int | None) -> Iterator[bool]:
    """Put a terminal in cbreak mode (keys one by one, Ctrl-C still interrupts); restore it.

    Args:
        fd: The terminal's file descriptor (None, or not a terminal: nothing to do).

    Yields:
        True when keys can be read.
    """
    if fd is None or not os.isatty(fd):
        yield False
        return
    import termios
    import tty

    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield True
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)


def run_screen(
    top: TopView,
    console: Console,
    *,
    key_fd: int | None,
    interval_s: float = 1.0,
    duration_s: float | None = None,
    render: Callable[[TopModel, str, bool, int, int], RenderableType],
) -> None:
    """Run the full-screen view until ``q``, ``duration_s`` or Ctrl-C (KeyboardInterrupt).

    At the end of a recording the final screen stays until ``q``; a resize redraws it.

    Args:
        top: The view (its source not started).
        console: The terminal.
        key_fd: The terminal to read keys from (None: no keys).
        interval_s: Seconds between refreshes.
        duration_s: Stop after this long.
        render: Turns the model, view, paused flag, width and height into the screen
            (:func:`kvtool.render.top.screen`).
    """
    import select

    from rich.live import Live

    def terminal_size() -> tuple[int, int]:
        # The terminal's real size: COLUMNS/LINES left exported by a shell or a parent
        # process must not pin a full screen (rich reads them first), and a resize must show.
        try:
            size = os.get_terminal_size(console.file.fileno())
        except (AttributeError, ValueError, OSError):
            return console.size.width, console.size.height
        return size.columns, size.lines

    def draw() -> RenderableType:
        width, height = shown
        return render(top.model, top.view, top.paused, width, height)

    start = time.monotonic()
    top.model.update(0.0, top.feed.snapshot(), top.source.health())
    end = None if duration_s is None else start + duration_s
    next_tick = start
    ended = False
    try:
        top.source.start(start)  # inside the try, as in run_plain
        shown = console.size = terminal_size()
        with (
            cbreak(key_fd) as keys,
            Live(
                draw(),
                console=console,
                screen=True,
                auto_refresh=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live,
        ):
            while True:
                now = time.monotonic()
                if end is not None and now >= end:
                    return
                if not ended and now >= next_tick:
                    top.tick(now)
                    ended = top.source.done
                    if ended and top.source.error is not None:
                        return  # the recorder failed: stop() raises its error

                    live.update(draw(), refresh=True)
                    next_tick += interval_s * max(1, int((now - next_tick) // interval_s) + 1)
                elif terminal_size() != shown:  # resized: redraw now, the final screen too
                    shown = console.size = terminal_size()
                    live.update(draw(), refresh=True)
                wait = max(0.0, min(x for x in (next_tick, end) if x is not None) - now)
                if ended:
                    wait = 0.5 if end is None else min(0.5, wait)
                elif top.source.backlog >= DRAIN_AT:
                    top.drain(min(wait, 0.2))  # a burst: feed it now, keys meanwhile
                    wait = 0.0
                if keys and key_fd is not None:
                    ready, _, _ = select.select([key_fd], [], [], min(wait, 0.5))
                    if ready:
                        try:
                            data = os.read(key_fd, 64).decode("utf-8", "replace")
                        except OSError:  # EIO: the terminal went away (a closed SSH session)
                            return
                        if not data:  # the terminal went away
                            return
                        for ch in split_keys(data):
                            if not top.key(ch, time.monotonic()):
                                return
                        live.update(draw(), refresh=True)
                else:
                    time.sleep(min(wait, 0.5))
    finally:
        top.source.stop()


__all__ = [
    "CHUNK_BYTES",
    "CHUNK_MAX",
    "DRAIN_AT",
    "FEED_BUDGET_S",
    "HISTORY_S",
    "INBOX_BYTES",
    "INBOX_MAX",
    "KEEP_BYTES",
    "KEEP_MIN",
    "LIVE_RCVHWM",
    "MAX_PLAYBACK_GAP_NS",
    "MAX_SPEED",
    "VIEWS",
    "VIEW_KEYS",
    "Health",
    "LiveSource",
    "RecordingSource",
    "ReportFeed",
    "Source",
    "TopModel",
    "TopRow",
    "TopView",
    "cbreak",
    "row_key",
    "row_label",
    "run_plain",
    "run_screen",
    "sparkline",
    "split_keys",
]
