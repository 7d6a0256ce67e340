"""Options several commands share, declared once so their names, metavars and help agree."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from kvtool.poolsize import MAX_POOL_BLOCKS, MIN_POOL_BLOCKS

Since = Annotated[
    str | None,
    typer.Option(
        "--since",
        metavar="TIME",
        show_default=False,
        help="Only batches received at or after TIME (as replay --since).",
    ),
]
Until = Annotated[
    str | None,
    typer.Option(
        "--until",
        metavar="TIME",
        show_default=False,
        help="Only batches received at or before TIME.",
    ),
]
Ranks = Annotated[
    list[str] | None,
    typer.Option(
        "--rank",
        metavar="RANK",
        show_default=False,
        help="Only these data-parallel ranks (repeat or comma list; 'none').",
    ),
]
Channels = Annotated[
    list[str] | None,
    typer.Option(
        "--channel",
        metavar="CHANNEL",
        show_default=False,
        help="Only these channels (name, endpoint, glob or port).",
    ),
]
GroupsFile = Annotated[
    Path | None,
    typer.Option(
        "--groups",
        metavar="FILE",
        help="KV cache group metadata JSON (get_kv_cache_group_metadata() or spec descriptions).",
    ),
]
GroupMeta = Annotated[
    list[str] | None,
    typer.Option(
        "--group-meta",
        metavar="IDX=KIND[:WINDOW]",
        help="Group metadata for group IDX; repeat per group. none=KIND[:WINDOW] gives "
        "the kind of events without group_idx (SGLang; vLLM before ~0.21).",
    ),
]
OutputFile = Annotated[
    Path | None,
    typer.Option(
        "--output", "-o", metavar="FILE", help="Write to FILE instead of stdout (- is stdout)."
    ),
]
ForceText = Annotated[bool, typer.Option("--force", help="Replace an existing text FILE of -o.")]

# The live-stream options of `record` and `top` (one recorder behind both).
Topic = Annotated[
    str, typer.Option("--topic", help="Topic filter (vLLM's default topic is empty).")
]
ReplayEndpoints = Annotated[
    list[str] | None,
    typer.Option(
        "--replay-endpoint",
        "--replay",
        metavar="ENDPOINT",
        help="The publisher's replay endpoint (vLLM's replay_endpoint), to recover gaps "
        "(once per endpoint).",
    ),
]
DpSize = Annotated[
    int | None,
    typer.Option(
        "--dp-size",
        min=1,
        metavar="N",
        help="Data-parallel ranks 0..N-1 of each endpoint: port + rank, for the replay "
        "endpoint too.",
    ),
]
ReplayTimeout = Annotated[
    str,
    typer.Option(
        "--replay-timeout",
        metavar="DURATION",
        help="Give up a replay request unanswered this long.",
    ),
]
RecordAlso = Annotated[
    Path | None,
    typer.Option("--record", metavar="FILE", help="Also write the stream to this recording."),
]
"""``top``/``serve --record FILE``."""
ForceRecord = Annotated[bool, typer.Option("--force", help="Replace an existing --record file.")]
PlaySpeed = Annotated[
    float,
    typer.Option(
        "--speed",
        metavar="X",
        min=0.0,
        help="Recording: play its receive-time pace X times faster; 0 all at once.",
    ),
]
"""``top``/``serve FILE.mcap --speed X``."""
PoolBlocks = Annotated[
    int | None,
    typer.Option(
        "--pool-blocks",
        min=MIN_POOL_BLOCKS,
        max=MAX_POOL_BLOCKS,
        metavar="N",
        show_default=False,
        help="The engine's num_gpu_blocks (vllm:cache_config_info): record stores it in the "
        "recording's metadata (else a --groups file's num_gpu_blocks); report gives live and "
        "peak blocks as a share of it and +P% for --what-if (default: a --groups file's, else "
        "the recording's); serve's occupancy is live / (N - 1), block 0 being vLLM's null block.",
    ),
]


class ReportMode(StrEnum):
    """Modes of ``--report-mode`` (hit announcements, docs/SEMANTICS.md R6)."""

    auto = "auto"
    full = "full"
    incremental = "incremental"


REPORT_MODE_HELP = (
    "How parentless stores are read (vLLM's kv_cache_report_mode): auto (hit "
    "announcements where the stream shows them, with a finding), full (every request "
    "announces its hits) or incremental (none does: every store is a store). An "
    "event's origin field (REUSED/NEW, when vLLM sends it) always decides."
)
ReportModeOption = Annotated[ReportMode, typer.Option("--report-mode", help=REPORT_MODE_HELP)]
"""``--report-mode``: the one definition (every command driving the report engine)."""
ReportModesOption = Annotated[
    list[ReportMode] | None,
    typer.Option(
        "--report-mode",
        show_default=False,
        help=REPORT_MODE_HELP.removesuffix(".")
        + ". Once: both sides; twice: side A's, then side B's. [default: auto]",
    ),
]
"""``diff --report-mode``: the same option, given once (both sides) or once per side."""
