"""Render ``kvtool info`` summaries as a ``ros2 bag info``-style table or as JSON."""

from __future__ import annotations

import json
import os
import shlex
import time
from typing import TYPE_CHECKING, TextIO

from rich.text import Text

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.info import RecordingInfo


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def _time(ns: int | None) -> str:
    if ns is None:
        return "-"
    secs, frac = divmod(ns, 1_000_000_000)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(secs))
    return f"{stamp}.{frac // 1_000_000:03d} UTC ({ns} ns)"


def _ranges(ranges: list[list[int]], limit: int = 8) -> str:
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    if len(ranges) > limit:
        parts.append(f"… ({len(ranges) - limit} more)")
    return ", ".join(parts)


def _groups(info: RecordingInfo) -> str:
    if info.groups is None:
        return "not stored"
    parts = []
    for g in info.groups:
        if not isinstance(g, dict):
            continue
        kind = g.get("kind", "?")
        window = g.get("sliding_window")
        text = f"{g.get('group_idx', '?')}={kind}"
        if window is not None:
            text += f":{window}"
        parts.append(text)
    src = f" (from {info.groups_source})" if info.groups_source else ""
    return f"{len(info.groups)} group(s){src}: " + ", ".join(parts)


class _Rows:
    def __init__(self, lines: list[tuple[str, str]]) -> None:
        self.lines = lines

    def __call__(self, key: str, value: str) -> None:
        self.lines.append((key, value))


def render_info_table(infos: list[RecordingInfo], console: Console) -> None:
    """Print one ``ros2 bag info``-style block per recording.

    Args:
        infos: The summaries, one per file.
        console: Where to print (stdout's console).
    """
    for n, info in enumerate(infos):
        if n:
            console.print()
        lines: list[tuple[str, str]] = []

        row = _Rows(lines)

        row("File:", info.path)
        row("Size:", f"{_size(info.size_bytes)} ({info.size_bytes} bytes)")
        fmt = f"kvtool recording v{info.format_version}" if info.format_version else "kvtool"
        if info.kvtool_version:
            fmt += f", written by kvtool {info.kvtool_version}"
        row("Format:", fmt)
        if info.recorded_at or info.command_line:
            argv = list(info.command_line or [])
            if argv and os.path.basename(argv[0]) in ("kvtool", "__main__.py", "kvtool.exe"):
                argv[0] = "kvtool"
            by = f" by: {shlex.join(argv)}" if argv else ""
            row("Recorded:", f"{info.recorded_at or 'unknown time'}{by}")
        row("Duration:", f"{info.duration_s:.3f} s")
        row("Start:", _time(info.start_time))
        row("End:", _time(info.end_time))
        row("Batches:", str(info.batches))
        total = sum(info.events.values())
        by_type = ", ".join(f"{k} {v}" for k, v in info.events.items())
        row("Events:", f"{total} ({by_type})")
        row(
            "Blocks:",
            f"stored {info.blocks_stored} ({info.tokens_stored} tokens), "
            f"removed {info.blocks_removed}",
        )
        g = info.gaps
        if g.lost == 0 and g.recovered == 0:
            gaps = "none"
        else:
            gaps = f"recovered {g.recovered}, lost {g.lost}"
            if g.lost_ranges:
                gaps += f" (seq {_ranges(g.lost_ranges)})"
        row("Gaps:", f"{gaps} [from {g.source}]")
        row("Restarts:", str(info.restarts))
        if info.duplicates:
            row("Duplicates:", str(info.duplicates))
        if info.undecodable or info.skipped_events:
            row(
                "Undecodable:",
                f"{info.undecodable} payload(s), {info.skipped_events} event(s) skipped",
            )
        row("Groups:", _groups(info))
        if info.complete:
            status = "complete"
        elif info.truncated:
            status = "TRUNCATED (see the line on stderr)"
        else:
            status = "DAMAGED (see the line on stderr)"
        row("Status:", status)
        row("Channels:", str(len(info.channels)))
        width = max(len(k) for k, _ in lines) + 2
        for key, value in lines:
            text = Text(key.ljust(width), style="bold")
            text.append(value)
            console.print(text)
        rows = [("endpoint", "topic", "rank", "batches", "seq")]
        for c in info.channels:
            rows.append(
                (
                    c.endpoint,
                    c.topic or "''",
                    "-" if c.dp_rank is None else str(c.dp_rank),
                    str(c.batches),
                    "-" if c.seq_first is None else f"{c.seq_first}-{c.seq_last}",
                )
            )
        if info.channels:
            widths = [max(len(r[i]) for r in rows) for i in range(5)]
            for n_row, r in enumerate(rows):
                cells = [
                    r[i].rjust(widths[i]) if i in (2, 3) else r[i].ljust(widths[i])
                    for i in range(5)
                ]
                console.print(
                    Text("  " + "  ".join(cells).rstrip(), style="bold" if n_row == 0 else "")
                )


def render_info_json(infos: list[RecordingInfo], stream: TextIO) -> None:
    """Write the JSON contract: one object for one file, a list for several.

    Args:
        infos: The summaries, one per file.
        stream: Where to write (stdout).
    """
    objs = [i.to_json() for i in infos]
    payload: object = objs[0] if len(objs) == 1 else objs
    stream.write(json.dumps(payload, indent=2) + "\n")
