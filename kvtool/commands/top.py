"""``kvtool top``: a live full-screen view of the KV cache per kind, window, group or rank."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvtool.commands import check_inputs, examples, get_env, parse_duration_ns
from kvtool.commands._live import is_recording, live_source, open_server, source_problems
from kvtool.commands._options import (
    DpSize,
    ForceRecord,
    GroupMeta,
    PlaySpeed,
    RecordAlso,
    ReplayEndpoints,
    ReplayTimeout,
    ReportMode,
    ReportModeOption,
    Topic,
)
from kvtool.errors import ExitStatus, UsageError

if TYPE_CHECKING:
    from kvtool.report.feed import ReportFeed
    from kvtool.streams import LiveSource, RecordingSource
    from kvtool.top import TopView as TopState

EXAMPLES = examples(
    "top tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558",
    "top tcp://10.0.0.5:5557 --dp-size 4 --record run.mcap",
    "top run.mcap --speed 10",
    "top run.mcap --once --speed 0",
)


class TopView(StrEnum):
    """Views of ``kvtool top`` (keys k, w, g, r)."""

    kind = "kind"
    window = "window"
    group = "group"
    rank = "rank"


def top(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="Publisher endpoints (tcp://HOST:PORT, ipc://PATH, or a bare port), or one "
            "recording (FILE.mcap) to play back.",
            metavar="ENDPOINT... | FILE.mcap",
            show_default=False,
        ),
    ],
    replay: ReplayEndpoints = None,
    dp_size: DpSize = None,
    topic: Topic = "",
    record: RecordAlso = None,
    force: ForceRecord = False,
    speed: PlaySpeed = 1.0,
    interval: Annotated[
        str,
        typer.Option("--interval", metavar="DURATION", help="Refresh this often: 1s, 500ms."),
    ] = "1s",
    duration: Annotated[
        str | None,
        typer.Option("--duration", "-d", metavar="DURATION", help="Stop after this long."),
    ] = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help="No full screen: print a plain block every --interval (also when stdout "
            "is not a terminal).",
        ),
    ] = False,
    view: Annotated[
        TopView, typer.Option("--view", help="The view to start with (keys k, w, g, r).")
    ] = TopView.kind,
    groups: Annotated[
        Path | None,
        typer.Option(
            "--groups",
            metavar="FILE",
            help="KV cache group metadata JSON (get_kv_cache_group_metadata()); live: "
            "also stored with --record.",
        ),
    ] = None,
    group_meta: GroupMeta = None,
    report_mode: ReportModeOption = ReportMode.auto,
    replay_timeout: ReplayTimeout = "2s",
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            metavar="HOST:PORT",
            help="Also serve /metrics here while watching, as `kvtool serve` does.",
        ),
    ] = None,
) -> ExitStatus:
    """Watch the KV cache live, per kind, sliding window, group or rank (like htop).

    Shows live blocks, peak, stores/s, evictions/s, recomputes/s, orphan removes and the
    lifetime p50 per row, with a sparkline of live blocks over the last minute, and the
    stream's health (publishers, batches/s, gaps recovered and lost, restarts). The
    numbers are the report engine's: at the same seq they equal `kvtool report`.

    Keys: q quit, k/w/g/r by kind/window/group/rank, p pause. Ctrl-C also quits (exit
    130). On a recording the view plays it by receive time and stays on the final screen
    until q. Without a terminal, or with --once, it prints a plain block every --interval
    and exits after --duration or at the end of a recording.
    """
    from kvtool.report.feed import ReportFeed
    from kvtool.streams import RecordingSource
    from kvtool.top import TopView as View

    interval_s = parse_duration_ns(interval, option="--interval") / 1e9
    duration_s = (
        parse_duration_ns(duration, option="--duration") / 1e9 if duration is not None else None
    )
    source: LiveSource | RecordingSource
    if is_recording(targets):
        check_inputs([targets[0], groups])
        for opt, given in (
            ("--replay-endpoint", replay),
            ("--dp-size", dp_size),
            ("--record", record),
        ):
            if given:
                raise UsageError(f"top FILE.mcap: {opt} is for live endpoints, not a recording")
        source = RecordingSource(targets[0], speed=speed)
        feed = ReportFeed(
            source.groups,
            groups_file=str(groups) if groups else None,
            group_flags=group_meta or None,
            report_mode=report_mode.value,
        )
    else:
        source, feed = live_source(
            targets, replay, dp_size, topic, record, force, groups, replay_timeout,
            whole_stream=True, group_flags=group_meta or None,
            report_mode=report_mode.value,
        )  # fmt: skip
    state = View(source=source, feed=feed, view=view.value)
    try:
        if metrics is not None:
            from kvtool.serve import Exporter, ExportingView

            exporter = Exporter()
            try:
                server = open_server(metrics, exporter)
            except BaseException:
                source.stop()
                raise
            state = ExportingView(source=source, feed=feed, view=view.value, exporter=exporter)
            try:
                _run(state, once, interval_s, duration_s)
            finally:
                server.stop()
        else:
            _run(state, once, interval_s, duration_s)
    except KeyboardInterrupt:
        # Ctrl-C, SIGTERM, SIGHUP: the source is stopped (its recording closed); say where
        # --record wrote before the exit 130.
        _say_recorded(source, record)
        raise
    _say_recorded(source, record)
    return _finish(source, feed)


def _run(state: TopState, once: bool, interval_s: float, duration_s: float | None) -> None:
    from kvtool.render.top import plain_block, screen

    env = get_env()
    if once or not env.out.is_terminal:
        from kvtool.top import run_plain

        run_plain(
            state, env.stdout, interval_s=interval_s, duration_s=duration_s, render=plain_block
        )
        return
    from rich.console import Console

    from kvtool.top import run_screen

    console = Console(file=env.stdout)
    key_fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    run_screen(
        state,
        console,
        key_fd=key_fd,
        interval_s=interval_s,
        duration_s=duration_s,
        render=lambda m, v, p, w, h: screen(m, v, paused=p, width=w, height=h),
    )
    # The final numbers stay in the scrollback after the alternate screen is gone.
    env.stdout.write(plain_block(state.model, state.view))
    env.stdout.flush()


def _say_recorded(source: LiveSource | RecordingSource, record: Path | None) -> None:
    """Say where ``--record`` wrote, and how many batches (also after a Ctrl-C)."""
    from kvtool.streams import LiveSource
    from kvtool.text import plural, printable

    if not isinstance(source, LiveSource) or record is None:
        return
    n = source.recorder.stats.batches
    # No batch: the recorder leaves no empty file behind.
    said = (
        f"top recorded {plural(n, 'batch')} to {printable(str(record))}"
        if n or record.exists()
        else f"top recorded nothing, so no file was written at {printable(str(record))}"
    )
    get_env().err.print(f"kvtool: {said}", markup=False, highlight=False)


def _finish(source: LiveSource | RecordingSource, feed: ReportFeed) -> ExitStatus:
    """Say what the numbers miss (:func:`source_problems`).

    Returns the exit status: 3 when anything is missing.
    """
    from kvtool.text import printable

    env = get_env()
    lines = source_problems(source, feed)
    for line in lines:
        env.err.print(f"kvtool: {printable(line)}", markup=False, highlight=False)
    return ExitStatus.DAMAGED if lines else ExitStatus.OK


COMMANDS = {"top": top}
COMMAND_OPTIONS = {"top": {"epilog": EXAMPLES}}
HELP_PANELS = {
    "top": {
        "Live": [
            "--replay-endpoint",
            "--dp-size",
            "--topic",
            "--replay-timeout",
            "--record",
            "--force",
            "--groups",
            "--group-meta",
            "--report-mode",
        ],
        "Recording": ["--speed"],
        "Display": ["--view", "--interval", "--duration", "--once", "--metrics"],
    }
}
