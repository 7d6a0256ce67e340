"""``kvtool serve``: per-kind KV-cache metrics on /metrics for Prometheus (live or a recording)."""

from __future__ import annotations

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
    PoolBlocks,
    RecordAlso,
    ReplayEndpoints,
    ReplayTimeout,
    ReportMode,
    ReportModeOption,
    Topic,
)
from kvtool.commands._process import give_back_big_buffers
from kvtool.errors import ExitStatus, UsageError

if TYPE_CHECKING:
    from kvtool.report.feed import ReportFeed
    from kvtool.streams import LiveSource

EXAMPLES = examples(
    "serve tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558",
    "serve tcp://10.0.0.5:5557 --dp-size 4 --record run.mcap",
    "serve run.mcap --speed 10 --metrics 127.0.0.1:9401",
)

MetricsAddr = Annotated[
    str,
    typer.Option(
        "--metrics",
        metavar="HOST:PORT",
        help="Serve /metrics here (a bare PORT: on 127.0.0.1). Another address than "
        "loopback is reachable from other hosts.",
    ),
]
LabelLimit = Annotated[
    int,
    typer.Option(
        "--label-limit",
        min=1,
        metavar="N",
        help="Values kept per label (kind, group, rank, ...); the rest are served as 'other'.",
    ),
]
MaxSeries = Annotated[
    int,
    typer.Option(
        "--max-series",
        min=1,
        metavar="N",
        help="Label sets kept per metric; the rest are served as 'other'.",
    ),
]

RememberKeys = Annotated[
    int,
    typer.Option(
        "--remember-keys",
        min=0,
        metavar="N",
        help="Keys kept per rank for recompute detection, so memory stays bounded on an "
        "endless stream: past N the oldest removed ones are forgotten (a re-store of one "
        "counts as a first store; kvtool_keys_forgotten_total says how many). 0: keep "
        "every key (exact, as report; memory grows with the stream).",
    ),
]
DEFAULT_REMEMBER_KEYS = 1_000_000
"""``--remember-keys``'s default: ~40-75 MB of state per rank (36 bytes a table slot, issue 19)."""


def serve(
    targets: Annotated[
        list[str],
        typer.Argument(
            help="Publisher endpoints (tcp://HOST:PORT, ipc://PATH, or a bare port), or one "
            "recording (FILE.mcap) to play into /metrics.",
            metavar="ENDPOINT... | FILE.mcap",
            show_default=False,
        ),
    ],
    metrics: MetricsAddr = "127.0.0.1:9400",
    replay: ReplayEndpoints = None,
    dp_size: DpSize = None,
    topic: Topic = "",
    record: RecordAlso = None,
    force: ForceRecord = False,
    speed: PlaySpeed = 1.0,
    exit_at_end: Annotated[
        bool,
        typer.Option(
            "--exit-at-end",
            help="Recording: exit once it has played (default: keep serving its end).",
        ),
    ] = False,
    interval: Annotated[
        str,
        typer.Option(
            "--interval", metavar="DURATION", help="Take a snapshot this often: 1s, 500ms."
        ),
    ] = "1s",
    duration: Annotated[
        str | None,
        typer.Option("--duration", "-d", metavar="DURATION", help="Stop after this long."),
    ] = None,
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
    pool_blocks: PoolBlocks = None,
    label_limit: LabelLimit = 256,
    max_series: MaxSeries = 2000,
    remember_keys: RememberKeys = DEFAULT_REMEMBER_KEYS,
    replay_timeout: ReplayTimeout = "2s",
) -> ExitStatus:
    """Serve the KV cache's numbers per kind, window, group and rank to Prometheus.

    Subscribes like `record` (the same gap recovery over --replay-endpoint, --dp-size,
    --record FILE to keep the stream too), or plays a recording by receive time, and
    serves /metrics in Prometheus's text format: kvtool_blocks_stored_total,
    kvtool_live_blocks, kvtool_block_lifetime_seconds and the rest, labelled kind,
    sliding_window, group, rank, medium and endpoint, plus the stream's health (batches
    received, recovered, lost, restarts, seconds since the last batch). The numbers are
    the report engine's: a counter equals `kvtool report` on the same stream, as of the
    last snapshot (every --interval; recomputes while --remember-keys has forgotten no
    key). Ctrl-C, SIGTERM or SIGHUP stops it (exit 0, or 3
    when batches were lost).
    """
    from kvtool.report.feed import ReportFeed
    from kvtool.serve import Exporter, run_serve, warm_up
    from kvtool.streams import RecordingSource

    env = get_env()
    interval_s = parse_duration_ns(interval, option="--interval") / 1e9
    duration_s = (
        parse_duration_ns(duration, option="--duration") / 1e9 if duration is not None else None
    )
    source: LiveSource | RecordingSource
    feed: ReportFeed
    if is_recording(targets):
        check_inputs([targets[0], groups])
        for opt, given in (
            ("--replay-endpoint", replay),
            ("--dp-size", dp_size),
            ("--record", record),
        ):
            if given:
                raise UsageError(f"serve FILE.mcap: {opt} is for live endpoints, not a recording")
        source = RecordingSource(targets[0], speed=speed)
        feed = ReportFeed(
            source.groups,
            groups_file=str(groups) if groups else None,
            group_flags=group_meta or None,
            report_mode=report_mode.value,
            whole_stream=False,
            max_keys=remember_keys or None,
        )
    else:
        if exit_at_end:
            raise UsageError("serve ENDPOINT: --exit-at-end is for a recording")
        source, feed = live_source(
            targets,
            replay,
            dp_size,
            topic,
            record,
            force,
            groups,
            replay_timeout,
            max_keys=remember_keys or None,
            group_flags=group_meta or None,
            report_mode=report_mode.value,
        )

    def finding(text: str) -> None:
        env.err.print(f"kvtool: finding: {text}", markup=False, highlight=False)

    exporter = Exporter(
        label_limit=label_limit, max_series=max_series, pool_blocks=pool_blocks, on_finding=finding
    )
    try:
        # Before subscribing: the first batches of a burst then find the kernels loaded.
        warm_up()
        server = open_server(metrics, exporter)
    except BaseException:
        source.stop()
        raise
    try:
        run_serve(
            source,
            feed,
            exporter,
            interval_s=interval_s,
            duration_s=duration_s,
            exit_at_end=exit_at_end,
        )
    except KeyboardInterrupt:
        pass  # Ctrl-C and SIGTERM are how a server is stopped: run_serve stopped the source
    finally:
        server.stop()
    # What the numbers miss (lost batches, a tail never confirmed, damage): one line each
    # and exit 3, as top and report say it (issue 23).
    from kvtool.text import printable

    lines = source_problems(source, feed)
    for line in lines:
        env.err.print(f"kvtool: {printable(line)}", markup=False, highlight=False)
    return ExitStatus.DAMAGED if lines or source.health().lost else ExitStatus.OK


COMMANDS = {"serve": serve}
COMMAND_OPTIONS = {"serve": {"epilog": EXAMPLES}}
# Made by the console script's entry (kvtool.cli.main) for a `kvtool serve` process, never
# by the command function, which tests and other programs call in their own process.
# A server runs for days: freed state tables go back to the system (glibc).
PROCESS_SETTINGS = {"serve": give_back_big_buffers}
HELP_PANELS = {
    "serve": {
        "Serving": [
            "--metrics",
            "--interval",
            "--duration",
            "--pool-blocks",
            "--label-limit",
            "--max-series",
            "--remember-keys",
        ],
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
        "Recording": ["--speed", "--exit-at-end"],
    }
}
