"""``kvtool replay``: print, filter, annotate, check, copy or re-publish recordings."""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, cast

import typer

from kvtool.commands import Env, check_inputs, examples, get_env, missing_batches
from kvtool.commands._options import GroupMeta
from kvtool.errors import ExitStatus, UsageError
from kvtool.outputs import is_stdout
from kvtool.text import printable

# The replay library (msgspec, rich, the recording copy) is imported when the command
# runs, so `kvtool --help` and `kvtool replay --help` answer without it.
if TYPE_CHECKING:
    from kvtool.export import RecordingCopy
    from kvtool.pacing import PublishResult
    from kvtool.publish import Publisher
    from kvtool.render.events import HashFormat
    from kvtool.replay import Replay, ReplayBatch


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


def _number(text: str | None, option: str, *, integer: bool = False, zero: bool = False) -> float:
    if text is None:
        raise UsageError(f"{option}: missing value")
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise UsageError(f"{option} {text!r}: expected {kind}") from None
    if value < 0 or (value == 0 and not zero) or value != value:
        raise UsageError(f"{option} {text!r}: must be {'>= 0' if zero else '> 0'}")
    return value


_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")


def _seconds(text: str | None, option: str) -> float:
    if text is None:
        return 0.0
    m = _DURATION.match(text)
    if not m:
        raise UsageError(f"{option} {text!r}: expected seconds (e.g. 2, 0.5, 500ms, 1m)")
    return float(m.group(1)) * {"ms": 0.001, "s": 1.0, "m": 60.0}[m.group(2) or "s"]


def _seq_set(text: str | None) -> frozenset[int]:
    from kvtool.replay import parse_seq_range

    out: set[int] = set()
    for part in _split([text] if text else None):
        a, b = parse_seq_range(part)
        if a is None or b is None or b - a > 10_000_000:
            raise UsageError(f"--drop {part!r}: expected seqs like 5,9,20:30")
        out.update(range(a, b + 1))
    return frozenset(out)


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
    from kvtool.commands._filters import (
        check_kinds,
        check_time_order,
        first_log_time,
        say_if_empty,
    )
    from kvtool.outputs import OutputKind, check_output, is_stdout
    from kvtool.protocol import EVENT_TYPES
    from kvtool.render.events import HASH_FORMATS
    from kvtool.replay import (
        BatchFilter,
        EventFilter,
        Replay,
        parse_group,
        parse_rank,
        parse_seq_range,
        parse_time_bound,
        parse_window,
    )

    env = get_env()
    env.quiet = quiet
    check_inputs([*files, groups])

    # -- parse and check the flags -------------------------------------------------------
    for g in group or []:
        if "=" in g:
            # --group once took metadata too; now it only filters (one job per option).
            raise UsageError(
                f"--group {g!r}: --group IDX keeps events of a group; give group metadata "
                f"as --group-meta {g}"
            )
    group_meta = list(group_meta or [])
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
    first, last = parse_seq_range(seq) if seq is not None else (None, None)
    bf = BatchFilter(
        channels=tuple(_split(channel)) if channel else None,
        ranks=frozenset(parse_rank(r) for r in _split(rank)) if rank else None,
        since=parse_time_bound(since, option="--since") if since is not None else None,
        until=parse_time_bound(until, option="--until") if until is not None else None,
        seq_first=first,
        seq_last=last,
    )
    if hash_format not in HASH_FORMATS:
        raise UsageError(f"--hash-format {hash_format!r}: expected one of str, hex, int")
    if (groups is not None or group_meta) and not (annotate or check):
        raise UsageError(
            "--groups and --group-meta give metadata for --annotate or --check; add one of them"
        )
    if check and (publish is not None or output is not None):
        raise UsageError("--check only reports; run it without --publish and -o")
    publishing_only = [
        ("--replay-endpoint", replay_endpoint is not None),
        ("--legacy-replay", legacy_replay),
        ("--renumber", renumber),
        ("--speed", speed is not None),
        ("--rate", rate is not None),
        ("--max-speed", max_speed),
        ("--loop", loop != "1"),
        ("--wait-subscribers", wait_subscribers != "0"),
        ("--start-delay", start_delay is not None),
        ("--drop", drop is not None),
        ("--connect", connect),
    ]
    if publish is None:
        for flag, given in publishing_only:
            if given:
                raise UsageError(f"{flag} needs --publish ENDPOINT")
    if sum([speed is not None, rate is not None, max_speed]) > 1:
        raise UsageError("give only one of --speed, --rate and --max-speed")
    if replay_endpoint is None and legacy_replay:
        raise UsageError("--legacy-replay needs --replay-endpoint")

    if output is not None and not is_stdout(output):
        # Refused before anything is said or read (the copy checks again when it opens).
        check_output(
            output,
            kind=OutputKind.RECORDING,
            force=force,
            inputs=[*files, *([groups] if groups is not None else [])],
        )

    show_events = format is not None or (publish is None and output is None and not check)
    fmt = format or (EventFormat.pretty if env.stdout_is_tty else EventFormat.jsonl)

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
        if (annotate or check) and not quiet:
            verb = "annotating" if annotate else "checking"
            if check and not annotate and all(t is None for t in rp.tables.values()):
                # Nothing learned from the stores is metadata to check them against.
                line = (
                    "kvtool: checking: no group metadata; the stores are compared only with "
                    "each other"
                )
            else:
                line = f"kvtool: {verb} with group metadata from {rp.metadata_source()}"
            env.err.print(line, markup=False, highlight=False)
        start_ns = first_log_time(rp)
        check_kinds(sorted(ef.kinds or ()), rp)
        check_time_order(bf.since, bf.until, start_ns, (since, until))
        rp.start_ns = start_ns  # type: ignore[attr-defined]
        rp.hash_format = hash_format  # type: ignore[attr-defined]
        if check:
            return _run_check(rp, env)
        if publish is not None:
            status = _run_publish(
                rp,
                env,
                publish=publish,
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
                connect=connect,
                output=output,
                force=force,
                show_events=show_events,
                fmt=fmt,
                annotate=annotate,
            )
        else:
            status = _run_plain(
                rp, env, output=output, force=force, show_events=show_events, fmt=fmt
            )
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
        if not quiet:
            say_if_empty(rp, env, selected_by)
        return _finish(rp, env, status)


# -- the three modes ---------------------------------------------------------------------


class _Sinks:
    """Event printing and the -o recording, fed batch by batch."""

    def __init__(
        self,
        rp: Replay,
        env: Env,
        *,
        output: Path | None,
        force: bool,
        show_events: bool,
        fmt: EventFormat,
    ) -> None:
        from kvtool.export import RecordingCopy
        from kvtool.render.events import JsonlWriter, PrettyWriter

        self.copy: RecordingCopy | None = None
        self.stdout = env.stdout
        self.printer: JsonlWriter | PrettyWriter | None = None
        if show_events:
            multi = len(rp.readers) > 1 or any(len(r.channels) > 1 for r in rp.readers)
            hf = cast("HashFormat", getattr(rp, "hash_format", "str"))
            self.printer = (
                JsonlWriter(env.stdout, hash_format=hf)
                if fmt is EventFormat.jsonl
                else PrettyWriter(
                    env.out,
                    multi_channel=multi,
                    hash_format=hf,
                    start_ns=getattr(rp, "start_ns", None),
                )
            )
        if output is not None:
            self.copy = RecordingCopy(
                output,
                rp.readers,
                given=rp.given,
                force=force,
                stream=_binary_stdout(env, output, show_events),
            )

    @property
    def written(self) -> int:
        return self.copy.written if self.copy is not None else 0

    def feed(self, item: ReplayBatch) -> None:
        if self.printer is not None:
            if getattr(self.stdout, "reader_gone", False):
                # `| head` closed stdout: nothing printed arrives; the replay goes on to
                # its end only for what decides the exit status (lost batches, damage).
                self.printer = None
            else:
                self.printer.write(item)
        if self.copy is not None:
            self.copy.write(item.message)

    def close(self) -> None:
        if self.copy is not None:
            self.copy.close()

    def abort(self) -> None:
        if self.copy is not None:
            self.copy.abort()


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


def _run_plain(
    rp: Replay, env: Env, *, output: Path | None, force: bool, show_events: bool, fmt: EventFormat
) -> ExitStatus:
    from kvtool.render.progress import FileOffsets, input_size

    sinks = _Sinks(rp, env, output=output, force=force, show_events=show_events, fmt=fmt)
    sizes = {r.path: input_size([r.path]) or 0 for r in rp.readers}
    # A bar only while copying to -o: printed events would scroll it away.
    bar = env.progress(
        f"writing {printable(output)}",
        sum(sizes.values()) or None,
        quiet=output is None or (show_events and env.stdout_is_tty),
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
    if output is not None and not env.quiet:
        where = "stdout" if is_stdout(output) else output
        env.err.print(
            f"kvtool: wrote {sinks.written} batches to {where}", markup=False, highlight=False
        )
    return ExitStatus.OK


def _run_check(rp: Replay, env: Env) -> ExitStatus:
    for _ in rp:
        pass
    assert rp.checker is not None
    lines = rp.disagreements()
    for line in lines:
        env.stdout.write(printable(line) + "\n")
    env.stdout.flush()
    c = rp.checker
    metadata = any(t is not None for t in rp.tables.values())
    if c.stores and not (metadata or c.against_each_other):
        # No metadata and no store that says a kind (the legacy layout): nothing was
        # compared with anything; neither "no disagreement" nor a disagreement is true.
        _finish(rp, env, ExitStatus.OK)
        raise UsageError(
            f"--check: nothing to check the {c.stores} stores against: no group metadata, and "
            "no store carries a kind; give --groups FILE or --group-meta IDX=KIND[:WINDOW]"
        )
    if not env.quiet:
        parts = []
        if c.against_metadata:
            parts.append(f"{c.against_metadata} against the group metadata")
        if c.against_each_other:
            parts.append(
                f"{c.against_each_other} without metadata only against each other (the "
                "stores of their channel, rank and group)"
            )
        if c.unchecked:
            parts.append(f"{c.unchecked} with no kind and no metadata (nothing to compare)")
        if c.stores_without_group:
            parts.append(f"{c.stores_without_group} without group_idx (not comparable)")
        verdict = f"{len(lines)} group(s) disagree" if lines else "no disagreement"
        env.err.print(
            f"kvtool: checked {c.stores} stores ({'; '.join(parts)}): {verdict}",
            markup=False,
            highlight=False,
        )
    status = _finish(rp, env, ExitStatus.OK)
    return ExitStatus.FAILED if lines else status


def _run_publish(
    rp: Replay,
    env: Env,
    *,
    publish: str,
    replay_endpoint: str | None,
    legacy_replay: bool,
    buffer_steps: str,
    renumber: bool,
    speed: str | None,
    rate: str | None,
    max_speed: bool,
    loop: str,
    wait_subscribers: str,
    wait_timeout: str | None,
    start_delay: str | None,
    hold: str | None,
    drop: str | None,
    connect: bool,
    output: Path | None,
    force: bool,
    show_events: bool,
    fmt: EventFormat,
    annotate: bool,
) -> ExitStatus:
    from kvtool.endpoints import parse_endpoint
    from kvtool.pacing import Pacing, publish_recording
    from kvtool.render.status import PublishProgress
    from kvtool.text import printable

    drop_set = _seq_set(drop)
    endpoint = parse_endpoint(publish, option="--publish", bind=not connect)
    rep_ep = (
        parse_endpoint(replay_endpoint, option="--replay-endpoint") if replay_endpoint else None
    )
    if rep_ep == endpoint:
        raise UsageError(f"--publish and --replay-endpoint are the same endpoint {endpoint}")
    loops: int | None
    if loop.strip().lower() in ("forever", "inf", "infinite"):
        loops = None
    else:
        loops = int(_number(loop, "--loop", integer=True))
    pacing = Pacing(
        speed=_number(speed, "--speed") if speed is not None else 1.0,
        rate=_number(rate, "--rate") if rate is not None else None,
        max_speed=max_speed,
    )
    steps = int(_number(buffer_steps, "--buffer-steps", integer=True))
    n_wait = int(_number(wait_subscribers, "--wait-subscribers", integer=True, zero=True))
    wait_s = _seconds(wait_timeout, "--wait-timeout") if wait_timeout is not None else None
    delay_s = _seconds(start_delay, "--start-delay")
    hold_s = _seconds(hold, "--hold") if hold is not None else (1.0 if rep_ep else 0.0)

    sinks = _Sinks(rp, env, output=output, force=force, show_events=show_events, fmt=fmt)
    progress = PublishProgress(env.err, enabled=not env.quiet)

    def on_batch(item: ReplayBatch, loop_no: int) -> None:
        if loop_no == 0:
            sinks.feed(item)
        if rp.new_warnings:
            _warn(rp, env)

    def on_start(pub: Publisher) -> None:
        if not env.quiet:
            first = pub.first.stats
            where = printable(first.endpoint) + (
                f", replay on {printable(first.replay_endpoint)}" if first.replay_endpoint else ""
            )
            verb = "publishing to" if connect else "publishing on"
            env.err.print(f"kvtool: {verb} {where}", markup=False, highlight=False)

    def on_wait(n: int) -> None:
        progress.status(f"waiting for {n_wait} subscriber(s) on {printable(endpoint)} ({n} so far)")

    try:
        try:
            result = publish_recording(
                rp,
                endpoint,
                rep_ep,
                pacing=pacing,
                legacy_replay=legacy_replay,
                buffer_steps=steps,
                connect=connect,
                loops=loops,
                renumber=renumber,
                wait_subscribers=n_wait,
                wait_timeout_s=wait_s,
                start_delay_s=delay_s,
                hold_s=hold_s,
                drop=drop_set,
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
        env.err.print(
            f"kvtool: interrupted after {progress.sent} batches", markup=False, highlight=False
        )
        return ExitStatus.INTERRUPTED
    except BaseException:
        sinks.abort()
        raise
    sinks.close()
    env.stdout.flush()
    _publish_summary(env, result)
    return ExitStatus.OK


def _publish_summary(env: Env, result: PublishResult) -> None:
    """Say what was published, and warn when nobody was listening (-q silences both)."""
    from kvtool.text import printable

    stats = result.stats
    if not env.quiet:
        eps = ", ".join(
            printable(c.endpoint)
            + (
                f" ({c.replay_requests} replay requests, {c.replayed} replayed"
                + (f", {c.replay_refused} refused" if c.replay_refused else "")
                + (f", {c.replay_abandoned} abandoned" if c.replay_abandoned else "")
                + ")"
                if c.replay_endpoint
                else ""
            )
            for c in result.channels
        )
        env.err.print(
            f"kvtool: published {stats.sent} batches in {stats.seconds:.2f}s "
            f"({stats.rate:,.0f}/s) on {eps or printable(result.endpoint)}",
            markup=False,
            highlight=False,
        )
    if result.unheard and not env.quiet:
        # ZeroMQ's slow joiner: a short recording is sent before a subscriber's
        # connection and subscription arrive, and PUB drops what nobody subscribed to.
        env.err.print(
            f"kvtool: warning: no subscriber was connected to {printable(result.endpoint)} "
            f"while {stats.sent} batches were published, so nobody received them; start the "
            "subscriber first and pass --wait-subscribers 1 (or --start-delay 2s)",
            markup=False,
            highlight=False,
        )


def _warn(rp: Replay, env: Env) -> None:
    if not env.quiet:
        for w in rp.new_warnings:
            env.err.print(f"kvtool: warning: {w}", markup=False, highlight=False)
    rp.new_warnings.clear()


def _finish(rp: Replay, env: Env, status: ExitStatus) -> ExitStatus:
    """Say what was damaged or left unannotated; exit 3 when input was damaged."""
    for line in rp.unlearned() + rp.out_of_range() + rp.findings():
        if not env.quiet:
            env.err.print(f"kvtool: warning: {line}", markup=False, highlight=False)
    damaged = False
    # Batches lost while recording, and tails never confirmed, exit 3 as in `info` and `report`.
    for line in missing_batches([r.path for r in rp.readers]):
        damaged = True
        env.err.print(f"kvtool: {line}", markup=False, highlight=False)
    for rep in rp.recoveries:
        if not rep.complete:
            damaged = True
            env.err.print(f"kvtool: {rep.summary()}", markup=False, highlight=False)
    st = rp.stats
    if st.decode_errors or st.skipped_events:
        damaged = True
        first = st.first_errors[0] if st.first_errors else ""
        env.err.print(
            f"kvtool: {st.decode_errors} payload(s) and {st.skipped_events} event(s) could not "
            f"be decoded and were skipped (first: {first}); every other batch was replayed",
            markup=False,
            highlight=False,
        )
    if damaged and status == ExitStatus.OK:
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
