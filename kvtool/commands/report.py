"""``kvtool report``: per-kind, per-window and per-group tables of stores and evictions."""

from __future__ import annotations

import io
import os
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvtool.commands import (
    check_inputs,
    examples,
    get_env,
    missing_batches,
    parse_duration_ns,
)
from kvtool.commands._options import (
    Channels,
    GroupMeta,
    GroupsFile,
    PoolBlocks,
    Ranks,
    ReportMode,
    ReportModeOption,
    Since,
    Until,
)
from kvtool.errors import ExitStatus, UsageError
from kvtool.outputs import OutputKind, check_output, is_stdout, write_text
from kvtool.text import plural, printable

if TYPE_CHECKING:
    from kvtool.report import Report as ReportT

# The report library (polars, numpy: ~0.25 s) is imported when the command runs, so
# `kvtool --help`, `kvtool report --help` and usage errors answer without it.


class ReportFormat(StrEnum):
    """Output formats of ``kvtool report``."""

    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


class Clock(StrEnum):
    """Clocks of ``--clock``."""

    receive = "receive"
    publish = "publish"


DEFAULT_PLOT_EVERY = "1s"


def _parse_by(text: str) -> list[str]:
    from kvtool.render.report import TABLES

    out = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in out if p not in TABLES]
    if bad or not out:
        raise UsageError(f"--by {text!r}: expected a comma-separated list of {', '.join(TABLES)}")
    return out


def report(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Recordings (.mcap); several make one combined report.",
            show_default=False,
            metavar="FILE...",
        ),
    ],
    by: Annotated[
        str,
        typer.Option(
            "--by",
            metavar="TABLE,...",
            help="Tables to show: kind,window,group,rank,channel,medium (any subset, in "
            "order; medium adds the tier transitions).",
        ),
    ] = "kind,window",
    every: Annotated[
        str | None,
        typer.Option(
            "--every",
            metavar="DURATION",
            help="Add a timeline per kind with buckets of this duration (e.g. 1s, 250ms).",
        ),
    ] = None,
    format: Annotated[
        ReportFormat,
        typer.Option("--format", "-f", help="table (for people), json, csv or markdown."),
    ] = ReportFormat.table,
    out: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            "--out",
            metavar="FILE",
            help="Write the report to FILE instead of stdout (- is stdout).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace an existing text FILE of -o or image of --plot."),
    ] = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            metavar="FILE.png",
            help="Draw live blocks and eviction "
            "rate per kind into FILE.png "
            f"(needs kvtool[plot]; buckets of --every, default {DEFAULT_PLOT_EVERY}).",
        ),
    ] = None,
    groups: GroupsFile = None,
    group: GroupMeta = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No status lines on stderr.")
    ] = False,
    columns: Annotated[
        str | None,
        typer.Option(
            "--columns",
            metavar="COL,...",
            show_default=False,
            help="Columns for table and markdown output, by their JSON names, or "
            "'all' (default for tables: blocks stored, removed, live at end, peak, "
            "recomputed, recompute share, lifetime p50/p99; markdown: all).",
        ),
    ] = None,
    wide: Annotated[
        bool, typer.Option("--wide", help="Every column (same as --columns all).")
    ] = False,
    jobs: Annotated[
        int | None,
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            metavar="N",
            show_default="the machine's cores; 1 below 64 MB of input",
            help=(
                "Work on this many threads: each publisher stream's recordings are a unit "
                "of work, one stream's payloads are decoded in parallel (the result is the "
                "same for any N)."
            ),
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help=(
                "Run the same work on the Ray cluster at ADDRESS (needs kvtool[ray]; "
                "every worker must be able to read the input paths)."
            ),
        ),
    ] = None,
    clock: Annotated[
        Clock,
        typer.Option(
            "--clock",
            help="Time axis of --every and --plot: receive (when the recorder "
            "got each batch, the clock of info and replay --since) or publish (the "
            "batch ts, the engine's clock). Lifetimes always use publish.",
        ),
    ] = Clock.receive,
    report_mode: ReportModeOption = ReportMode.auto,
    lifetime_bounds: Annotated[
        bool,
        typer.Option(
            "--lifetime-bounds",
            help="Also give R8's lifetime bound (lifetime_pNN_s_bound_low/high): the lifetimes "
            "under the oldest-first and newest-first copy rules, where a key was cached in "
            "several blocks (two more state passes: about 1.7x the CPU).",
        ),
    ] = False,
    since: Since = None,
    until: Until = None,
    rank: Ranks = None,
    channel: Channels = None,
    what_if: Annotated[
        str | None,
        typer.Option(
            "--what-if",
            metavar="+K[,+K...]",
            show_default=False,
            help="Predict, per pool, kind, window and group, the blocks still recomputed "
            "with K more blocks (or +P% of --pool-blocks), from the recorded event order; "
            "--plot then draws recomputed blocks against pool size. Each size once.",
        ),
    ] = None,
    pool_blocks: PoolBlocks = None,
) -> ExitStatus:
    """Report, per KV cache kind, sliding window and group, what was stored and evicted.

    Columns: store_events, blocks_stored, tokens_stored, remove_events, blocks_removed,
    blocks_cleared, live_blocks_end, peak_live_blocks, distinct_hashes, stored_while_live,
    blocks_recomputed, recompute_share, orphan_removes (hit_rate and the other classes of
    issue 21 with --columns/--wide and in JSON), block lifetime p50/p90/p99 in
    seconds, recompute gap p50/p90/p99 (s) and distance p50/p90/p99 (evictions in the
    pool). Kinds come from --groups,
    --group-meta, the recording's metadata, or what annotated stores say (learned).
    A damaged recording is reported from everything readable, with exit status 3.
    Tables fit the terminal (columns that do not fit go to a block below; nothing is cut);
    --wide or --columns show more. CSV is one table with a 'table' column naming each row's
    table (by_kind, by_window, by_group, timeline). --by medium adds a row per medium (each
    its own cache) and the tier transitions (offload, load, move) per kind.
    """
    from kvtool.report.procs import default_jobs

    if ray is not None and _loopback_ray(ray):
        # Loopback stays loopback: Ray turns a node IP of 127.0.0.1 into the machine's
        # interface address and binds its servers to every interface unless its cluster
        # mode is off (issue 23). Ray reads this at import, which comes later.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    n_jobs = jobs if jobs is not None else default_jobs(files)
    from kvtool.render.report import (
        DEFAULT_COLUMNS,
        parse_columns,
        render_csv,
        render_json,
        render_markdown,
        render_table,
    )
    from kvtool.report import COLUMNS, build_report
    from kvtool.report.source import Finding
    from kvtool.selection import make_selection, selection_note

    env = get_env()
    tables = _parse_by(by)
    extras = None
    if what_if is not None:
        from kvtool.report.whatif import parse_what_if

        extras = parse_what_if(what_if)
        if format in (ReportFormat.csv, ReportFormat.markdown):
            raise UsageError("--what-if prints with --format table or json")
    select = make_selection(channel=channel, rank=rank, since=since, until=until)
    cols = parse_columns(columns) if columns is not None else None
    if wide:
        cols = parse_columns("all")
    if plot is not None:
        from kvtool.plot import require_matplotlib

        require_matplotlib(plot)  # before the (long) read, not after it
    if is_stdout(out):
        out = None
    inputs = [*files, *([groups] if groups is not None else [])]
    check_inputs(inputs)
    from kvtool.poolsize import resolve_pool_blocks

    # --pool-blocks wins over a groups file's num_gpu_blocks and the recording's own.
    given_blocks = pool_blocks
    pool_size = resolve_pool_blocks(pool_blocks, groups, files)
    pool_blocks = pool_size.blocks
    # Refuse a bad output before the work, not after it.
    if out is not None:
        check_output(out, kind=OutputKind.TEXT, force=force, inputs=inputs)
    if plot is not None:
        check_output(plot, kind=OutputKind.IMAGE, force=force, inputs=inputs)
    every_ns = parse_duration_ns(every, option="--every") if every is not None else None
    if plot is not None and every_ns is None and extras is None:
        every_ns = parse_duration_ns(DEFAULT_PLOT_EVERY)
    from kvtool.render.progress import input_size

    size = input_size(files)
    what = f"reading {plural(len(files), 'recording')}"
    feed = None
    if extras is not None and n_jobs == 1 and ray is None:
        from kvtool.report.whatif import PoolFeed

        feed = PoolFeed()  # the what-if takes the report's own read of the input
    with env.progress(what, size, quiet=quiet) as bar:
        rep = build_report(
            [str(f) for f in files],
            groups_file=str(groups) if groups is not None else None,
            group_flags=group or None,
            every_ns=every_ns,
            jobs=n_jobs,
            ray_address=ray,
            clock=clock.value,
            select=select,
            progress=bar.update if bar.shown else None,
            split=[t for t in tables if t in ("rank", "channel", "medium")],
            raw_tap=feed,
            report_mode=report_mode.value,
            lifetime_bounds=lifetime_bounds,
        )
    if given_blocks is not None and len(rep.source.channels) > 1:
        from kvtool.render.whatif import several_pools

        # One engine's pool for a fleet: refused before anything is said of the pool.
        raise UsageError(several_pools(str(pool_size.source), len(rep.source.channels), given=True))
    wi = None
    too_small = _pool_too_small(rep, pool_blocks)
    if extras is not None:
        from kvtool.report.whatif import what_if as predict_what_if

        wi = predict_what_if(
            [str(f) for f in files],
            extras,
            pool_blocks=pool_blocks,
            groups_file=str(groups) if groups is not None else None,
            group_flags=group or None,
            batch_filter=select,
            feed=feed if feed is not None and feed.chunks else None,
        )
    note = selection_note(
        [("--channel", channel), ("--rank", rank), ("--since", since), ("--until", until)],
        rep.source.batches,
        rep.source.unselected_batches,
    )
    if note is not None:
        env.err.print(f"kvtool: {note}", markup=False, highlight=False)
    if rep.timeline is not None:
        points = rep.timeline["time_s"].n_unique()
        if points < 2:
            env.err.print(
                f"kvtool: warning: the timeline has {plural(points, 'point')} on the "
                f"{clock.value} clock "
                f"(buckets of {every or DEFAULT_PLOT_EVERY}); "
                f"try a smaller --every or --clock "
                f"{'publish' if clock is Clock.receive else 'receive'}",
                markup=False,
                highlight=False,
            )
    if plot is not None and every is None and wi is None:
        # The timeline was only built for the plot; keep the output as asked.
        shown = type(rep)(**{**rep.__dict__, "timeline": None})
    else:
        shown = rep
    buf = io.StringIO() if out is not None else None
    stream = buf if buf is not None else env.stdout
    pool = None
    for line in pool_size.findings:
        env.err.print(f"kvtool: finding: {line}", markup=False, highlight=False)
    if too_small is not None:
        env.err.print(f"kvtool: finding: {too_small}", markup=False, highlight=False)
    if pool_blocks is not None:
        from kvtool.render.whatif import pool_occupancy

        if len(rep.source.channels) == 1:
            pool = pool_occupancy(
                rep.totals.to_dicts()[0] if rep.totals.height else {}, pool_blocks
            )
            pool["source"] = pool_size.source
        else:
            from kvtool.render.whatif import several_pools

            why = several_pools(str(pool_size.source), len(rep.source.channels), given=False)
            env.err.print(f"kvtool: {why}", markup=False, highlight=False)
    if format is ReportFormat.json:
        extra: dict[str, object] = {}
        if wi is not None:
            extra["what_if"] = wi.entries
        if pool is not None:
            extra["pool"] = pool
        render_json(shown, stream, extra=extra)
    elif format is ReportFormat.csv:
        render_csv(shown, stream, tables)
    elif format is ReportFormat.markdown:
        render_markdown(shown, stream, tables, cols or COLUMNS)
    else:
        from rich.console import Console

        console = Console(file=buf, width=200, soft_wrap=True) if buf is not None else env.out
        render_table(shown, console, tables, cols or DEFAULT_COLUMNS)
        if pool is not None:
            from kvtool.render.whatif import pool_line

            console.print(pool_line(pool), markup=False, highlight=False, soft_wrap=True)
        if wi is not None:
            from kvtool.render.tables import print_prose
            from kvtool.render.whatif import condition_lines, what_if_lines

            console.print()
            for line in what_if_lines(wi.entries):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
            for line in condition_lines(wi.entries):
                print_prose(console, line, style="dim")
    if buf is not None and out is not None:
        write_text(out, buf.getvalue(), force=force, inputs=inputs)
    else:
        env.stdout.flush()
    if plot is not None and wi is not None:
        from kvtool.plot import plot_what_if

        plot_what_if(wi.entries, plot, force=force)
        if not quiet:
            env.err.print(f"kvtool: plot written to {plot}", markup=False, highlight=False)
    elif plot is not None:
        from kvtool.plot import plot_report

        plot_report(rep, plot, force=force)
        if not quiet:
            env.err.print(f"kvtool: plot written to {plot}", markup=False, highlight=False)
    # Damage is an error, not status: it reaches stderr even with -q or a table on stdout.
    damage = rep.source.damaged
    # Batches lost while recording, and tails never confirmed, exit 3 as in `info` (one
    # policy for every reader).
    lost = missing_batches(files)
    for line in [*damage, *lost]:
        env.err.print(f"kvtool: {printable(line)}", markup=False, highlight=False)
    if format is not ReportFormat.table and not quiet:
        for line in [*rep.findings, *(wi.findings if wi is not None else [])]:
            # By kind, never by text: lost batches and unconfirmed tails are kind "lost".
            kind = line.kind if isinstance(line, Finding) else None
            if kind != "damaged" and not (lost and kind == "lost"):
                env.err.print(f"kvtool: finding: {printable(line)}", markup=False, highlight=False)
    return ExitStatus.DAMAGED if rep.damaged or lost else ExitStatus.OK


def _pool_too_small(rep: ReportT, pool_blocks: int | None) -> str | None:
    """Say so when the stream cached more blocks at once than ``--pool-blocks`` can hold."""
    if pool_blocks is None or not rep.totals.height:
        return None
    from kvtool.report.registry import usable_blocks

    peak = rep.totals.to_dicts()[0].get("peak_live_blocks")
    usable = usable_blocks(pool_blocks)
    if not isinstance(peak, int) or peak <= usable:
        return None
    return (
        f"--pool-blocks {pool_blocks}: the stream had {peak:,} keys cached at once, more than "
        f"the {usable:,} blocks a pool of {pool_blocks:,} holds (block 0 is vLLM's null block): "
        "check it is this engine's num_gpu_blocks (vllm:cache_config_info); shares and +P% "
        "use it as given (partial prefix keys can add a few keys per block)"
    )


def _loopback_ray(address: str) -> bool:
    """True for ``--ray local`` and a ``[ray://]HOST:PORT`` whose host is loopback."""
    if address == "local":
        return True
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


COMMANDS = {"report": report}
COMMAND_OPTIONS = {
    "report": {
        "epilog": examples(
            "report run.mcap",
            "report run.mcap --every 1s --plot run.png",
            "report rank0.mcap rank1.mcap --format json -o report.json",
            "report run.mcap --what-if +60,+10% --pool-blocks 600",
        )
    }
}
HELP_PANELS = {
    "report": {
        "Tables": ["--by", "--every", "--columns", "--wide", "--clock"],
        "What-if": ["--what-if", "--pool-blocks"],
        "Filters": ["--since", "--until", "--rank", "--channel"],
        "Annotation": ["--groups", "--group-meta", "--report-mode", "--lifetime-bounds"],
        "Output": ["--format", "--output", "--force", "--plot", "--quiet"],
        "Performance": ["--jobs", "--ray"],
    }
}
