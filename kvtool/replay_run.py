"""What a replay run feeds and says: its sinks (printed events, the -o copy) and its lines.

The library half of ``kvtool replay`` after :class:`kvtool.replay.Replay` is open: the
command parses options and prints; this module decides what goes where and words every
summary (the metadata source, the ``--check`` verdict, the publish summary, damage).
It never prints to a stream it was not handed and never imports the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, TYPE_CHECKING, TextIO, cast

from kvtool.text import plural, printable

if TYPE_CHECKING:
    from rich.console import Console

    from kvtool.export import RecordingCopy
    from kvtool.pacing import PublishResult
    from kvtool.publish import Publisher
    from kvtool.render.events import HashFormat, JsonlWriter, PrettyWriter
    from kvtool.replay import Replay, ReplayBatch

__all__ = [
    "ReplaySinks",
    "check_summary",
    "damage_lines",
    "metadata_line",
    "nothing_to_check",
    "publish_start_line",
    "publish_summary",
    "warning_lines",
]


class ReplaySinks:
    """Event printing and the -o recording, fed batch by batch.

    Args:
        rp: The open replay (its ``hash_format`` and ``start_ns`` are read when set).
        stdout: The data stream (jsonl goes here; ``reader_gone`` stops the printing).
        console: The console pretty events go to.
        jsonl: Print jsonl rather than the pretty table.
        output: ``-o``, or None.
        force: ``--force``.
        show_events: Print events.
        stream: The binary stream of ``-o -``, or None for a file output.
    """

    def __init__(
        self,
        rp: Replay,
        *,
        stdout: TextIO,
        console: Console,
        jsonl: bool,
        output: Path | None,
        force: bool,
        show_events: bool,
        stream: IO[bytes] | None,
    ) -> None:
        from kvtool.export import RecordingCopy
        from kvtool.render.events import JsonlWriter, PrettyWriter

        self.copy: RecordingCopy | None = None
        self.stdout = stdout
        self.printer: JsonlWriter | PrettyWriter | None = None
        if show_events:
            multi = len(rp.readers) > 1 or any(len(r.channels) > 1 for r in rp.readers)
            hf = cast("HashFormat", getattr(rp, "hash_format", "str"))
            self.printer = (
                JsonlWriter(stdout, hash_format=hf)
                if jsonl
                else PrettyWriter(
                    console,
                    multi_channel=multi,
                    hash_format=hf,
                    start_ns=getattr(rp, "start_ns", None),
                )
            )
        if output is not None:
            self.copy = RecordingCopy(
                output, rp.readers, given=rp.given, force=force, stream=stream
            )

    @property
    def written(self) -> int:
        """Batches written to the -o recording."""
        return self.copy.written if self.copy is not None else 0

    def feed(self, item: ReplayBatch) -> None:
        """Print one batch's events and copy its message.

        Args:
            item: The batch.
        """
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
        """Finish the -o recording."""
        if self.copy is not None:
            self.copy.close()

    def abort(self) -> None:
        """Drop the -o recording: its target stays as it was."""
        if self.copy is not None:
            self.copy.abort()


def metadata_line(rp: Replay, *, annotate: bool, check: bool) -> str:
    """Say where ``--annotate`` / ``--check`` take the group metadata from.

    Args:
        rp: The open replay.
        annotate: ``--annotate``.
        check: ``--check``.

    Returns:
        The ``kvtool: annotating ...`` / ``kvtool: checking ...`` line.
    """
    verb = "annotating" if annotate else "checking"
    if check and not annotate and all(t is None for t in rp.tables.values()):
        # Nothing learned from the stores is metadata to check them against.
        return "kvtool: checking: no group metadata; the stores are compared only with each other"
    return f"kvtool: {verb} with group metadata from {rp.metadata_source()}"


def nothing_to_check(rp: Replay) -> str | None:
    """Say why ``--check`` compared nothing, or None when it compared something.

    Args:
        rp: The replay, run to its end with ``check``.

    Returns:
        The usage error's message, or None.
    """
    c = rp.checker
    assert c is not None
    metadata = any(t is not None for t in rp.tables.values())
    if c.stores and not (metadata or c.against_each_other):
        # No metadata and no store that says a kind (the legacy layout): nothing was
        # compared with anything; neither "no disagreement" nor a disagreement is true.
        return (
            f"--check: nothing to check the {c.stores} stores against: no group metadata, and "
            "no store carries a kind; give --groups FILE or --group-meta IDX=KIND[:WINDOW]"
        )
    return None


def check_summary(rp: Replay, disagreeing: int) -> str:
    """Say what ``--check`` compared and its verdict.

    Args:
        rp: The replay, run to its end with ``check``.
        disagreeing: Groups that disagree (lines printed).

    Returns:
        The ``kvtool: checked N stores (...): VERDICT`` line.
    """
    c = rp.checker
    assert c is not None
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
    if not c.stores:
        return "kvtool: checked no stores (the input holds none): nothing to compare"
    verb = "disagrees" if disagreeing == 1 else "disagree"
    verdict = f"{plural(disagreeing, 'group')} {verb}" if disagreeing else "no disagreement"
    return f"kvtool: checked {plural(c.stores, 'store')} ({'; '.join(parts)}): {verdict}"


def publish_start_line(pub: Publisher, *, connect: bool) -> str:
    """Say where the replay publishes (and serves replay requests).

    Args:
        pub: The started publisher.
        connect: ``--connect``.

    Returns:
        The ``kvtool: publishing on ...`` line.
    """
    first = pub.first.stats
    where = printable(first.endpoint) + (
        f", replay on {printable(first.replay_endpoint)}" if first.replay_endpoint else ""
    )
    verb = "publishing to" if connect else "publishing on"
    return f"kvtool: {verb} {where}"


def publish_summary(result: PublishResult) -> tuple[str, str | None]:
    """Say what was published, and warn when nobody was listening.

    Args:
        result: What :func:`kvtool.pacing.publish_recording` returned.

    Returns:
        The ``kvtool: published ...`` line, and the no-subscriber warning or None.
    """
    stats = result.stats
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
    line = (
        f"kvtool: published {stats.sent} batches in {stats.seconds:.2f}s "
        f"({stats.rate:,.0f}/s) on {eps or printable(result.endpoint)}"
    )
    warning = None
    if result.unheard:
        # ZeroMQ's slow joiner: a short recording is sent before a subscriber's
        # connection and subscription arrive, and PUB drops what nobody subscribed to.
        warning = (
            f"kvtool: warning: no subscriber was connected to {printable(result.endpoint)} "
            f"while {stats.sent} batches were published, so nobody received them; start the "
            "subscriber first and pass --wait-subscribers 1 (or --start-delay 2s)"
        )
    return line, warning


def warning_lines(rp: Replay) -> list[str]:
    """Say what was left unannotated, out of range, or found while merging.

    Args:
        rp: The replay, run to its end.

    Returns:
        One ``kvtool: warning: ...`` line each.
    """
    return [
        f"kvtool: warning: {line}" for line in rp.unlearned() + rp.out_of_range() + rp.findings()
    ]


def damage_lines(rp: Replay) -> list[str]:
    """Say what could not be read: incomplete recoveries, then undecodable payloads.

    Lost batches and unconfirmed tails are the recordings' ledgers' lines, which the
    command says before these (:func:`kvtool.commands.missing_batches`).

    Args:
        rp: The replay, run to its end.

    Returns:
        One ``kvtool: ...`` line each; any line means the input was damaged (exit 3).
    """
    out = [f"kvtool: {rep.summary()}" for rep in rp.recoveries if rep.damaged]
    st = rp.stats
    if st.decode_errors or st.skipped_events:
        first = st.first_errors[0] if st.first_errors else ""
        out.append(
            f"kvtool: {plural(st.decode_errors, 'payload')} and "
            f"{plural(st.skipped_events, 'event')} could not be decoded and were skipped "
            f"(first: {first}); every other batch was replayed"
        )
    return out
