"""``kvtool diff``: compare two recordings (or two sets) metric by metric per kind."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from kvtool.commands import (
    TextOutput,
    check_inputs,
    examples,
    get_env,
    missing_batches,
)
from kvtool.commands._help import KvtoolCommand
from kvtool.commands._options import ForceText, OutputFile, ReportMode, ReportModesOption
from kvtool.diff import FAIL_ON_SYNTAX, diff_recordings, parse_fail_on
from kvtool.errors import ExitStatus, UsageError
from kvtool.render.diff import render_json, render_markdown, render_table
from kvtool.text import plural

# Click drops the first ``--`` and with it where set A ends; the command swaps it for this
# token (no path can hold a NUL byte) before parsing, and the body splits on it.
_SEPARATOR = "\x00--"


EXAMPLES = examples(
    "diff yesterday.mcap today.mcap",
    "diff a0.mcap a1.mcap -- b0.mcap b1.mcap --format json",
    "diff run.mcap run.mcap --report-mode incremental --report-mode full",
    "diff base.mcap new.mcap --fail-on 'blocks_removed:+10%' \\\n"
    "      --fail-on 'live_blocks_end{kind=sliding_window}:-100'",
)


class DiffCommand(KvtoolCommand):
    """A typer command that keeps the ``--`` between set A and set B as an argument."""

    def collect_usage_pieces(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        """Show both ways to name the sides in the usage line.

        Args:
            ctx: The click context.

        Returns:
            The pieces after the command name.
        """
        return ["[OPTIONS] A B | A... -- B..."]

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        """Swap the first ``--`` for a separator token, then parse as usual.

        Args:
            ctx: The click context.
            args: The command line after ``kvtool diff``.

        Returns:
            What click's parser leaves over.
        """
        if "--" in args:
            i = args.index("--")
            args = [*args[:i], _SEPARATOR, *args[i + 1 :]]
        return super().parse_args(ctx, args)


class DiffFormat(StrEnum):
    """Output formats of ``kvtool diff``."""

    table = "table"
    json = "json"
    markdown = "markdown"


class DiffBy(StrEnum):
    """Tables ``kvtool diff`` can compare."""

    kind = "kind"
    window = "window"
    group = "group"


def _split(names: list[str]) -> tuple[list[str], list[str]]:
    files = names
    if _SEPARATOR in names:
        i = names.index(_SEPARATOR)
        a, b = files[:i], files[i + 1 :]
        if _SEPARATOR in names[i + 1 :]:
            raise UsageError("diff: give one -- between set A and set B")
        if not a or not b:
            raise UsageError("diff: give at least one recording on each side of --")
        return a, b
    if len(files) != 2:
        raise UsageError(
            f"diff: got {plural(len(files), 'recording')}; give two (A B) or two sets separated "
            "by -- (A1 A2 -- B1 B2)"
        )
    return [files[0]], [files[1]]


def diff(
    files: Annotated[
        list[str],
        typer.Argument(
            help="A B, or two sets of recordings separated by --: A1 A2 -- B1 B2 "
            "(each set makes one combined report).",
            metavar="A... [--] B...",
            show_default=False,
        ),
    ],
    by: Annotated[
        DiffBy, typer.Option("--by", help="Compare per kind, per sliding window or per group.")
    ] = DiffBy.kind,
    format: Annotated[
        DiffFormat, typer.Option("--format", "-f", help="table, json or markdown.")
    ] = DiffFormat.table,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on",
            metavar="EXPR",
            help=f"Exit 1 when a metric moved past a threshold: {FAIL_ON_SYNTAX}. "
            "+ a rise, - a fall, no sign either way; % relative to A, else in the "
            "metric's unit. Without {...} the totals are checked. Repeatable.",
        ),
    ] = None,
    all_metrics: Annotated[
        bool, typer.Option("--all", help="Show unchanged metrics too (table, markdown).")
    ] = False,
    groups: Annotated[
        Path | None,
        typer.Option(
            "--groups",
            metavar="FILE",
            help="KV cache group metadata JSON for "
            "both sides (get_kv_cache_group_metadata() or spec descriptions).",
        ),
    ] = None,
    group: Annotated[
        list[str] | None,
        typer.Option(
            "--group-meta",
            metavar="IDX=KIND[:WINDOW]",
            help="Group metadata for group IDX, for both sides; repeat per group.",
        ),
    ] = None,
    report_mode: ReportModesOption = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No findings or check lines on stderr.")
    ] = False,
    output: OutputFile = None,
    force: ForceText = False,
) -> ExitStatus:
    """Compare two recordings (or two sets) metric by metric, per kind, window or group.

    Each side is built by the report engine (the numbers two `kvtool report` runs print).
    For every row it shows A and B side by side, the delta B - A and the relative change,
    largest changes first, with a one-line verdict per row; rows on one side only are
    shown as such. Unchanged metrics are hidden unless --all. --report-mode reads both
    sides in one mode, or, given twice, side A in the first and side B in the second (a
    recording against itself: what its hit announcements change).

    --fail-on EXPR exits 1 when a metric moved past a threshold (0 otherwise):
    METRIC[{kind=K,window=N,group=N}]:[+|-]NUMBER[%]. A filter value may be * (every
    row); kind= alone watches the by-kind rows, window= alone the by-window rows, any
    other filter the by-group rows. A bad expression exits 2; a damaged input exits 3.

    JSON (--format json, schema "kvtool.diff/1"): {"schema", "by", "a", "b", "changed",
    "failed", "totals": ROW, "rows": [ROW], "fail_on": [CHECK]}; ROW = {"key", "label",
    "presence": both|a_only|b_only, "changed", "verdict", "metrics": [{"metric", "a",
    "b", "delta", "rel_change" (fraction, null from 0), "changed"}]}; CHECK = {"expr",
    "crossed", "matched_rows", "hits"}.
    """
    env = get_env()
    rules = [parse_fail_on(text) for text in fail_on or []]
    for rule in rules:
        if rule.deprecation is not None and not quiet:
            env.err.print(f"kvtool: note: {rule.deprecation}", markup=False, highlight=False)
    modes = [m.value for m in report_mode or [ReportMode.auto]]
    if len(modes) > 2:
        raise UsageError(
            f"diff: --report-mode given {len(modes)} times; give it once (both sides) or "
            "twice (side A's, then side B's)"
        )
    side_a, side_b = _split(files)
    check_inputs([*side_a, *side_b, groups])
    out = TextOutput(env, output, force=force, inputs=[*side_a, *side_b, groups])
    result = diff_recordings(
        side_a,
        side_b,
        by=by.value,
        fail_on=rules,
        groups_file=str(groups) if groups is not None else None,
        group_flags=group or None,
        report_mode=modes[0],
        report_mode_b=modes[-1],
    )
    if format is DiffFormat.json:
        render_json(result, out.stream)
    elif format is DiffFormat.markdown:
        render_markdown(result, out.stream, all_metrics=all_metrics)
    else:
        render_table(result, out.console, all_metrics=all_metrics)
    out.close()
    lost = missing_batches([*side_a, *side_b])
    if format is not DiffFormat.table and not quiet:
        from kvtool.render.diff import check_lines
        from kvtool.report.source import finding_kind
        from kvtool.text import printable

        for line in check_lines(result):
            env.err.print(f"kvtool: {line}", markup=False, highlight=False)
        for name, side in (("A", result.a), ("B", result.b)):
            findings = side.get("findings")
            for f in findings if isinstance(findings, list) else []:
                if lost and finding_kind(f) == "lost":
                    continue  # said once below, as an error (by kind, never by its text)
                env.err.print(
                    printable(f"kvtool: finding ({name}): {f}"), markup=False, highlight=False
                )
    # Batches lost while recording, and tails never confirmed, exit 3, as in `info` and
    # `report` (a crossed --fail-on, exit 1, outranks it).
    for line in lost:
        env.err.print(f"kvtool: {line}", markup=False, highlight=False)
    if result.failed:
        return ExitStatus.FAILED
    return ExitStatus.DAMAGED if result.damaged or lost else ExitStatus.OK


COMMANDS = {"diff": diff}
COMMAND_OPTIONS = {"diff": {"cls": DiffCommand, "epilog": EXAMPLES}}
HELP_PANELS = {
    "diff": {
        "Tables": ["--by", "--all"],
        "Checks": ["--fail-on"],
        "Annotation": ["--groups", "--group-meta", "--report-mode"],
        "Output": ["--format", "--output", "--force", "--quiet"],
    }
}
"""Extra ``typer.Typer.command`` arguments per command (here: keep the ``--`` of sets)."""
