"""Render ``kvtool info`` summaries as a ``ros2 bag info``-style table or as JSON."""

from __future__ import annotations

import json
import os
import shlex
import textwrap
import time
from typing import TYPE_CHECKING, TextIO

from rich.text import Text

from kvtool.protocol import unknown_tags_text
from kvtool.recording.unconfirmed import unconfirmed_text
from kvtool.text import plural, printable

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.info import RecordingInfo
    from kvtool.recording.ledger import GroupMeta

MAX_WIDTH = 100
"""``kvtool info`` lines are at most this wide (narrower when the terminal is)."""


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


def collapse_groups(groups: list[GroupMeta]) -> list[str]:
    """Describe a group table compactly: consecutive groups alike share one entry.

    Args:
        groups: The table, any order.

    Returns:
        ``["0=full_attention", "1-5=sliding_window:64"]``: index or index range, kind,
        and ``:window`` when the kind has one; strings from the file made printable.
    """
    out: list[str] = []
    run: tuple[int, int, str, int | None] | None = None
    for g in sorted(groups, key=lambda g: g.group_idx):
        key = (printable(g.kind), g.sliding_window)
        if run is not None and run[1] + 1 == g.group_idx and (run[2], run[3]) == key:
            run = (run[0], g.group_idx, run[2], run[3])
            continue
        if run is not None:
            out.append(_group_text(*run))
        run = (g.group_idx, g.group_idx, *key)
    if run is not None:
        out.append(_group_text(*run))
    return out


def _group_text(first: int, last: int, kind: str, window: int | None) -> str:
    idx = str(first) if first == last else f"{first}-{last}"
    return f"{idx}={kind}" + (f":{window}" if window is not None else "")


def _groups(info: RecordingInfo) -> str:
    if info.groups is None:
        return "not stored"
    src = f" (from {printable(info.groups_source)})" if info.groups_source else ""
    return f"{plural(len(info.groups), 'group')}{src}: " + ", ".join(collapse_groups(info.groups))


def _status(info: RecordingInfo) -> str:
    if info.truncated:
        status = "TRUNCATED (see the line on stderr)"
    elif not info.complete:
        status = "DAMAGED (see the line on stderr)"
    else:
        status = "complete"
    if info.gaps.lost and info.complete:
        status += f"; {plural(info.gaps.lost, 'batch')} LOST while recording (see Gaps)"
    elif info.gaps.lost:
        status += f"; {plural(info.gaps.lost, 'batch')} missing (see Gaps)"
    if info.unconfirmed:
        status += f"; {plural(len(info.unconfirmed), 'channel tail')} UNCONFIRMED (see Unconfirmed)"
    return status


def _unconfirmed(info: RecordingInfo) -> str:
    """Name each unconfirmed tail: the words of the line on stderr, without the path."""
    return printable(unconfirmed_text(info.unconfirmed))


def _wrap(key: str, value: str, indent: int, width: int) -> list[str]:
    """Lay ``key value`` out in ``width`` columns, continuation lines under the value."""
    room = max(20, width - indent)
    lines = textwrap.wrap(
        value, room, break_long_words=True, break_on_hyphens=False, drop_whitespace=True
    ) or [""]
    return [key.ljust(indent) + lines[0]] + [" " * indent + line for line in lines[1:]]


class _Rows:
    def __init__(self, lines: list[tuple[str, str]]) -> None:
        self.lines = lines

    def __call__(self, key: str, value: str) -> None:
        self.lines.append((key, value))


def render_info_table(infos: list[RecordingInfo], console: Console) -> None:
    """Print one ``ros2 bag info``-style block per recording, at most 100 columns wide.

    Every string that comes from the file (endpoints, topics, kinds, the command line …)
    is made printable first: a recording cannot send a terminal escape sequences.

    Args:
        infos: The summaries, one per file.
        console: Where to print (stdout's console).
    """
    width = min(console.width, MAX_WIDTH)
    for n, info in enumerate(infos):
        if n:
            console.print()
        lines: list[tuple[str, str]] = []
        row = _Rows(lines)

        row("File:", printable(info.path))
        row("Size:", f"{_size(info.size_bytes)} ({plural(info.size_bytes, 'byte')})")
        fmt = (
            f"kvtool recording v{printable(info.format_version)}"
            if info.format_version is not None
            else "kvtool"
        )
        if info.kvtool_version:
            fmt += f", written by kvtool {printable(info.kvtool_version)}"
        row("Format:", fmt)
        if info.recorded_at or info.command_line:
            argv = list(info.command_line or [])
            if argv and os.path.basename(argv[0]) in ("kvtool", "__main__.py", "kvtool.exe"):
                argv[0] = "kvtool"
            by = f" by: {printable(shlex.join(argv))}" if argv else ""
            row("Recorded:", f"{printable(info.recorded_at or 'unknown time')}{by}")
        row("Duration:", f"{info.duration_s:.3f} s")
        row("Start:", _time(info.start_time))
        row("End:", _time(info.end_time))
        row("Batches:", f"{info.batches:,}")
        total = sum(info.events.values())
        by_type = ", ".join(f"{k} {v:,}" for k, v in info.events.items())
        row("Events:", f"{total:,} ({by_type})")
        row(
            "Blocks:",
            f"stored {info.blocks_stored:,} ({plural(info.tokens_stored, 'token')}), "
            f"removed {info.blocks_removed:,}",
        )
        g = info.gaps
        if g.lost == 0 and g.recovered == 0:
            gaps = "none"
        else:
            gaps = f"recovered {g.recovered:,}, lost {g.lost:,}"
            if g.lost_ranges:
                gaps += f" (seq {_ranges(g.lost_ranges)})"
        row("Gaps:", f"{gaps} [from {g.source}]")
        if info.unconfirmed:
            row("Unconfirmed:", _unconfirmed(info))
        row("Restarts:", f"{info.restarts:,}")
        if info.duplicates:
            row("Duplicates:", f"{info.duplicates:,}")
        # Events of an unknown tag decode (they are a newer vLLM's): not undecodable.
        undecodable_events = info.skipped_events - sum(info.unknown_events.values())
        if info.undecodable or undecodable_events:
            row(
                "Undecodable:",
                f"{plural(info.undecodable, 'payload')}, "
                f"{plural(undecodable_events, 'event')} skipped",
            )
        if info.unknown_events:
            row("Unknown events:", unknown_tags_text(info.unknown_events))
        row("Groups:", _groups(info))
        if info.pool_blocks is not None:
            row(
                "Pool:",
                f"{info.pool_blocks:,} blocks (num_gpu_blocks; {info.pool_blocks - 1:,} usable)",
            )
        if info.source_like == "sglang":
            row(
                "Source:",
                "SGLang-like (signed hashes, no group_idx, a clear at seq 0): one ungrouped "
                "stream; sliding-window evictions send no event",
            )
        row("Status:", _status(info))
        row("Channels:", f"{len(info.channels):,}")
        indent = max(len(k) for k, _ in lines) + 2
        for key, value in lines:
            for k, line in enumerate(_wrap(key, value, indent, width)):
                text = Text(line[:indent], style="bold" if k == 0 else "")
                text.append(line[indent:])
                console.print(text, soft_wrap=True)
        rows = [("endpoint", "topic", "rank", "batches", "seq")]
        for c in info.channels:
            rows.append(
                (
                    printable(c.endpoint),
                    printable(c.topic) or "''",
                    "-" if c.dp_rank is None else str(c.dp_rank),
                    f"{c.batches:,}",
                    "-" if c.seq_first is None else f"{c.seq_first}-{c.seq_last}",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        if info.channels and 2 + sum(widths) + 2 * 4 > width:
            # Too wide for a table (long endpoints): one block per channel instead.
            for r in rows[1:]:
                where = f"{r[0]} topic {r[1]}"
                for line in textwrap.wrap(where, width - 2, break_on_hyphens=False):
                    console.print(Text("  " + line, style="bold"), soft_wrap=True)
                console.print(Text(f"    rank {r[2]}, {r[3]} batches, seq {r[4]}"), soft_wrap=True)
        elif info.channels:
            for n_row, r in enumerate(rows):
                cells = [
                    r[i].rjust(widths[i]) if i in (2, 3) else r[i].ljust(widths[i])
                    for i in range(5)
                ]
                console.print(
                    Text("  " + "  ".join(cells).rstrip(), style="bold" if n_row == 0 else ""),
                    soft_wrap=True,
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
