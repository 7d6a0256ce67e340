"""Export and copy as library calls: the flat table to Parquet/CSV, selected batches to MCAP.

Both follow kvtool's output rule (:mod:`kvtool.outputs`): never over an input, ``force``
replaces a file or a directory kvtool created, and nothing is in place until it is complete.

- :func:`export_table` writes the flat block-event table (one row per block event,
  annotated) to one Parquet file, one CSV file, or a directory of Parquet files
  partitioned hive-style by ``channel`` and ``dp_rank``. Every Parquet file carries the
  key-value metadata key :data:`kvtool.outputs.PARQUET_KEY` (for readers); a directory
  holds the empty :data:`kvtool.outputs.EXPORT_MARKER` directory, by which ``--force``
  knows kvtool created it.
- :class:`RecordingCopy` (``replay -o``) writes selected batches, payload bytes
  unchanged, to a new recording under a temporary name, renamed into place on
  :meth:`RecordingCopy.close`; :func:`copy_batches` drives it over an iterable.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
import urllib.parse
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING

import kvtool
from kvtool.errors import OutputError, UsageError
from kvtool.outputs import (
    EXPORT_MARKER,
    PARQUET_KEY,
    AtomicFile,
    OutputKind,
    check_output,
    is_stdout,
    kvtool_made,
    mark_kvtool_made,
    temp_prefix,
    track_temp,
    untrack_temp,
)

if TYPE_CHECKING:
    import polars as pl

    from kvtool.annotate import GroupTable
    from kvtool.columns import Progress, ReadStats, TableAnnotator
    from kvtool.recording import RecordedMessage, RecordingReader, RecordingWriter
    from kvtool.replay import BatchFilter
    from kvtool.report.attribution import GroupKind

PARTITION_COLUMNS = ("channel", "dp_rank")

PathLike = str | os.PathLike[str]


class ExportLayout(StrEnum):
    """The three shapes of an export."""

    PARQUET = "parquet"
    CSV = "csv"
    DIRECTORY = "directory"


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_table` wrote.

    Attributes:
        path: The output.
        layout: Its shape.
        rows: Table rows written.
        files: Files written (relative to ``path`` for a directory).
    """

    path: Path
    layout: ExportLayout
    rows: int
    files: tuple[str, ...]


def export_layout(output: PathLike) -> ExportLayout:
    """Return the layout an output path asks for.

    A path that is a directory, ends with a separator or has no suffix is a directory;
    ``.parquet`` and ``.csv`` are one file each.

    Args:
        output: The ``-o`` path.

    Returns:
        The layout.

    Raises:
        UsageError: ``-`` (export writes files) or an unknown suffix.
    """
    if is_stdout(output):
        raise UsageError("export -o -: export writes files; give OUT.parquet, OUT.csv or a DIR")
    text = os.fspath(output)
    p = Path(text)
    suffix = p.suffix.lower()
    if p.is_dir() or text.endswith(os.sep) or suffix == "":
        return ExportLayout.DIRECTORY
    if suffix == ".parquet":
        return ExportLayout.PARQUET
    if suffix == ".csv":
        return ExportLayout.CSV
    raise UsageError(f"{text}: unknown output type {suffix!r}; use .parquet, .csv or a directory")


def _parquet_metadata() -> dict[str, str]:
    return {PARQUET_KEY: json.dumps({"kvtool_version": kvtool.__version__, "table": "events"})}


TIME_AND_HASH_COLUMNS = ("receive_time", "publish_time", "hash_hex")
"""Exported after the table's own columns (:data:`kvtool.columns.TABLE_SCHEMA`)."""
DERIVED_COLUMNS = ("recomputed", "meaning")
"""Exported last: per row, what the report's state kernel said (``recomputed``: a store of
a key stored earlier and not live now; summed per group, the report's blocks_recomputed;
``meaning``: what the store or remove meant, issue 21, :mod:`kvtool.report.meaning`)."""


def _hash_hex(hashes: pl.Series) -> pl.Series:
    """16 lower-case hex digits of each 64-bit hash key: ``replay --hash-format hex``'s form.

    One rule in both (issue 24): the hash's 64-bit key as unsigned, zero-padded to 16
    digits; a 32-byte hash's key is its last 8 bytes (vLLM's conversion, the table's
    ``hash``), so ``hash_hex`` joins ``replay --hash-format hex`` on equality. Every digit
    is kept: a hash ending in a zero byte (about 1 in 256) is 16 digits too.
    """
    import numpy as np
    import polars as pl

    hex_digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    raw = hashes.fill_null(0).to_numpy().astype(">i8").view(np.uint8).reshape(-1, 8)
    digits = np.empty((raw.shape[0], 16), dtype=np.uint8)
    digits[:, 0::2] = hex_digits[raw >> 4]
    digits[:, 1::2] = hex_digits[raw & 15]
    # Never NUL bytes, so the S16 view keeps all 16 (it drops trailing NULs: the old bug).
    strings = np.frombuffer(digits.tobytes(), dtype="S16").astype("U16")
    out = pl.Series("hash_hex", strings, dtype=pl.String)
    return pl.select(pl.when(hashes.is_not_null()).then(out)).to_series().alias("hash_hex")


def _gather(
    values: list[object], dtype: type[pl.DataType], at: pl.Series, none: pl.Series
) -> pl.Series:
    """``values[at]``, null where ``none``."""
    import polars as pl

    col = pl.Series(values or [None], dtype=dtype).gather(at)
    return col.set(none, None)


def _report_rows(
    chunks: Iterable[pl.DataFrame],
    group_kind: GroupKind | None,
    report_mode: str | None = None,
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    """Each chunk with its report rows and the state kernel's verdicts.

    Per row: (group_idx, kind, sliding_window), ``recomputed`` (issue 20; summed per
    group, the report's blocks_recomputed) and ``meaning`` (issue 21,
    :mod:`kvtool.report.meaning`; counted per group, the report's columns). One builder
    gives them all, in ``report_mode`` (None: the annotator's, else ``auto``); hit
    announcements are told apart as in ``report`` where the chunks carry ``parent`` and
    ``origin`` (:func:`_tables`).

    The chunks go through the report's own builder, so every block is filed as ``report``
    files it (issue 24): a store under its kind (:func:`kvtool.annotate.kind_label`: a kind
    spelled like kvtool's labels is ``kind:NAME``), a remove under its group's, a remove
    without ``group_idx`` under the one group its hash is live in, else ``unattributed``
    (:mod:`kvtool.report.attribution`); a clear under none (all null).
    """
    import numpy as np
    import polars as pl

    from kvtool.report import kernel
    from kvtool.report.builder import ReportBuilder
    from kvtool.report.meaning import codes, labels

    b = ReportBuilder(None, group_kind, report_mode=report_mode)
    b.kstate = kernel.State(b.max_keys)  # no lifetime bound: export has no lifetimes
    for df in chunks:
        b.add(df)
        keys = list(b.registry)  # in gkey order: gkey i is the i-th key registered
        gkey = b.row_gkey
        at = pl.Series(np.where(gkey < 0, 0, gkey), dtype=pl.UInt32)
        none = pl.Series(gkey < 0)

        rows = pl.DataFrame(
            {
                "group_idx": _gather([k[0] for k in keys], pl.Int64, at, none),
                "kind": _gather([k[1] for k in keys], pl.String, at, none),
                "sliding_window": _gather([k[2] for k in keys], pl.Int64, at, none),
                "recomputed": pl.Series(b.row_what == kernel.RECOMPUTED, dtype=pl.Boolean),
                "meaning": labels(codes(b.row_what, b.row_note, df["type_code"].to_numpy())),
            }
        )
        yield df, rows


def _tables(
    paths: Sequence[str],
    stats: ReadStats,
    annotator: TableAnnotator,
    select: BatchFilter | None,
    progress: Progress | None,
) -> Iterator[pl.DataFrame]:
    """The annotated table chunks, with the columns the report reads beyond the flat table.

    Read without labels (as ``report`` reads), so that ``parent`` and ``origin`` stay
    (hit announcements, R6); :func:`_labelled` adds the labels before writing.
    """
    from kvtool.columns import iter_tables

    for df in iter_tables(paths, stats=stats, labels=False, select=select, progress=progress):
        yield annotator(df, stats)


def _labelled(df: pl.DataFrame, stats: ReadStats) -> pl.DataFrame:
    """Add the ``recording``, ``channel`` and ``type`` columns (as a labelled read has them)."""
    import polars as pl

    from kvtool.columns import EVENT_TYPE
    from kvtool.columns.base import EVENT_TYPE_NAMES

    names = {cid: (ref.recording, ref.info.name) for cid, ref in stats.channels.items()}
    recs = pl.DataFrame(
        {
            "channel_id": list(names),
            "recording": [v[0] for v in names.values()],
            "channel": [v[1] for v in names.values()],
        },
        schema={"channel_id": pl.UInt32, "recording": pl.String, "channel": pl.String},
    )
    return df.join(recs, on="channel_id", how="left", maintain_order="left").with_columns(
        type=pl.col("type_code")
        .cast(pl.Int64)
        .replace_strict([0, 1, 2], list(EVENT_TYPE_NAMES), return_dtype=EVENT_TYPE)
    )


def _export_frame(df: pl.DataFrame, rows: pl.DataFrame) -> pl.DataFrame:
    """The exported columns.

    TABLE_SCHEMA with ``group_idx``, ``kind`` and ``sliding_window`` from the rows' report
    rows (:func:`_report_rows`; ``unannotated`` for blocks without a kind), then the same
    instants as timestamp types (``receive_time`` from ``log_time``, ``publish_time`` from
    ``ts``, UTC, ns) and ``hash_hex``, the hash as ``replay --format jsonl --hash-format
    hex`` shows it.
    """
    import polars as pl

    from kvtool.columns import TABLE_SCHEMA

    out = df.with_columns(
        group_idx=rows["group_idx"].cast(df.schema["group_idx"]),
        kind=rows["kind"],
        sliding_window=rows["sliding_window"].cast(df.schema["sliding_window"]),
    ).select(list(TABLE_SCHEMA))
    return out.with_columns(
        receive_time=pl.col("log_time").cast(pl.Datetime("ns", "UTC")),
        publish_time=(pl.col("ts") * 1e9)
        .round()
        .cast(pl.Int64, strict=False)
        .cast(pl.Datetime("ns", "UTC")),
        hash_hex=_hash_hex(out["hash"]),
    )


def _empty_frame() -> pl.DataFrame:
    import polars as pl

    from kvtool.columns import empty_table

    rows = pl.DataFrame(
        schema={"group_idx": pl.Int64, "kind": pl.String, "sliding_window": pl.Int64}
    )
    return _export_frame(empty_table(), rows).with_columns(
        recomputed=pl.lit(False, pl.Boolean), meaning=pl.lit(None, pl.String)
    )


def _partition_dir(channel: str | None, rank: int | None) -> str:
    ch = urllib.parse.quote(channel or "", safe="")
    rk = "__HIVE_DEFAULT_PARTITION__" if rank is None else str(rank)
    return f"channel={ch}/dp_rank={rk}"


def export_table(
    files: Sequence[PathLike],
    output: PathLike,
    *,
    groups_file: PathLike | None = None,
    group_flags: Sequence[str] | None = None,
    force: bool = False,
    stats: ReadStats | None = None,
    select: BatchFilter | None = None,
    progress: Progress | None = None,
    report_mode: str | None = None,
) -> ExportResult:
    """Write the annotated flat table of ``files`` to ``output`` (Parquet, CSV or a directory).

    Recordings are read chunk by chunk; nothing appears at ``output`` until the export is
    complete, and a failure leaves what was there before.

    Args:
        files: Recordings.
        output: ``OUT.parquet``, ``OUT.csv`` or a directory (see :func:`export_layout`).
        groups_file: ``--groups FILE``.
        group_flags: ``--group IDX=KIND[:WINDOW]`` flags.
        force: Replace a file at ``output``, or a directory kvtool exported to.
        stats: Receives read counts and problems.
        select: Export only these batches (``--channel``, ``--rank``, ``--since``,
            ``--until``: the selection of :func:`kvtool.columns.iter_raw_chunks`).
        progress: Called with (bytes done, bytes total) of the input files.
        report_mode: How parentless stores are read (``--report-mode``: ``auto``,
            ``full``, ``incremental``; None: ``auto``), as ``report`` reads them.

    Returns:
        What was written.

    Raises:
        OutputError: The output rule refuses ``output``, or writing fails.
        UsageError: An unknown output suffix.
        MetadataError: Invalid group metadata.
        RecordingError: A recording cannot be opened.
    """
    from kvtool.columns import ReadStats, make_annotator

    layout = export_layout(output)
    out = Path(output)
    inputs = [*files, *([groups_file] if groups_file is not None else [])]
    kind = {
        ExportLayout.PARQUET: OutputKind.PARQUET,
        ExportLayout.CSV: OutputKind.TEXT,
        ExportLayout.DIRECTORY: OutputKind.EXPORT_DIR,
    }[layout]
    check_output(out, kind=kind, force=force, inputs=inputs)
    st = stats if stats is not None else ReadStats()
    paths = [os.fspath(f) for f in files]
    annotator = make_annotator(
        paths,
        groups_file=os.fspath(groups_file) if groups_file is not None else None,
        group_flags=group_flags or None,
    )
    annotated = _tables(paths, st, annotator, select, progress)
    chunks = (
        _export_frame(_labelled(c, st), rows).with_columns(
            recomputed=rows["recomputed"], meaning=rows["meaning"]
        )
        for c, rows in _report_rows(annotated, annotator.group_kind, report_mode)
    )
    try:
        if layout is ExportLayout.DIRECTORY:
            rows, written = _write_directory(out, chunks, force=force)
        elif layout is ExportLayout.CSV:
            rows, written = _write_csv(out, chunks, force=force)
        else:
            rows, written = _write_parquet(out, chunks, force=force)
    except OSError as err:
        raise OutputError(f"{out}: cannot write: {err.strerror or err}") from err
    return ExportResult(path=out, layout=layout, rows=rows, files=written)


def _write_csv(
    out: Path, chunks: Iterator[pl.DataFrame], *, force: bool
) -> tuple[int, tuple[str, ...]]:
    rows = 0
    with AtomicFile(out, force=force) as af, af.open_text() as f:
        n = -1
        for n, frame in enumerate(chunks):
            rows += frame.height
            _csv_cells(frame).write_csv(f, include_header=(n == 0))
        if n < 0:
            _empty_frame().write_csv(f)
    return rows, (out.name,)


def _csv_cells(frame: pl.DataFrame) -> pl.DataFrame:
    """Every text cell as the report's CSV writes it: :func:`kvtool.text.csv_text`.

    A kind, channel or path from a recording is made printable and cannot start a formula
    (``=HYPERLINK(``, ``@SUM(``) in a spreadsheet (issue 24). Vectorised: only cells with a
    character outside printable ASCII go through :func:`kvtool.text.printable` one by one.
    """
    import polars as pl

    from kvtool.text import csv_text

    out = frame
    for c, t in frame.schema.items():
        if t != pl.String:
            continue
        col = frame[c]
        odd = (col.str.contains(r"[^\x20-\x7e]") | col.str.contains(r"^[=+\-@]")).fill_null(False)
        if not odd.any():
            continue
        at = odd.arg_true()
        cells = [csv_text(v) for v in col.gather(at).to_list()]
        out = out.with_columns(col.scatter(at, pl.Series(cells, dtype=pl.String)))
    return out


def _write_parquet(
    out: Path, chunks: Iterator[pl.DataFrame], *, force: bool
) -> tuple[int, tuple[str, ...]]:
    import polars as pl

    rows = 0
    # Parquet has no append: spill chunks to Arrow IPC beside the output, then stream
    # them into one file.
    with (
        AtomicFile(out, force=force) as af,
        tempfile.TemporaryDirectory(
            prefix=temp_prefix(out.name), suffix=".kvtool-tmp", dir=out.parent
        ) as tmp,
    ):
        track_temp(tmp, is_dir=True)
        parts = []
        for n, frame in enumerate(chunks):
            rows += frame.height
            p = Path(tmp) / f"{n:05d}.arrow"
            frame.write_ipc(p)
            parts.append(str(p))
        if parts:
            pl.scan_ipc(parts).sink_parquet(af.tmp, metadata=_parquet_metadata())
        else:
            _empty_frame().write_parquet(af.tmp, metadata=_parquet_metadata())
    untrack_temp(tmp)
    return rows, (out.name,)


def _write_directory(
    out: Path, chunks: Iterator[pl.DataFrame], *, force: bool
) -> tuple[int, tuple[str, ...]]:
    """Write the hive layout into a new directory beside ``out``, then swap it in."""
    resolved = out.resolve()
    parent = resolved.parent
    new = Path(
        tempfile.mkdtemp(prefix=temp_prefix(resolved.name), suffix=".kvtool-tmp", dir=parent)
    )
    track_temp(new, is_dir=True)
    rows = 0
    written: list[str] = []
    try:
        for n, frame in enumerate(chunks):
            rows += frame.height
            for (ch, rk), part in frame.group_by(PARTITION_COLUMNS, maintain_order=True):
                rel = f"{_partition_dir(ch, rk)}/part-{n:05d}.parquet"  # type: ignore[arg-type,unused-ignore]
                (new / rel).parent.mkdir(parents=True, exist_ok=True)
                part.drop(PARTITION_COLUMNS).write_parquet(new / rel, metadata=_parquet_metadata())
                written.append(rel)
        mark_kvtool_made(new)
        os.chmod(new, 0o777 & ~_umask())
        _swap_in(new, resolved, force=force)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)  # only ever the new directory kvtool made
        untrack_temp(new)  # not reached if the removal is cut short: then it goes at exit
        raise
    untrack_temp(new)
    return rows, tuple(written)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _swap_in(new: Path, out: Path, *, force: bool) -> None:
    """Put the finished directory ``new`` at ``out``; the old one goes only if kvtool made it."""
    if not out.exists():
        try:
            os.rename(new, out)
        except OSError as err:
            raise OutputError(f"{out}: cannot move the export into place: {err.strerror}") from err
        return
    # Checked again now: the directory may have changed since check_output.
    check_output(out, kind=OutputKind.EXPORT_DIR, force=force)
    with contextlib.suppress(OSError):
        # The directory the user made (or kept) keeps its permissions: a private
        # `chmod 700` one must not come back world-readable.
        os.chmod(new, stat.S_IMODE(out.stat().st_mode))
    old = Path(tempfile.mkdtemp(prefix=temp_prefix(out.name), suffix=".kvtool-old", dir=out.parent))
    os.rmdir(old)
    os.rename(out, old)
    # The authoritative check runs on the directory once it is moved aside: nothing can
    # enter it by its old path any more, so a directory that changed after the check above
    # (its marker gone, or an empty one filled) goes back untouched.
    if not (kvtool_made(old) or not any(old.iterdir())):
        os.rename(old, out)
        raise OutputError(
            f"{out}: a directory kvtool did not create (no {EXPORT_MARKER} in it); --force "
            "replaces only a directory kvtool exported to, choose another path"
        )
    try:
        os.rename(new, out)
    except OSError:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)  # kvtool's own directory, moved aside


# -- replay -o: the selected batches, bytes unchanged ----------------------------------------


class RecordingCopy:
    """A new recording of selected batches, payload bytes unchanged (``replay -o``).

    Written under a temporary name beside ``output`` and renamed into place by
    :meth:`close`; :meth:`abort` (or an exception in a ``with`` block) leaves ``output``
    as it was. ``-`` writes the recording to ``stream`` instead.

    Args:
        output: The new recording's path, or ``-``.
        sources: The recordings read (their paths are the inputs; their group metadata is
            copied unless ``given`` is set).
        given: Group metadata given on the command line, stored instead.
        force: Replace an existing kvtool recording at ``output``.
        stream: The binary stream for ``-``.

    Attributes:
        written: Batches written.

    Raises:
        RecordingPathError: The output rule refuses ``output``.
    """

    def __init__(
        self,
        output: PathLike,
        sources: Sequence[RecordingReader],
        *,
        given: GroupTable | None = None,
        force: bool = False,
        stream: IO[bytes] | None = None,
    ) -> None:
        from kvtool.recording import RecordingWriter

        self.path = os.fspath(output)
        if is_stdout(self.path) and stream is None:
            raise UsageError("-o -: no stream to write the recording to")
        self.writer: RecordingWriter = RecordingWriter(
            self.path,
            force=force,
            inputs=[r.path for r in sources],
            atomic=True,
            stream=stream if is_stdout(self.path) else None,
            context={"replayed_from": [str(r.path) for r in sources]},
        )
        self.channels: dict[tuple[str, str], int] = {}
        self.written = 0
        self._store_groups(sources, given)

    def _store_groups(self, sources: Sequence[RecordingReader], given: GroupTable | None) -> None:
        """Store the group metadata the copy is annotated with, as the sources' report sees it.

        ``--groups FILE`` replaces the sources' metadata; ``--group-meta`` flags merge over
        each stored table (issue 24). ``get_kv_cache_group_metadata()``'s list has no place
        for ``none=KIND[:WINDOW]`` (and may not be empty), so that rule goes into a
        ``kvtool.ungrouped`` record of its own (issue 21: an empty ``kvtool.groups`` record
        made the copy DAMAGED); a source's own such record is copied unless the flag
        replaces it. The payload bytes stay as received (DESIGN.md), so the events cannot
        carry the kind themselves.
        """
        from kvtool.annotate import groups_from_list, merge_over
        from kvtool.recording import format as rfmt

        if given is not None and not given.partial:
            self.writer.add_groups(given.to_metadata(), given.source)
            return
        stored = False
        for r in sources:
            meta = r.read_metadata()
            for rec in meta.get(rfmt.META_GROUPS, []):
                g = rec.get("groups")
                ch = rec.get("channel")
                if not isinstance(g, list):
                    continue
                source = str(rec.get("source") or r.path)
                if given is not None:
                    # --group-meta flags: merged over the recording's own table (issue 24).
                    table = merge_over(given, groups_from_list(g, source=source))
                    g, source = table.to_metadata(), table.source
                self.writer.add_groups(g, source, ch if isinstance(ch, str) else None)
                stored = True
            if given is None or given.ungrouped is None:
                for rec in meta.get(rfmt.META_UNGROUPED, []):
                    self.writer.add_metadata(rfmt.META_UNGROUPED, dict(rec))
        if given is None:
            return
        if given.groups and not stored and sorted(given.groups) == list(range(len(given.groups))):
            # Flags alone are a table only when they name groups 0..N-1 as vLLM numbers
            # them; any other set cannot be stored as one (the record would be damaged).
            self.writer.add_groups(given.to_metadata(), given.source)
        rule = given.ungrouped_metadata()
        if rule is not None:
            self.writer.add_metadata(rfmt.META_UNGROUPED, rule)

    def __enter__(self) -> RecordingCopy:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, m: RecordedMessage) -> None:
        """Append one recorded message to the copy, bytes and times unchanged.

        Args:
            m: A message read from one of the sources.
        """
        ch = m.channel
        key = (ch.endpoint, ch.topic)
        cid = self.channels.get(key)
        if cid is None:
            cid = self.channels[key] = self.writer.add_channel(ch.endpoint, ch.topic, ch.dp_rank)
        self.writer.write(cid, m.seq, m.data, m.log_time, m.publish_time)
        self.written += 1

    def close(self) -> None:
        """Finish the recording and move it into place."""
        self.writer.close()

    def abort(self) -> None:
        """Drop the unfinished copy; ``output`` stays as it was."""
        self.writer.abort()


def copy_batches(
    messages: Iterable[RecordedMessage],
    output: PathLike,
    sources: Sequence[RecordingReader],
    *,
    given: GroupTable | None = None,
    force: bool = False,
    stream: IO[bytes] | None = None,
) -> int:
    """Copy ``messages`` into a new recording at ``output`` (see :class:`RecordingCopy`).

    Args:
        messages: The selected messages, in the order to write them.
        output: The new recording, or ``-`` with ``stream``.
        sources: The recordings the messages come from.
        given: Group metadata to store instead of the sources'.
        force: Replace an existing kvtool recording at ``output``.
        stream: The binary stream for ``-``.

    Returns:
        Batches written.

    Raises:
        RecordingPathError: The output rule refuses ``output``.
        RecordingError: Writing failed (``output`` is left as it was).
    """
    with RecordingCopy(output, sources, given=given, force=force, stream=stream) as copy:
        for m in messages:
            copy.write(m)
    return copy.written


__all__ = [
    "DERIVED_COLUMNS",
    "PARTITION_COLUMNS",
    "TIME_AND_HASH_COLUMNS",
    "ExportLayout",
    "ExportResult",
    "RecordingCopy",
    "copy_batches",
    "export_layout",
    "export_table",
]
