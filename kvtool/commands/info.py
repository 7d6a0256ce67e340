"""``kvtool info``: what a recording holds, like ``ros2 bag info``."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from kvtool.commands import TextOutput, check_inputs, examples, get_env
from kvtool.commands._options import ForceText, OutputFile, PoolBlocks
from kvtool.errors import ExitStatus, KvtoolError, UsageError
from kvtool.text import printable


class InfoFormat(StrEnum):
    """Output formats of ``kvtool info``."""

    table = "table"
    json = "json"


def info(
    files: Annotated[
        list[Path],
        typer.Argument(
            help="Recordings (.mcap) to summarise; a directory means its .mcap files.",
            show_default=False,
            metavar="FILE...",
        ),
    ],
    format: Annotated[
        InfoFormat,
        typer.Option("--format", "-f", help="table (for people) or json (for scripts)."),
    ] = InfoFormat.table,
    output: OutputFile = None,
    force: ForceText = False,
    pool_blocks: PoolBlocks = None,
) -> ExitStatus:
    """Summarise recordings: channels, batches, events, blocks, gaps, restarts, groups.

    A truncated or damaged file is summarised from everything that could be read;
    one line on stderr then says what was recovered and kvtool exits with status 3.
    Batches lost while recording and undecodable payloads also exit 3, as in report.
    With --format json one file gives one object, several files a list.
    --pool-blocks gives the engine's num_gpu_blocks where the recording does not hold it
    (or overrides what it holds), as report takes it.
    """
    # Imported here, not with the command list: `kvtool --help` needs none of them.
    from kvtool.info import RecordingInfo, summarize
    from kvtool.render.info import render_info_json, render_info_table

    env = get_env()
    # A directory (as `ros2 bag info` takes a bag folder) stands for its .mcap files.
    expanded: list[Path] = []
    for path in files:
        if path.is_dir():
            found = sorted(path.glob("*.mcap"))
            if not found:
                raise UsageError(f"{path}: directory holds no .mcap recordings")
            expanded += found
        else:
            expanded.append(path)
    files = expanded
    check_inputs(files)
    out = TextOutput(env, output, force=force, inputs=files)
    infos: list[RecordingInfo] = []
    status = ExitStatus.OK
    errors: list[KvtoolError] = []
    for path in files:
        try:
            infos.append(summarize(path))
            if pool_blocks is not None:
                infos[-1].pool_blocks = pool_blocks
        except KvtoolError as err:
            if len(files) == 1:
                raise
            errors.append(err)
    if infos:
        if format is InfoFormat.json:
            render_info_json(infos, out.stream)
        else:
            render_info_table(infos, out.console)
    out.close()
    for i in infos:
        # Damage, lost batches and undecodable payloads exit 3, as in `kvtool report`.
        for line in i.problems():
            env.err.print(f"kvtool: {printable(line)}", markup=False, highlight=False)
            status = ExitStatus.DAMAGED
    for failure in errors:
        env.err.print(f"kvtool: {printable(failure)}", markup=False, highlight=False)
    # A file that could not be read at all outranks one read with damage.
    if errors:
        status = errors[0].exit_status
    return status


COMMANDS = {"info": info}
COMMAND_OPTIONS = {
    "info": {
        "epilog": examples(
            "info run.mcap",
            "info recordings/",
            "info run.mcap --format json | jq .gaps",
            "info run.mcap --format json -o info.json",
        )
    }
}
