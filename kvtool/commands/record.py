"""``kvtool record``: capture vLLM KV-event streams into a recording, recovering gaps."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvtool.commands import Env, examples, get_env, parse_duration_ns
from kvtool.commands._options import DpSize, PoolBlocks, ReplayEndpoints, ReplayTimeout, Topic
from kvtool.endpoints import expand_endpoints
from kvtool.errors import ExitStatus, RecordingError, UsageError
from kvtool.outputs import OutputKind, check_output, is_stdout
from kvtool.text import printable


def record(
    endpoints: Annotated[
        list[str],
        typer.Argument(
            help="Publisher endpoints: tcp://HOST:PORT, ipc://PATH, inproc://NAME, or a "
            "bare port (tcp://127.0.0.1:PORT).",
            show_default=False,
            metavar="ENDPOINT...",
        ),
    ],
    output: Annotated[
        Path,
        typer.Option(
            "--output", "-o", metavar="FILE.mcap", help="The recording to write (a file, not -)."
        ),
    ],
    bind: Annotated[
        bool, typer.Option("--bind", help="Bind the endpoints instead of connecting to them.")
    ] = False,
    topic: Topic = "",
    dp_size: DpSize = None,
    replay: ReplayEndpoints = None,
    history: Annotated[
        bool,
        typer.Option("--history", help="First fetch what the replay buffer still holds."),
    ] = False,
    duration: Annotated[
        str | None,
        typer.Option(
            "--duration", "-d", metavar="DURATION", help="Stop after this long: 90, 10s, 10m, 1h."
        ),
    ] = None,
    max_batches: Annotated[
        int | None,
        typer.Option(
            "--max-batches", "-n", min=1, metavar="N", help="Stop after this many batches."
        ),
    ] = None,
    groups: Annotated[
        Path | None,
        typer.Option(
            "--groups",
            metavar="FILE",
            help="KV cache group metadata to store: the JSON list "
            "get_kv_cache_group_metadata() returns.",
        ),
    ] = None,
    pool_blocks: PoolBlocks = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replace an existing file (when the first batch arrives)."),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No live status and no summary line.")
    ] = False,
    connect_timeout: Annotated[
        str,
        typer.Option(
            "--connect-timeout",
            metavar="DURATION",
            help="Fail if an endpoint has not connected (nor sent anything) by then; 0 waits "
            "forever.",
        ),
    ] = "30s",
    replay_timeout: ReplayTimeout = "2s",
    status_every: Annotated[
        str,
        typer.Option(
            "--status-every",
            metavar="DURATION",
            help="When stderr is not a terminal (a log), write a plain status line this "
            "often; 0 for none.",
        ),
    ] = "10s",
) -> ExitStatus:
    """Record KV-cache events from vLLM publishers into an MCAP recording.

    Every batch is stored byte for byte. With --replay-endpoint, batches missing from the live
    stream are fetched from the publisher's replay socket and written in seq order;
    what it no longer holds is noted as lost in the recording's gap ledger. Stops at
    --duration or --max-batches, whichever comes first, or on Ctrl-C / SIGTERM, always
    with a properly closed file. Exit status 3 when batches were lost, or live batches
    behind the stream were dropped as strays, or a tail the replay socket never confirmed;
    1 when no batch arrived at all (no publisher
    reached, or it sent nothing): then no file is left at --output.
    """
    # Imported here, not with the command list (pyzmq, the mcap writer, rich).
    from kvtool.capture import Recorder, load_groups
    from kvtool.recording.ledger import parse_ledger
    from kvtool.recording.unconfirmed import ledger_lines
    from kvtool.render.status import no_batch_line, record_status, summary_line

    env = get_env()
    duration_ns = parse_duration_ns(duration, option="--duration") if duration else None
    connect_ns = _timeout_ns(connect_timeout, "--connect-timeout")
    replay_ns = _timeout_ns(replay_timeout, "--replay-timeout") or 2_000_000_000
    every_ns = _timeout_ns(status_every, "--status-every")
    sources = expand_endpoints(endpoints, replay=replay or (), dp_size=dp_size, bind=bind)
    if history and not replay:
        raise UsageError(
            "--history needs --replay-endpoint: the history comes from the replay buffer"
        )
    group_list = load_groups(groups) if groups is not None else None
    pool = _pool_context(pool_blocks, groups, env)
    _check_output(output, force, [groups] if groups is not None else [])

    names = [s.endpoint for s in sources]
    with record_status(env.err, endpoints=names, quiet=quiet, every_ns=every_ns) as status:
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
            extra_context=pool,
            force=force,
            status=status,
        )
        try:
            result = recorder.run()
        except RecordingError as err:
            if "file exists" in str(err) or "cannot create" in str(err):
                raise UsageError(str(err)) from err
            raise
    if result.stats.batches == 0:
        # An empty recording is almost always a wrong endpoint or a publisher that is not
        # up: say so, and fail, rather than end like a successful run. The recorder left no
        # empty file (issue 24: it blocked the rerun), so no summary of one either.
        env.err.print(no_batch_line(result, names), markup=False, highlight=False)
        if result.kept_old:
            env.err.print(
                f"kvtool: {printable(str(output))} was left as it was "
                "(--force replaces a recording only once a batch arrives)",
                markup=False,
                highlight=False,
            )
        elif not output.exists():
            env.err.print(
                f"kvtool: nothing recorded, so no file was written at {printable(str(output))}",
                markup=False,
                highlight=False,
            )
        return ExitStatus.FAILED
    if not quiet:
        env.err.print(summary_line(result), markup=False, highlight=False)
    damaged = False
    if result.stats.stray:
        # Behind the stream and not a restart: two publishers on one topic and endpoint, or
        # a peer resending. Their seqs are in the file already (or in the gap ledger), but
        # what they carried is not: that is never a clean run.
        n = result.stats.stray
        what = "1 live batch" if n == 1 else f"{n:,} live batches"
        env.err.print(
            f"kvtool: {what} arrived behind the stream and {'was' if n == 1 else 'were'} "
            "dropped (already in the recording, or listed as lost in its gap ledger); two "
            "publishers on one topic, or a peer resending?",
            markup=False,
            highlight=False,
        )
        damaged = True
    if result.stats.lost or result.stats.unconfirmed:
        # Batches lost while recording, and (issue 23) a tail the replay socket never
        # confirmed: said in the words `info` and `report` say them of this file.
        for line in ledger_lines(str(output), parse_ledger(result.ledger)):
            env.err.print(f"kvtool: {printable(line)}", markup=False, highlight=False)
        damaged = True
    return ExitStatus.DAMAGED if damaged else ExitStatus.OK


def _timeout_ns(text: str, option: str) -> int | None:
    if text.strip() in ("0", "0s", "none", "inf"):
        return None
    return parse_duration_ns(text, option=option)


def _check_output(output: Path, force: bool, inputs: list[Path]) -> None:
    """Fail early, before any socket, on an output path kvtool must not write."""
    if is_stdout(output):
        raise UsageError("record -o -: a recording is a file (it survives a crash); give a path")
    check_output(output, kind=OutputKind.RECORDING, force=force, inputs=inputs)


def _pool_context(pool_blocks: int | None, groups: Path | None, env: Env) -> dict[str, object]:
    """The ``pool_blocks`` metadata key: ``--pool-blocks``, else the groups file's size."""
    from kvtool.poolsize import resolve_pool_blocks

    size = resolve_pool_blocks(pool_blocks, groups, ())
    for line in size.findings:
        env.err.print(f"kvtool: {printable(line)}", markup=False, highlight=False)
    return {} if size.blocks is None else {"pool_blocks": size.blocks}


COMMANDS = {"record": record}
COMMAND_OPTIONS = {
    "record": {
        "epilog": examples(
            "record tcp://gpu:5557 --replay-endpoint tcp://gpu:5558 -o run.mcap",
            "record tcp://gpu:5557 --replay-endpoint tcp://gpu:5558 --dp-size 4 \\\n"
            "      -o fleet.mcap --duration 10m",
            "record 5557 -o run.mcap --max-batches 1000 --groups groups.json",
        )
    }
}
HELP_PANELS = {
    "record": {
        "Connection": ["--bind", "--topic", "--dp-size", "--connect-timeout"],
        "Gap recovery": ["--replay-endpoint", "--history", "--replay-timeout"],
        "Stopping": ["--duration", "--max-batches"],
        "Output": ["--output", "--force", "--groups", "--quiet", "--status-every"],
    }
}
