"""Live status on stderr: the recorder's block (or a plain log line every N s), publish progress.

Both say the same things in the same order: first whether anything was lost (gaps and lost
batches), then how much arrived (batches, events, rate), then the store and remove events per
kind. The live block is packed into the terminal's width segment by segment, so nothing is cut
at 80 columns; a plain line is one line per interval, for ``journalctl`` or a CI log. Every
string from the network or the command line (endpoint, kind) passes through
:func:`kvtool.text.printable` first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.live import Live
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from kvtool.text import plural, printable

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.capture import CaptureResult, CaptureStats
    from kvtool.pacing import PublishStats

Segment = tuple[str, str]
"""A piece of status text and its rich style ("" for none); never split across lines."""

DEFAULT_WIDTH = 80


def _n(value: int) -> str:
    return f"{value:,}"


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def _where(endpoints: Sequence[str]) -> str:
    if not endpoints:
        return "the publisher"
    first = printable(endpoints[0])
    return first if len(endpoints) == 1 else f"{first} (+{len(endpoints) - 1} more)"


def _per_kind(counter: dict[str, int]) -> list[str]:
    items = sorted(counter.items(), key=lambda kv: (-kv[1], str(kv[0])))
    return [f"{printable(k)} {_n(v)}" for k, v in items]


def status_segments(
    stats: CaptureStats, *, endpoints: Sequence[str] = (), rate: float | None = None
) -> list[list[Segment]]:
    """Describe a running capture as lines of unbreakable segments.

    Args:
        stats: The capture's counters.
        endpoints: The endpoints subscribed to (for "waiting for publisher at …").
        rate: Events per second to show, if known.

    Returns:
        Groups of segments; each group starts on a new line, and its segments wrap to the
        width as whole pieces.
    """
    elapsed = f"{stats.elapsed_ns / 1e9:.1f}s"
    if stats.batches == 0:
        where = _where(endpoints)
        if stats.connected:
            return [
                [
                    ("connected, waiting for the first batch", "bold"),
                    (f"from {where}", ""),
                    (f"({elapsed})", ""),
                ]
            ]
        return [
            [("waiting for publisher", "bold yellow"), (f"at {where}", ""), (f"({elapsed})", "")]
        ]
    head: list[Segment] = [(f"recording {elapsed}", "bold")]
    head.append((f"lost {_n(stats.lost)}", "bold red" if stats.lost else "green"))
    recovered = f" ({_n(stats.recovered)} recovered)" if stats.gaps else ""
    head.append((f"gaps {_n(stats.gaps)}{recovered}", "yellow" if stats.lost else ""))
    if stats.restarts:
        head.append((f"restarts {_n(stats.restarts)}", "yellow"))
    if stats.malformed or stats.undecodable:
        head.append((f"malformed {_n(stats.malformed + stats.undecodable)}", "yellow"))
    if stats.stray:
        head.append((f"strays {_n(stats.stray)}", "yellow"))
    head.append((f"batches {_n(stats.batches)}", ""))
    per_s = f" ({rate:,.0f}/s)" if rate is not None else ""
    head.append((f"events {_n(stats.events)}{per_s}", ""))
    lines = [head]
    for label, counter in (("store events:", stats.stores), ("remove events:", stats.removes)):
        kinds = _per_kind(counter)
        if kinds:
            lines.append([(f"  {label}", "dim")] + [(k, "") for k in kinds])
    if stats.cleared:
        lines.append([("  cleared events:", "dim"), (_n(stats.cleared), "")])
    return lines


def _gap(prev: str) -> str:
    # A label ("store events:") is followed by one space, other segments by two.
    return " " if prev.endswith(":") else "  "


def _join(group: list[Segment]) -> str:
    out = ""
    prev = ""
    for text, _ in group:
        text = text.strip()
        out += (_gap(prev) if out else "") + text
        prev = text
    return out


def pack(lines: list[list[Segment]], width: int) -> Text:
    """Lay segments out in at most ``width`` columns, breaking only between segments.

    Args:
        lines: Groups of segments (see :func:`status_segments`).
        width: The terminal width.

    Returns:
        The text; no line is longer than ``width`` unless one segment alone is.
    """
    from rich.cells import cell_len

    out = Text()
    first_line = True
    for group in lines:
        col = 0
        prev = ""
        for text, style in group:
            gap = _gap(prev)
            # Terminal cells, not characters: a kind name from the network may be CJK
            # (two cells a character), and a line that overflows breaks the live display.
            size = cell_len(text)
            if col and col + len(gap) + size > width:
                out.append("\n    ")
                col = 4
            elif col:
                out.append(gap)
                col += len(gap)
            elif not first_line:
                out.append("\n")
            out.append(text, style=style)
            col += size
            prev = text
            first_line = False
    return out


def plain_line(lines: list[list[Segment]]) -> str:
    """Join the segments into one plain log line.

    Args:
        lines: Groups of segments (see :func:`status_segments`).

    Returns:
        ``kvtool: recording 10.0s  lost 0  gaps 0  …; store events: full_attention 12 …``.
    """
    return "kvtool: " + "; ".join(_join(g) for g in lines)


class _Rate:
    """Events per second between two looks at least half a second apart."""

    def __init__(self) -> None:
        self._events = 0
        self._ns = 0
        self.value: float | None = None

    def update(self, stats: CaptureStats) -> float | None:
        dt = stats.elapsed_ns - self._ns
        if dt >= 500_000_000:
            self.value = (stats.events - self._events) / (dt / 1e9)
            self._events, self._ns = stats.events, stats.elapsed_ns
        return self.value


class LiveStatus:
    """A refreshing status block on a terminal (rich ``Live``), packed to its width.

    Args:
        console: The stderr console (a terminal).
        endpoints: The endpoints subscribed to.
    """

    def __init__(self, console: Console, endpoints: Sequence[str] = ()) -> None:
        self.console = console
        self.endpoints = list(endpoints)
        self.live = Live(console=console, auto_refresh=False, transient=True)
        self._rate = _Rate()

    def render(self, stats: CaptureStats) -> Text:
        """Return the status block for these counters.

        Args:
            stats: The capture's counters.

        Returns:
            The block, at most the console's width wide.
        """
        rate = self._rate.update(stats)
        lines = status_segments(stats, endpoints=self.endpoints, rate=rate)
        return pack(lines, self.console.width or DEFAULT_WIDTH)

    def __call__(self, stats: CaptureStats) -> None:
        """Show the counters.

        Args:
            stats: The capture's counters.
        """
        self.live.update(self.render(stats), refresh=True)


class StatusLog:
    """A plain status line every ``every_ns`` of capture time, for a stderr that is a log.

    Args:
        write: Writes one line.
        every_ns: The interval.
        endpoints: The endpoints subscribed to.
    """

    def __init__(
        self, write: Callable[[str], None], every_ns: int, endpoints: Sequence[str] = ()
    ) -> None:
        self.write = write
        self.every_ns = every_ns
        self.endpoints = list(endpoints)
        self._next_ns = every_ns
        self._events = 0
        self._last_ns = 0
        self.lines = 0

    def __call__(self, stats: CaptureStats) -> None:
        """Write a line when the capture has run another interval.

        Args:
            stats: The capture's counters.
        """
        if stats.elapsed_ns < self._next_ns:
            return
        dt = stats.elapsed_ns - self._last_ns
        rate = (stats.events - self._events) / (dt / 1e9) if dt > 0 else None
        self._events, self._last_ns = stats.events, stats.elapsed_ns
        # The next line after the next whole interval, however late this call came.
        self._next_ns = (stats.elapsed_ns // self.every_ns + 1) * self.every_ns
        self.write(plain_line(status_segments(stats, endpoints=self.endpoints, rate=rate)))
        self.lines += 1


@contextmanager
def record_status(
    console: Console, *, endpoints: Sequence[str], quiet: bool, every_ns: int | None
) -> Iterator[Callable[[CaptureStats], None] | None]:
    """The status callback ``record`` hands the recorder, live or logged, or None.

    Args:
        console: The stderr console.
        endpoints: The endpoints subscribed to.
        quiet: No status at all.
        every_ns: Interval of plain lines when stderr is not a terminal (None or 0: none).

    Yields:
        The callback, or None when nothing is to be shown.
    """
    if quiet:
        yield None
    elif console.is_terminal:
        live = LiveStatus(console, endpoints)
        with live.live:
            yield live
    elif every_ns:
        yield StatusLog(
            lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True),
            every_ns,
            endpoints,
        )
    else:
        yield None


def summary_line(result: CaptureResult) -> str:
    """Return the one-line summary printed when a recording ends.

    Loss comes first; a clean run reads as one (replay requests that timed out without
    losing anything are said to have lost nothing).

    Args:
        result: The finished capture.

    Returns:
        ``FILE: N lost, N gaps (N recovered); N batches, N events, …, SIZE (reason)``.
    """
    st = result.stats
    gaps = plural(st.gaps, "gap")
    if st.gaps:
        gaps += f" ({_n(st.recovered)} recovered)"
    parts = [plural(st.batches, "batch", "batches"), plural(st.events, "event")]
    if st.restarts:
        parts.append(plural(st.restarts, "restart"))
    if st.history:
        parts.append(f"{_n(st.history)} from history")
    if st.malformed or st.undecodable:
        parts.append(f"{_n(st.malformed)} malformed, {_n(st.undecodable)} undecodable")
    if st.stray:
        parts.append(plural(st.stray, "stray batch", "stray batches") + " dropped")
    if st.replay_rejected:
        parts.append(plural(st.replay_rejected, "replay reply", "replay replies") + " rejected")
    if st.replay_retries or st.replay_timeouts:
        # "nothing lost" only when every gap was filled or confirmed (issue 23).
        clean = not st.lost and not st.unconfirmed
        if st.replay_retries:
            parts.append(plural(st.replay_retries, "replay request") + " asked again")
        if st.replay_timeouts:
            parts.append(plural(st.replay_timeouts, "replay request") + " given up")
        if clean:
            parts[-1] += ", nothing lost"
    if st.unconfirmed:
        parts.append(plural(st.unconfirmed, "channel tail") + " unconfirmed")
    if st.unsampled:
        n = plural(st.unsampled, "batch", "batches")
        parts.append(f"per-kind counts sampled ({n} not decoded)")
    parts.append(f"{_human_bytes(result.file_bytes)} ({printable(result.stop_reason)})")
    return f"{printable(result.path)}: {_n(st.lost)} lost, {gaps}; " + ", ".join(parts)


def no_batch_line(result: CaptureResult, endpoints: Sequence[str]) -> str:
    """Say that a recording ended with nothing in it, and why that may be.

    Args:
        result: The finished capture (no batch received).
        endpoints: The endpoints subscribed to.

    Returns:
        One line for stderr.
    """
    secs = f"{result.stats.elapsed_ns / 1e9:.1f}s"
    where = ", ".join(printable(e) for e in endpoints) or "the endpoints"
    if result.stats.connected:
        return (
            f"kvtool: no batch received in {secs}: connected to {where}, but the publisher "
            "sent nothing; is vLLM serving requests, and does --topic match its topic?"
        )
    return (
        f"kvtool: no batch received in {secs}: no publisher was reached at {where}; is vLLM "
        "running with --kv-events-config publishing there?"
    )


class PublishProgress:
    """A spinner line on stderr while ``replay --publish`` runs (only on a terminal).

    Args:
        console: The stderr console.
        enabled: False shows nothing (``-q``).
    """

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self._stats: PublishStats | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if enabled and console.is_terminal:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("starting", total=None)

    def status(self, text: str) -> None:
        """Replace the line's text.

        Args:
            text: What is happening (already printable).
        """
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=text)

    @property
    def sent(self) -> int:
        """Batches published so far: the publisher's live counter (0 before it starts)."""
        return self._stats.sent if self._stats is not None else 0

    def update(self, stats: PublishStats) -> None:
        """Show how many batches went out.

        Args:
            stats: The publisher's counters (kept: :attr:`sent` reads them live).
        """
        self._stats = stats
        self.status(f"published {stats.sent:,} batches ({stats.rate:,.0f}/s)")

    def stop(self) -> None:
        """Remove the line."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


__all__ = [
    "LiveStatus",
    "PublishProgress",
    "StatusLog",
    "no_batch_line",
    "pack",
    "plain_line",
    "record_status",
    "status_segments",
    "summary_line",
]
