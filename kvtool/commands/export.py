"""``kvtool export``: the flat block-event table of recordings as Parquet or CSV."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvtool.commands import check_inputs, examples, get_env, missing_batches
from kvtool.commands._options import (
    Channels,
    GroupMeta,
    GroupsFile,
    Ranks,
    ReportMode,
    ReportModeOption,
    Since,
    Until,
)
from kvtool.errors import ExitStatus
from kvtool.text import plural, printable


def export(
    files: Annotated[
        list[Path],
        typer.Argument(help="Recordings (.mcap).", show_default=False, metavar="FILE..."),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            metavar="OUT",
            help="OUT.parquet (one file), OUT.csv, or a directory "
            "(Parquet partitioned by channel and dp_rank, hive style).",
        ),
    ],
    groups: GroupsFile = None,
    group: GroupMeta = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Replace an existing file at OUT, or a directory kvtool exported to "
            "(never another directory).",
        ),
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
    since: Since = None,
    until: Until = None,
    rank: Ranks = None,
    channel: Channels = None,
    report_mode: ReportModeOption = ReportMode.auto,
) -> ExitStatus:
    """Write the flat table (one row per block event, annotated) to Parquet or CSV.

    Columns: log_time, ts, seq, recording, channel, channel_id, dp_rank, type, group_idx,
    kind, sliding_window, hash (signed 64-bit), tokens (the event's, on its first row),
    medium, event_index, block_index, block_count, then the report's verdicts:
    recomputed, and meaning (what the store or remove was: new_entry, partial_primary,
    recomputed, stored_while_live, partial_extra, rekey, discarded_checkpoint,
    hit_announcement, eviction, evicted_extra_key, partial_promotion, rekey_remove,
    checkpoint_discard, orphan, clear; --report-mode as for report). Recordings are read
    chunk by chunk.
    The format follows OUT: .parquet, .csv, or a directory (partitioned Parquet).
    """
    # Imported here, not with the command list (polars): `kvtool --help` needs none of it.
    from kvtool.columns import ReadStats
    from kvtool.export import export_table
    from kvtool.render.progress import input_size
    from kvtool.selection import make_selection, selection_note

    env = get_env()
    check_inputs([*files, groups])
    stats = ReadStats()
    select = make_selection(channel=channel, rank=rank, since=since, until=until)
    with env.progress(
        f"exporting {plural(len(files), 'recording')}", input_size(files), quiet=quiet
    ) as bar:
        result = export_table(
            files,
            output,
            groups_file=groups,
            group_flags=group or None,
            force=force,
            stats=stats,
            select=select,
            progress=bar.update if bar.shown else None,
            report_mode=report_mode.value,
        )
    note = selection_note(
        [("--channel", channel), ("--rank", rank), ("--since", since), ("--until", until)],
        stats.messages,
        stats.unselected,
    )
    if note is not None:
        env.err.print(f"kvtool: {note}", markup=False, highlight=False)
    if not quiet:
        env.err.print(
            f"kvtool: exported {plural(result.rows, 'row')} ({plural(stats.events, 'event')}, "
            f"{plural(stats.messages, 'batch')}) to {output}",
            markup=False,
            highlight=False,
        )
    # Batches lost while recording, and tails never confirmed, exit 3, said in the words
    # of `info` and `report` (one policy for every reader).
    lost = missing_batches(files)
    problems = stats.damaged + lost + stats.problems[:1]
    for line in problems:
        env.err.print(f"kvtool: {printable(line)}", markup=False, highlight=False)
    return (
        ExitStatus.DAMAGED
        if (stats.damaged or lost or stats.lost or stats.bad_batches or stats.skipped_events)
        else ExitStatus.OK
    )


COMMANDS = {"export": export}
COMMAND_OPTIONS = {
    "export": {
        "epilog": examples(
            "export run.mcap -o events.parquet",
            "export run.mcap -o events.csv",
            "export rank0.mcap rank1.mcap -o fleet/",
        )
    }
}
HELP_PANELS = {
    "export": {
        "Filters": ["--since", "--until", "--rank", "--channel", "--clock"],
        "Annotation": ["--groups", "--group-meta", "--report-mode"],
        "Output": ["--output", "--force", "--quiet"],
    }
}
