"""What ``top`` and ``serve`` share: a recording or endpoints, the live source, /metrics, the gaps.

Both commands read a recording or live endpoints, can serve ``/metrics``, and say at the
end what their numbers miss; the helpers live here so neither command imports the other.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from kvtool.commands import get_env, parse_duration_ns
from kvtool.errors import UsageError
from kvtool.text import plural

if TYPE_CHECKING:
    from kvtool.report.feed import ReportFeed
    from kvtool.serve import Exporter
    from kvtool.serve_http import MetricsServer
    from kvtool.streams import LiveSource, RecordingSource


def is_recording(targets: list[str]) -> bool:
    """True when ``targets`` is one recording (FILE.mcap, or an existing file)."""
    if len(targets) != 1:
        return False
    t = targets[0]
    return t.endswith(".mcap") or (os.path.isfile(t) and "://" not in t)


def open_server(addr: str, exporter: Exporter) -> MetricsServer:
    """Bind ``/metrics`` at ``addr`` (``--metrics``) and say where on stderr.

    Args:
        addr: ``HOST:PORT`` or ``PORT``.
        exporter: The :class:`kvtool.serve.Exporter`.

    Returns:
        The started :class:`kvtool.serve.MetricsServer`.
    """
    from kvtool.serve_http import MetricsServer, is_loopback, parse_bind

    host, port = parse_bind(addr)
    server = MetricsServer(exporter, host, port).start()
    env = get_env()
    note = "" if is_loopback(host) else " (not loopback: reachable from other hosts)"
    env.err.print(f"kvtool: serving {server.url}{note}", markup=False, highlight=False)
    return server


def live_source(
    targets: list[str],
    replay: list[str] | None,
    dp_size: int | None,
    topic: str,
    record: Path | None,
    force: bool,
    groups: Path | None,
    replay_timeout: str,
    *,
    whole_stream: bool = False,
    max_keys: int | None = None,
    group_flags: list[str] | None = None,
    report_mode: str = "auto",
) -> tuple[LiveSource, ReportFeed]:
    """Build the live source and feed of `top`/`serve` from their options.

    Args:
        targets: The endpoints.
        replay: ``--replay-endpoint`` values.
        dp_size: ``--dp-size``.
        topic: ``--topic``.
        record: ``--record FILE``.
        force: ``--force``.
        groups: ``--groups FILE``.
        replay_timeout: ``--replay-timeout``.
        whole_stream: The feed also keeps the whole stream's report (``top``'s views),
            not only the per-rank ones (``serve``).
        max_keys: Bound the per-rank state (``serve --remember-keys``); None: exact.
        group_flags: ``--group-meta IDX=KIND[:WINDOW]`` flags (``none=KIND``: the kind of
            events without ``group_idx``, e.g. SGLang's; issue 21).
        report_mode: ``--report-mode`` (``auto``, ``full``, ``incremental``).

    Returns:
        (:class:`kvtool.top.LiveSource`, :class:`kvtool.top.ReportFeed`).
    """
    from kvtool.capture import load_groups
    from kvtool.endpoints import expand_endpoints
    from kvtool.outputs import OutputKind, check_output, is_stdout
    from kvtool.report.feed import ReportFeed as Feed
    from kvtool.streams import LiveSource

    sources = expand_endpoints(targets, replay=replay or (), dp_size=dp_size)
    if record is not None:
        if is_stdout(record):
            raise UsageError("--record -: a recording is a file; give a path")
        check_output(
            record,
            kind=OutputKind.RECORDING,
            force=force,
            inputs=[groups] if groups is not None else [],
        )
    group_list = load_groups(groups) if groups is not None else None
    groups_source = str(groups) if groups is not None else ""
    metadata: list[tuple[str, dict[str, object]]] = []
    if group_flags:
        # What `replay --annotate --group-meta ... -o COPY` stores (kvtool.export), so the
        # recording reads back annotated as the live view was (issue 21): the none=KIND rule
        # in a kvtool.ungrouped record; flags naming groups 0..N-1 (no --groups file) as
        # the groups record.
        from kvtool.groups import parse_group_flags
        from kvtool.recording.format import META_UNGROUPED

        table = parse_group_flags(group_flags)
        rule = table.ungrouped_metadata()
        if rule is not None:
            metadata.append((META_UNGROUPED, rule))
        if (
            group_list is None
            and table.groups
            and sorted(table.groups) == list(range(len(table.groups)))
        ):
            group_list, groups_source = table.to_metadata(), table.source
    replay_ns = parse_duration_ns(replay_timeout, option="--replay-timeout")
    source = LiveSource(
        sources,
        record=str(record) if record is not None else None,
        topic=topic,
        force=force,
        replay_timeout_ns=replay_ns,
        groups=group_list,
        groups_source=groups_source,
        metadata=metadata,
    )
    feed = Feed(
        groups_file=str(groups) if groups is not None else None,
        group_flags=group_flags,
        whole_stream=whole_stream,
        max_keys=max_keys,
        report_mode=report_mode,
    )
    return source, feed


def source_problems(source: LiveSource | RecordingSource, feed: ReportFeed) -> list[str]:
    """What the numbers of ``top``'s or ``serve``'s source miss: one line each (issue 24).

    A damaged or truncated recording, batches lost while recording, a channel tail the
    replay socket never confirmed (issue 23), and malformed batches or events; any of
    them exits 3, as ``report`` does for the same file.

    Args:
        source: The source, stopped.
        feed: The report feed it was fed into.

    Returns:
        The lines, none when nothing is missing.
    """
    from kvtool.commands import missing_batches
    from kvtool.streams import RecordingSource

    lines: list[str] = []
    if isinstance(source, RecordingSource):
        if source.recovery.damaged:
            lines.append(source.recovery.summary())
        lines += missing_batches([source.path])
    else:
        # The live recorder's ledger, in the words a recording's ledger is said in: lost
        # batches and (issue 23) a tail asked for and never confirmed, each exits 3.
        from kvtool.recording.unconfirmed import ledger_lines

        lines += ledger_lines(source.path, source.recorder.ledger())
    st = feed.stats
    if st.bad_batches or st.skipped_events:
        first = f" (first: {st.problems[0]})" if st.problems else ""
        lines.append(
            f"{source.path}: skipped {plural(st.bad_batches, 'malformed batch')} and "
            f"{plural(st.skipped_events, 'event')}{first}; the numbers miss them"
        )
    return lines
