"""``kvtool record``: capture vLLM KV-event streams into a recording, recovering gaps."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, cast

import typer
from rich.live import Live
from rich.text import Text

from kvtool.capture import (
    CaptureResult,
    CaptureStats,
    Recorder,
    expand_endpoints,
    load_groups,
)
from kvtool.commands import get_env, parse_duration_ns
from kvtool.errors import ExitStatus, RecordingError, UsageError
from kvtool.outputs import OutputKind, check_output, is_stdout


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _per_kind(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items(), key=lambda kv: -kv[1])) or "-"


class _Status:
    """The live status: one refreshing block on stderr with events/s over the last update."""

    def __init__(self, live: Live | None) -> None:
        self.live = live
        self._last_events = 0
        self._last_mono = time.monotonic()
        self._rate = 0.0

    def render(self, st: CaptureStats) -> Text:
        now = time.monotonic()
        dt = now - self._last_mono
        if dt >= 0.5:
            self._rate = (st.events - self._last_events) / dt
            self._last_events = st.events
            self._last_mono = now
        t = Text()
        t.append(f"recording {st.elapsed_ns / 1e9:6.1f}s  ", style="bold")
        t.append(
            f"batches {st.batches}  events {st.events} ({self._rate:,.0f}/s)  "
            f"gaps {st.gaps}  recovered {st.recovered}  "
        )
        t.append(f"lost {st.lost}", style="bold red" if st.lost else "")
        if st.restarts:
            t.append(f"  restarts {st.restarts}", style="yellow")
        if st.malformed or st.undecodable:
            t.append(f"  malformed {st.malformed + st.undecodable}", style="yellow")
        t.append(f"\n  stores:  {_per_kind(st.stores)}")
        t.append(f"\n  removes: {_per_kind(st.removes)}")
        if st.cleared:
            t.append(f"\n  cleared: {st.cleared}")
        return t

    def __call__(self, st: CaptureStats) -> None:
        if self.live is not None:
            self.live.update(self.render(st), refresh=True)


def summary_line(result: CaptureResult) -> str:
    """Return the one-line summary printed when a recording ends.

    Args:
        result: The finished capture.

    Returns:
        ``FILE: N batches, N events, N gaps (N recovered, N lost), N restarts, SIZE``.
    """
    st = result.stats
    parts = [
        f"{result.path}: {st.batches} batches",
        f"{st.events} events",
        f"{st.gaps} gaps ({st.recovered} recovered, {st.lost} lost)",
    ]
    if st.restarts:
        parts.append(f"{st.restarts} restarts")
    if st.history:
        parts.append(f"{st.history} from history")
    if st.malformed or st.undecodable:
        parts.append(f"{st.malformed} malformed, {st.undecodable} undecodable")
    if st.replay_timeouts:
        parts.append(f"{st.replay_timeouts} replay timeouts")
    if st.unsampled:
        parts.append(f"{st.unsampled} batches not counted (overload)")
    parts.append(f"{_human_bytes(result.file_bytes)} ({result.stop_reason})")
    return ", ".join(parts)


def record(
    endpoints: Annotated[
        list[str],
        typer.Argument(
            help="Publisher endpoints: tcp://HOST:PORT, ipc://PATH, inproc://NAME, or a "
            "bare port (tcp://127.0.0.1:PORT).",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", help="The recording to write (.mcap).")
    ],
    bind: Annotated[
        bool, typer.Option("--bind", help="Bind the endpoints instead of connecting to them.")
    ] = False,
    topic: Annotated[
        str, typer.Option("--topic", help="Topic filter (vLLM's default topic is empty).")
    ] = "",
    dp_size: Annotated[
        int | None,
        typer.Option(
            "--dp-size",
            min=1,
            help="Record data-parallel ranks 0..N-1: port + rank, for the replay endpoint too.",
        ),
    ] = None,
    replay: Annotated[
        list[str] | None,
        typer.Option(
            "--replay",
            help="The publisher's replay endpoint, to recover gaps (once per endpoint).",
        ),
    ] = None,
    history: Annotated[
        bool,
        typer.Option("--history", help="First fetch what the replay buffer still holds."),
    ] = False,
    duration: Annotated[
        str | None,
        typer.Option("--duration", "-d", help="Stop after this long: 90, 10s, 10m, 1h."),
    ] = None,
    max_batches: Annotated[
        int | None,
        typer.Option("--max-batches", "-n", min=1, help="Stop after this many batches."),
    ] = None,
    groups: Annotated[
        Path | None,
        typer.Option(
            "--groups",
            help="KV cache group metadata to store: the JSON list "
            "get_kv_cache_group_metadata() returns.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing kvtool recording.")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No live status and no summary line.")
    ] = False,
    connect_timeout: Annotated[
        str,
        typer.Option(
            "--connect-timeout",
            help="Fail if an endpoint has not connected (nor sent anything) by then; 0 waits "
            "forever.",
        ),
    ] = "30s",
    replay_timeout: Annotated[
        str,
        typer.Option("--replay-timeout", help="Give up a replay request unanswered this long."),
    ] = "2s",
) -> ExitStatus:
    """Record KV-cache events from vLLM publishers into an MCAP recording.

    Every batch is stored byte for byte. With --replay, batches missing from the live
    stream are fetched from the publisher's replay socket and written in seq order;
    what it no longer holds is noted as lost in the recording's gap ledger. Stops at
    --duration or --max-batches, whichever comes first, or on Ctrl-C / SIGTERM, always
    with a properly closed file. Exit status 3 when batches were lost.
    """
    env = get_env()
    duration_ns = parse_duration_ns(duration, option="--duration") if duration else None
    connect_ns = _timeout_ns(connect_timeout, "--connect-timeout")
    replay_ns = _timeout_ns(replay_timeout, "--replay-timeout") or 2_000_000_000
    sources = expand_endpoints(endpoints, replay=replay or (), dp_size=dp_size, bind=bind)
    if history and not replay:
        raise UsageError("--history needs --replay: the history comes from the replay buffer")
    group_list = load_groups(groups) if groups is not None else None
    _check_output(output, force, [groups] if groups is not None else [])

    live: Live | None = None
    if not quiet and env.err.is_terminal:
        live = Live(console=env.err, auto_refresh=False, transient=True)
    status = _Status(live)
    recorder = Recorder(
        output,
        sources,
        topic=topic,
        bind=bind,
        history=history,
        duration_ns=duration_ns,
        max_batches=max_batches,
        connect_timeout_ns=connect_ns,
        replay_timeout_ns=replay_ns,
        groups=group_list,
        groups_source=str(groups) if groups is not None else "",
        force=force,
        status=status if live is not None else None,
    )
    try:
        if live is not None:
            with live:
                result = recorder.run()
        else:
            result = recorder.run()
    except RecordingError as err:
        if "file exists" in str(err) or "cannot create" in str(err):
            raise UsageError(str(err)) from err
        raise
    if not quiet:
        env.err.print(summary_line(result), markup=False, highlight=False)
    if result.stats.lost:
        ranges = cast("list[list[int]]", result.ledger.get("lost_ranges") or [])
        shown = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in ranges[:10])
        more = " …" if len(ranges) > 10 else ""
        env.err.print(
            f"kvtool: {result.stats.lost} batches lost (seq {shown}{more}); "
            "the gap ledger in the recording lists them",
            markup=False,
            highlight=False,
        )
        return ExitStatus.DAMAGED
    return ExitStatus.OK


def _timeout_ns(text: str, option: str) -> int | None:
    if text.strip() in ("0", "0s", "none", "inf"):
        return None
    return parse_duration_ns(text, option=option)


def _check_output(output: Path, force: bool, inputs: list[Path]) -> None:
    """Fail early, before any socket, on an output path kvtool must not write."""
    if is_stdout(output):
        raise UsageError("record -o -: a recording is a file (it survives a crash); give a path")
    check_output(output, kind=OutputKind.RECORDING, force=force, inputs=inputs)


COMMANDS = {"record": record}
