"""``kvtool replay``: print, filter, annotate, check, copy or re-publish recordings."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated

import typer

from kvtool.commands import Env, check_inputs, examples, get_env, missing_batches
from kvtool.commands._options import GroupMeta
from kvtool.errors import ExitStatus, UsageError
from kvtool.outputs import is_stdout
from kvtool.text import plural, printable

# The replay library (msgspec, rich, the recording copy) is imported when the command
# runs, so `kvtool --help` and `kvtool replay --help` answer without it.
if TYPE_CHECKING:
    from kvtool.publish import Publisher
    from kvtool.replay import BatchFilter, EventFilter, Replay, ReplayBatch
    from kvtool.replay_options import PublishFlags
    from kvtool.replay_run import ReplaySinks


class EventFormat(StrEnum):
    """Output formats of ``kvtool replay``."""

    pretty = "pretty"
    jsonl = "jsonl"


_TYPE_ALIASES = {
    "stored": "BlockStored",
    "store": "BlockStored",
    "removed": "BlockRemoved",
    "remove": "BlockRemoved",
    "cleared": "AllBlocksCleared",
    "clear": "AllBlocksCleared",
}
"""Short names of ``--type``, besides the event types' own names in any case."""


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def replay(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Recordings (.mcap); several merge by receive time.",
            show_default=False,
            metavar="FILE...",
        ),
    ],
    format: Annotated[
        EventFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="pretty (default on a terminal) or jsonl "
            "(default when piped): one JSON object per event.",
            show_default=False,
        ),
    ] = None,
    hash_format: Annotated[
        str,
        typer.Option(
            "--hash-format",
            metavar="str|hex|int",
            help="Block hashes as decimal strings (exact in jq), 16 hex digits of the "
            "64-bit key (a 32-byte hash: its last 8 bytes, as vLLM and export's hash_hex), "
            "or JSON numbers (jq rounds those above 2**53). str and int show bytes hashes "
            "in full hex.",
        ),
    ] = "str",
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE.mcap",
            help="Write the selected batches, bytes unchanged, to a new recording (- for stdout).",
            show_default=False,
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Replace an existing --output file.")
    ] = False,
    annotate: Annotated[
        bool,
        typer.Option(
            "--annotate",
            help="Set kind and window of each BlockStored from "
            "the group metadata, as vLLM's KV cache manager does.",
        ),
    ] = False,
    groups: Annotated[
        Path | None,
        typer.Option(
            "--groups",
            metavar="FILE",
            help="Group metadata: JSON as get_kv_cache_group_metadata() "
            "returns it, or a list of spec descriptions.",
            show_default=False,
        ),
    ] = None,
    group_meta: GroupMeta = None,
    group: Annotated[
        list[str] | None,
        typer.Option(
            "--group",
            metavar="IDX",
            help="Keep events of these group indices ('none': without one; repeatable or "
            "comma-separated).",
            show_default=False,
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Compare what the stores say with the group "
            "metadata; one line per disagreeing group; exit 1 if any.",
        ),
    ] = False,
    type_: Annotated[
        list[str] | None,
        typer.Option(
            "--type",
            metavar="TYPE",
            help="Keep these event types (BlockStored, BlockRemoved, "
            "AllBlocksCleared; repeatable or comma-separated).",
            show_default=False,
        ),
    ] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option(
            "--kind",
            metavar="KIND",
            help="Keep stores of these kinds ('unannotated' for none).",
            show_default=False,
        ),
    ] = None,
    window: Annotated[
        list[str] | None,
        typer.Option(
            "--window",
            metavar="WINDOW",
            help="Keep stores with this sliding window ('none': without one).",
            show_default=False,
        ),
    ] = None,
    channel: Annotated[
        list[str] | None,
        typer.Option(
            "--channel",
            metavar="CHANNEL",
            help="Keep these channels (name, endpoint, glob or port).",
            show_default=False,
        ),
    ] = None,
    rank: Annotated[
        list[str] | None,
        typer.Option(
            "--rank", metavar="RANK", help="Keep these data-parallel ranks.", show_default=False
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            metavar="TIME",
            help="Start at this time: seconds from the start (30, 1.5s, "
            "2m) or ISO time (UTC unless a zone is given).",
            show_default=False,
        ),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until", metavar="TIME", help="Stop after this time (as --since).", show_default=False
        ),
    ] = None,
    seq: Annotated[
        str | None,
        typer.Option(
            "--seq",
            metavar="A:B",
            help="Keep seqs A:B (inclusive; A: and :B are open).",
            show_default=False,
        ),
    ] = None,
    publish: Annotated[
        str | None,
        typer.Option(
            "--publish",
            metavar="ENDPOINT",
            help="Re-publish on this endpoint with vLLM's framing (a bare port binds 127.0.0.1).",
            show_default=False,
        ),
    ] = None,
    connect: Annotated[
        bool,
        typer.Option(
            "--connect",
            help="Connect to the --publish endpoint (a subscriber that binds, e.g. a "
            "KV-cache indexer) instead of binding it.",
        ),
    ] = False,
    replay_endpoint: Annotated[
        str | None,
        typer.Option(
            "--replay-endpoint",
            metavar="ENDPOINT",
            help="Serve vLLM's replay ROUTER protocol here.",
            show_default=False,
        ),
    ] = None,
    legacy_replay: Annotated[
        bool,
        typer.Option(
            "--legacy-replay", help="Replay replies without the topic frame (vLLM < 0.26, SGLang)."
        ),
    ] = False,
    buffer_steps: Annotated[
        str,
        typer.Option("--buffer-steps", metavar="N", help="Batches the replay socket can serve."),
    ] = "10000",
    renumber: Annotated[
        bool, typer.Option("--renumber", help="Send seqs from 0 instead of the recorded ones.")
    ] = False,
    speed: Annotated[
        str | None,
        typer.Option(
            "--speed",
            metavar="X",
            help="Play the recorded pace this many times faster.",
            show_default=False,
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            "--rate", metavar="N", help="Send this many batches per second.", show_default=False
        ),
    ] = None,
    max_speed: Annotated[
        bool, typer.Option("--max-speed", help="Send as fast as possible.")
    ] = False,
    loop: Annotated[
        str, typer.Option("--loop", metavar="N|forever", help="Play N times, or 'forever'.")
    ] = "1",
    wait_subscribers: Annotated[
        str,
        typer.Option(
            "--wait-subscribers",
            metavar="N",
            help="Wait for N subscriptions before the first batch (ZeroMQ slow joiner).",
        ),
    ] = "0",
    wait_timeout: Annotated[
        str | None,
        typer.Option(
            "--wait-timeout",
            metavar="S",
            help="Give up waiting for subscribers after S seconds (default: wait forever).",
            show_default=False,
        ),
    ] = None,
    start_delay: Annotated[
        str | None,
        typer.Option(
            "--start-delay",
            metavar="S",
            help="Wait S seconds before the first batch.",
            show_default=False,
        ),
    ] = None,
    hold: Annotated[
        str | None,
        typer.Option(
            "--hold",
            metavar="S",
            help="Keep serving replay requests S seconds after the last batch "
            "(default: 1 with --replay-endpoint, else 0).",
            show_default=False,
        ),
    ] = None,
    drop: Annotated[
        str | None,
        typer.Option(
            "--drop",
            metavar="SEQS",
            help="Keep these seqs (e.g. 5,9,20:30) out of the live stream; they stay in "
            "the replay buffer, so a subscriber must recover them.",
            show_default=False,
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress or status on stderr.")
    ] = False,
) -> ExitStatus:
    """Replay recordings as events: print, filter, annotate, check, copy or re-publish.

    Several recordings merge by receive time. Event filters (--type, --kind, --window,
    --group IDX) choose events to print and, for -o and --publish, the batches holding
    them (whole batches, bytes unchanged). With --annotate the group metadata comes from
    --groups, --group-meta IDX=KIND[:WINDOW], the recording's metadata record, or else
    what the recording's annotated stores say, per channel, rank and group (stderr says
    which). Formats: pretty (a table of events, default on a terminal) and jsonl (one
    JSON object per event, default when piped); -o writes a recording (.mcap).
    """
    from kvtool.commands._filters import say_if_empty
    from kvtool.replay import Replay
    from kvtool.replay_options import PublishFlags

    env = get_env()
    env.quiet = quiet
    check_inputs([*files, groups])
    ef, group_filter = _event_filter(group, type_, kind, window)
    bf = _batch_filter(channel, rank, since, until, seq)
    pub = PublishFlags(
        publish=publish,
        connect=connect,
        replay_endpoint=replay_endpoint,
        legacy_replay=legacy_replay,
        buffer_steps=buffer_steps,
        renumber=renumber,
        speed=speed,
        rate=rate,
        max_speed=max_speed,
        loop=loop,
        wait_subscribers=wait_subscribers,
        wait_timeout=wait_timeout,
        start_delay=start_delay,
        hold=hold,
        drop=drop,
    )
    group_meta = list(group_meta or [])
    _check_flags(
        hash_format,
        pub,
        annotate=annotate,
        check=check,
        metadata=groups is not None or bool(group_meta),
        output=output,
    )
    _check_output(output, force, [*files, *([groups] if groups is not None else [])])
    show_events = format is not None or (publish is None and output is None and not check)
    out = _Out(
        output=output,
        force=force,
        show_events=show_events,
        fmt=format or (EventFormat.pretty if env.stdout_is_tty else EventFormat.jsonl),
    )
    with Replay(
        files,
        event_filter=ef,
        batch_filter=bf,
        annotate=annotate,
        check=check,
        groups_file=groups,
        group_flags=group_meta or None,
        decode=show_events,
    ) as rp:
        _prepare(rp, env, ef, bf, (since, until), annotate=annotate, check=check)
        rp.hash_format = hash_format  # type: ignore[attr-defined]
        if check:
            return _run_check(rp, env)
        if publish is not None:
            status = _run_publish(rp, env, pub, out, annotate=annotate)
        else:
            status = _run_plain(rp, env, out)
        if not quiet:
            selected_by = [
                (o, ",".join(v) if isinstance(v, list) else v)
                for o, v in (
                    ("--type", type_),
                    ("--kind", kind),
                    ("--window", window),
                    ("--group", group_filter),
                    ("--channel", channel),
                    ("--rank", rank),
                    ("--since", since),
                    ("--until", until),
                    ("--seq", seq),
                )
                if v
            ]
            say_if_empty(rp, env, selected_by)
        return _finish(rp, env, status)


# -- the options, one step each ----------------------------------------------------------


@dataclass(frozen=True)
class _Out:
    """Where the events and the batches go: printed events, the -o recording."""

    output: Path | None
    force: bool
    show_events: bool
    fmt: EventFormat


def _event_filter(
    group: list[str] | None,
    type_: list[str] | None,
    kind: list[str] | None,
    window: list[str] | None,
) -> tuple[EventFilter, list[str]]:
    """Parse --group, --type, --kind and --window into the event filter (and --group's list)."""
    from kvtool.protocol import EVENT_TYPES
    from kvtool.replay import EventFilter, parse_group, parse_window

    for g in group or []:
        if "=" in g:
            # --group once took metadata too; now it only filters (one job per option).
            raise UsageError(
                f"--group {g!r}: --group IDX keeps events of a group; give group metadata "
                f"as --group-meta {g}"
            )
    group_filter = _split(group)
    types: set[str] = set()
    aliases = {e.lower(): e for e in EVENT_TYPES} | _TYPE_ALIASES
    for t in _split(type_):
        name = aliases.get(t.lower())
        if name is None:
            raise UsageError(f"--type {t!r}: expected one of {', '.join(EVENT_TYPES)}")
        types.add(name)
    ef = EventFilter(
        types=frozenset(types) if types else None,
        kinds=frozenset(_split(kind)) if kind else None,
        windows=frozenset(parse_window(w) for w in _split(window)) if window else None,
        groups=frozenset(parse_group(g) for g in group_filter) if group_filter else None,
    )
    return ef, group_filter


def _batch_filter(
    channel: list[str] | None,
    rank: list[str] | None,
    since: str | None,
    until: str | None,
    seq: str | None,
) -> BatchFilter:
    """Parse --channel, --rank, --since, --until and --seq into the batch filter."""
    from kvtool.replay import BatchFilter, parse_rank, parse_seq_range, parse_time_bound

    first, last = parse_seq_range(seq) if seq is not None else (None, None)
    return BatchFilter(
        channels=tuple(_split(channel)) if channel else None,
        ranks=frozenset(parse_rank(r) for r in _split(rank)) if rank else None,
        since=parse_time_bound(since, option="--since") if since is not None else None,
        until=parse_time_bound(until, option="--until") if until is not None else None,
        seq_first=first,
        seq_last=last,
    )


def _check_flags(
    hash_format: str,
    pub: PublishFlags,
    *,
    annotate: bool,
    check: bool,
    metadata: bool,
    output: Path | None,
) -> None:
    """Refuse options that do not go together (before anything is read)."""
    from kvtool.render.events import HASH_FORMATS

    if hash_format not in HASH_FORMATS:
        raise UsageError(f"--hash-format {hash_format!r}: expected one of str, hex, int")
    if metadata and not (annotate or check):
        raise UsageError(
            "--groups and --group-meta give metadata for --annotate or --check; add one of them"
        )
    if check and (pub.publish is not None or output is not None):
        raise UsageError("--check only reports; run it without --publish and -o")
    pub.check()


def _check_output(output: Path | None, force: bool, inputs: list[Path]) -> None:
    """Refuse an -o the output rule refuses, before anything is said or read."""
    from kvtool.outputs import OutputKind, check_output

    if output is not None and not is_stdout(output):
        # The copy checks again when it opens.
        check_output(output, kind=OutputKind.RECORDING, force=force, inputs=inputs)


def _prepare(
    rp: Replay,
    env: Env,
    ef: EventFilter,
    bf: BatchFilter,
    given: tuple[str | None, str | None],
    *,
    annotate: bool,
    check: bool,
) -> None:
    """Say where the metadata comes from, and refuse kinds and times the input cannot match."""
    from kvtool.commands._filters import check_kinds, check_time_order, first_log_time
    from kvtool.replay_run import metadata_line

    if (annotate or check) and not env.quiet:
        _say(env, metadata_line(rp, annotate=annotate, check=check))
    start_ns = first_log_time(rp)
    check_kinds(sorted(ef.kinds or ()), rp)
    check_time_order(bf.since, bf.until, start_ns, given)
    rp.start_ns = start_ns  # type: ignore[attr-defined]


# -- the three modes ---------------------------------------------------------------------


def _say(env: Env, line: str) -> None:
    env.err.print(line, markup=False, highlight=False)


def _sinks(rp: Replay, env: Env, out: _Out) -> ReplaySinks:
    """Open the event printer and the -o recording."""
    from kvtool.replay_run import ReplaySinks

    stream = _binary_stdout(env, out.output, out.show_events) if out.output is not None else None
    return ReplaySinks(
        rp,
        stdout=env.stdout,
        console=env.out,
        jsonl=out.fmt is EventFormat.jsonl,
        output=out.output,
        force=out.force,
        show_events=out.show_events,
        stream=stream,
    )


def _binary_stdout(env: Env, output: Path, show_events: bool) -> IO[bytes] | None:
    """The stream for ``-o -`` (the recording on stdout), or None for a file output."""
    if not is_stdout(output):
        return None
    if show_events:
        raise UsageError("-o - writes the recording to stdout; drop --format or give -o FILE")
    if env.stdout_is_tty:
        raise UsageError("-o -: refusing to write a binary recording to a terminal; redirect it")
    env.stdout.flush()
    return env.stdout.buffer


def _run_plain(rp: Replay, env: Env, out: _Out) -> ExitStatus:
    from kvtool.render.progress import FileOffsets, input_size

    sinks = _sinks(rp, env, out)
    sizes = {r.path: input_size([r.path]) or 0 for r in rp.readers}
    # A bar only while copying to -o: printed events would scroll it away.
    bar = env.progress(
        f"writing {printable(out.output)}",
        sum(sizes.values()) or None,
        quiet=out.output is None or (out.show_events and env.stdout_is_tty),
    )
    try:
        with bar:
            done = FileOffsets(bar, sizes)
            for item in rp:
                sinks.feed(item)
                done.seen(item.message.channel.path, item.message.offset)
                if rp.new_warnings:
                    _warn(rp, env)
    except BaseException:
        sinks.abort()  # the output stays as it was: no half-written copy
        raise
    sinks.close()
    env.stdout.flush()
    if out.output is not None and not env.quiet:
        where = "stdout" if is_stdout(out.output) else out.output
        _say(env, f"kvtool: wrote {sinks.written} batches to {where}")
    return ExitStatus.OK


def _run_check(rp: Replay, env: Env) -> ExitStatus:
    from kvtool.replay_run import check_summary, nothing_to_check

    for _ in rp:
        pass
    lines = rp.disagreements()
    for line in lines:
        env.stdout.write(printable(line) + "\n")
    env.stdout.flush()
    refused = nothing_to_check(rp)
    if refused is not None:
        _finish(rp, env, ExitStatus.OK)
        raise UsageError(refused)
    if not env.quiet:
        _say(env, check_summary(rp, len(lines)))
    status = _finish(rp, env, ExitStatus.OK)
    return ExitStatus.FAILED if lines else status


def _run_publish(
    rp: Replay, env: Env, pub: PublishFlags, out: _Out, *, annotate: bool
) -> ExitStatus:
    from kvtool.pacing import publish_recording
    from kvtool.render.status import PublishProgress
    from kvtool.replay_options import parse_publishing
    from kvtool.replay_run import publish_start_line, publish_summary

    p = parse_publishing(pub)
    sinks = _sinks(rp, env, out)
    progress = PublishProgress(env.err, enabled=not env.quiet)

    def on_batch(item: ReplayBatch, loop_no: int) -> None:
        if loop_no == 0:
            sinks.feed(item)
        if rp.new_warnings:
            _warn(rp, env)

    def on_start(publisher: Publisher) -> None:
        if not env.quiet:
            _say(env, publish_start_line(publisher, connect=pub.connect))

    def on_wait(n: int) -> None:
        where = printable(p.endpoint)
        progress.status(
            f"waiting for {plural(p.wait_subscribers, 'subscriber')} on {where} ({n} so far)"
        )

    try:
        try:
            result = publish_recording(
                rp,
                p.endpoint,
                p.replay_endpoint,
                pacing=p.pacing,
                legacy_replay=pub.legacy_replay,
                buffer_steps=p.buffer_steps,
                connect=pub.connect,
                loops=p.loops,
                renumber=pub.renumber,
                wait_subscribers=p.wait_subscribers,
                wait_timeout_s=p.wait_timeout_s,
                start_delay_s=p.start_delay_s,
                hold_s=p.hold_s,
                drop=p.drop,
                annotate=annotate,
                on_start=on_start,
                on_batch=on_batch,
                on_sent=progress.update,
                on_wait=on_wait,
            )
        finally:
            progress.stop()
    except KeyboardInterrupt:
        sinks.close()
        _say(env, f"kvtool: interrupted after {progress.sent} batches")
        return ExitStatus.INTERRUPTED
    except BaseException:
        sinks.abort()
        raise
    sinks.close()
    env.stdout.flush()
    if not env.quiet:
        # Say what was published, and warn when nobody was listening (-q silences both).
        for line in publish_summary(result):
            if line is not None:
                _say(env, line)
    return ExitStatus.OK


def _warn(rp: Replay, env: Env) -> None:
    if not env.quiet:
        for w in rp.new_warnings:
            _say(env, f"kvtool: warning: {w}")
    rp.new_warnings.clear()


def _finish(rp: Replay, env: Env, status: ExitStatus) -> ExitStatus:
    """Say what was damaged or left unannotated; exit 3 when input was damaged."""
    from kvtool.replay_run import damage_lines, warning_lines

    if not env.quiet:
        for line in warning_lines(rp):
            _say(env, line)
    # Batches lost while recording, and tails never confirmed, exit 3 as in `info` and `report`.
    damage = [f"kvtool: {line}" for line in missing_batches([r.path for r in rp.readers])]
    damage += damage_lines(rp)
    for line in damage:
        _say(env, line)
    if damage and status == ExitStatus.OK:
        return ExitStatus.DAMAGED
    return status


COMMANDS = {"replay": replay}
COMMAND_OPTIONS = {
    "replay": {
        "epilog": examples(
            "replay run.mcap --type BlockRemoved --seq 60:63 --format jsonl",
            "replay run.mcap --since 1s --until 2s -o slice.mcap",
            "replay old.mcap --annotate --group-meta 0=full_attention \\\n"
            "      --group-meta 1=sliding_window:1024 --format jsonl",
            "replay run.mcap --publish 5557 --replay-endpoint 5558 --speed 4",
        )
    }
}
HELP_PANELS = {
    "replay": {
        "Filters": [
            "--type",
            "--kind",
            "--window",
            "--group",
            "--channel",
            "--rank",
            "--since",
            "--until",
            "--seq",
        ],
        "Annotation": ["--annotate", "--check", "--groups", "--group-meta"],
        "Output": ["--format", "--hash-format", "--output", "--force", "--quiet"],
        "Publishing": [
            "--publish",
            "--connect",
            "--replay-endpoint",
            "--legacy-replay",
            "--buffer-steps",
            "--renumber",
            "--speed",
            "--rate",
            "--max-speed",
            "--loop",
            "--wait-subscribers",
            "--wait-timeout",
            "--start-delay",
            "--hold",
            "--drop",
        ],
    }
}
