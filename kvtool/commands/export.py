"""``kvtool export``: the flat block-event table of recordings as Parquet or CSV."""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.parse
from pathlib import Path
from typing import Annotated

import polars as pl
import typer

from kvtool.columns import (
    TABLE_SCHEMA,
    UNANNOTATED,
    ReadStats,
    iter_annotated,
)
from kvtool.commands import get_env
from kvtool.errors import ExitStatus, KvtoolError, UsageError

PARTITION_COLUMNS = ("channel", "dp_rank")


def _export_frame(df: pl.DataFrame) -> pl.DataFrame:
    """The exported columns: TABLE_SCHEMA, kind ``unannotated`` for blocks without one."""
    return df.with_columns(
        kind=pl.when(pl.col("kind").is_null() & (pl.col("type") != "AllBlocksCleared"))
        .then(pl.lit(UNANNOTATED))
        .otherwise(pl.col("kind"))
    ).select(list(TABLE_SCHEMA))


def _partition_dir(root: Path, channel: str | None, rank: int | None) -> Path:
    ch = urllib.parse.quote(channel or "", safe="")
    rk = "__HIVE_DEFAULT_PARTITION__" if rank is None else str(rank)
    return root / f"channel={ch}" / f"dp_rank={rk}"


def export(
    files: Annotated[
        list[Path], typer.Argument(help="Recordings (.mcap).", show_default=False)
    ],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="OUT.parquet (one file), OUT.csv, or a directory "
                     "(Parquet partitioned by channel and dp_rank, hive style)."),
    ],
    groups: Annotated[
        Path | None, typer.Option("--groups", help="KV cache group metadata JSON.")
    ] = None,
    group: Annotated[
        list[str] | None, typer.Option("--group", help="Group metadata as IDX=KIND[:WINDOW].")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite OUT.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
) -> ExitStatus:
    """Write the flat table (one row per block event, annotated) to Parquet or CSV.

    Columns: log_time, ts, seq, recording, channel, channel_id, dp_rank, type, group_idx,
    kind, sliding_window, hash (signed 64-bit), tokens (the event's, on its first row),
    medium, event_index, block_index, block_count. Recordings are read chunk by chunk.
    """
    env = get_env()
    out = output
    suffix = out.suffix.lower()
    as_dir = out.is_dir() or str(out).endswith(os.sep) or suffix == ""
    if not as_dir and suffix not in (".parquet", ".csv"):
        raise UsageError(
            f"{out}: unknown output type {suffix!r}; use .parquet, .csv or a directory"
        )
    if out.exists() and not force and not (as_dir and out.is_dir() and not any(out.iterdir())):
        raise UsageError(f"{out}: exists; pass --force to overwrite it")
    stats = ReadStats()
    chunks = iter_annotated(
        [str(f) for f in files],
        groups_file=str(groups) if groups is not None else None,
        group_flags=group or None,
        stats=stats,
    )
    rows = 0
    try:
        if as_dir:
            if out.exists() and force:
                shutil.rmtree(out) if out.is_dir() else out.unlink()
            out.mkdir(parents=True, exist_ok=True)
            for n, chunk in enumerate(chunks):
                frame = _export_frame(chunk)
                rows += frame.height
                for (ch, rk), part in frame.group_by(PARTITION_COLUMNS, maintain_order=True):
                    d = _partition_dir(out, ch, rk)  # type: ignore[arg-type,unused-ignore]
                    d.mkdir(parents=True, exist_ok=True)
                    part.drop(PARTITION_COLUMNS).write_parquet(d / f"part-{n:05d}.parquet")
        elif suffix == ".csv":
            with open(out, "w" if force else "x", newline="") as f:
                for n, chunk in enumerate(chunks):
                    frame = _export_frame(chunk)
                    rows += frame.height
                    frame.write_csv(f, include_header=(n == 0))
                if rows == 0:
                    _export_frame(chunk_empty()).write_csv(f)
        else:
            # Parquet has no append: spill chunks to Arrow IPC, then stream them into one file.
            with tempfile.TemporaryDirectory(prefix="kvtool-export-",
                                             dir=out.parent if str(out.parent) else None) as tmp:
                parts = []
                for n, chunk in enumerate(chunks):
                    frame = _export_frame(chunk)
                    rows += frame.height
                    p = Path(tmp) / f"{n:05d}.arrow"
                    frame.write_ipc(p)
                    parts.append(str(p))
                if force and out.exists():
                    out.unlink()
                if parts:
                    pl.scan_ipc(parts).sink_parquet(out)
                else:
                    _export_frame(chunk_empty()).write_parquet(out)
    except FileExistsError:
        raise UsageError(f"{out}: exists; pass --force to overwrite it") from None
    except OSError as err:
        raise KvtoolError(f"{out}: cannot write: {err.strerror or err}") from err
    if not quiet:
        env.err.print(
            f"kvtool: exported {rows} rows ({stats.events} events, {stats.messages} batches) "
            f"to {out}",
            markup=False, highlight=False,
        )
    problems = stats.damaged + stats.problems[:1]
    for line in problems:
        env.err.print(f"kvtool: {line}", markup=False, highlight=False)
    return ExitStatus.DAMAGED if (stats.damaged or stats.bad_batches or stats.skipped_events) \
        else ExitStatus.OK


def chunk_empty() -> pl.DataFrame:
    """An empty table chunk (no rows), for writing a header-only output."""
    from kvtool.columns import empty_table

    return empty_table()


COMMANDS = {"export": export}
