"""Replay recordings: merge several by receive time, filter, annotate and iterate events.

The library behind ``kvtool replay``. :class:`Replay` opens one or more recordings,
merges their messages by ``log_time``, applies batch filters (channel, rank, time, seq)
and event filters (type, kind, window, group), annotates stores with the group
metadata (:mod:`kvtool.annotate`) and yields :class:`ReplayBatch` objects. Payloads are
decoded only when something needs the events, so a plain re-publish never decodes.
"""

from __future__ import annotations

import fnmatch
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kvtool.annotate import (
    LEARNED_SOURCE,
    NO_KIND_SOURCE,
    Annotation,
    Annotator,
    ChannelRule,
    Checker,
    GroupTable,
    event_rank,
    kind_label,
    resolve_groups,
)
from kvtool.durations import parse_duration_ns
from kvtool.errors import ProtocolError, UsageError
from kvtool.inputs import MergeFindings, merge_messages, resolve_annotation
from kvtool.protocol import BlockRemoved, BlockStored, Event, KVEventBatch, decode_batch
from kvtool.recording import RecordedMessage, RecordingReader, RecoveryReport, open_recording

UNANNOTATED = "unannotated"
"""Kind filter value for stores without a kind (distinct from vLLM's own ``unknown``)."""


# -- filters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EventFilter:
    """Which events to keep. A None field means "all".

    Attributes:
        types: Event type tags (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``).
        kinds: Store kinds; ``unannotated`` matches stores without a kind. Events other
            than stores never match a kind filter.
        windows: Sliding windows; None in the set matches stores without a window.
        groups: ``group_idx`` values; None in the set matches events without one.
    """

    types: frozenset[str] | None = None
    kinds: frozenset[str] | None = None
    windows: frozenset[int | None] | None = None
    groups: frozenset[int | None] | None = None

    @property
    def active(self) -> bool:
        """True when any field restricts the events."""
        return any(f is not None for f in (self.types, self.kinds, self.windows, self.groups))

    def match(self, ev: Event) -> bool:
        """Return True when the event passes every restriction.

        Args:
            ev: A decoded (possibly annotated) event.

        Returns:
            Whether to keep it.
        """
        if self.types is not None and type(ev).__struct_config__.tag not in self.types:
            return False
        if self.kinds is not None or self.windows is not None:
            if not isinstance(ev, BlockStored):
                return False
            if self.kinds is not None and kind_label(ev.kv_cache_spec_kind) not in self.kinds:
                return False
            if self.windows is not None and ev.kv_cache_spec_sliding_window not in self.windows:
                return False
        if self.groups is not None:
            g = ev.group_idx if isinstance(ev, BlockStored | BlockRemoved) else None
            if g not in self.groups:
                return False
        return True


@dataclass(frozen=True)
class TimeBound:
    """A ``--since``/``--until`` value: seconds from the start, or an absolute time.

    Attributes:
        offset_ns: Nanoseconds after the first message, when relative.
        absolute_ns: Nanoseconds since the epoch, when absolute.
    """

    offset_ns: int | None = None
    absolute_ns: int | None = None

    def resolve(self, start_ns: int) -> int:
        """Return the bound as ns since the epoch.

        Args:
            start_ns: ``log_time`` of the first message of the replay.

        Returns:
            The absolute bound.
        """
        if self.absolute_ns is not None:
            return self.absolute_ns
        return start_ns + (self.offset_ns or 0)


def parse_time_bound(text: str, *, option: str = "--since") -> TimeBound:
    """Parse ``--since``/``--until``: seconds from the start (``30``, ``1.5s``, ``2m``) or ISO.

    ISO times without a zone are taken as UTC.

    Args:
        text: The value as typed.
        option: The option name, for the error message.

    Returns:
        The bound.

    Raises:
        UsageError: Neither a duration nor an ISO 8601 time.
    """
    try:
        rel = text.strip().removeprefix("+")
        return TimeBound(offset_ns=parse_duration_ns(rel, option=option, allow_zero=True))
    except UsageError:
        pass
    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{option} {text!r}: expected seconds from the start (30, 1.5s, 2m) or an ISO "
            "time (2026-11-29T11:40:00Z)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    # Integer arithmetic: a float timestamp loses the sub-microsecond ns at this scale.
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return TimeBound(absolute_ns=us * 1_000)


def parse_seq_range(text: str) -> tuple[int | None, int | None]:
    """Parse ``--seq A:B`` (inclusive; either side may be left out) or a single ``N``.

    Args:
        text: The value as typed.

    Returns:
        ``(first, last)``, None for an open side.

    Raises:
        UsageError: Not ``A:B``, ``A:``, ``:B`` or ``N`` with non-negative integers.
    """
    a, sep, b = text.partition(":")
    try:
        first = int(a) if a.strip() else None
        last = (int(b) if b.strip() else None) if sep else first
    except ValueError:
        raise UsageError(
            f"--seq {text!r}: expected A:B (inclusive), A:, :B or N with integers"
        ) from None
    if (first is not None and first < 0) or (last is not None and last < 0):
        raise UsageError(f"--seq {text!r}: seq numbers are >= 0")
    if first is not None and last is not None and last < first:
        raise UsageError(f"--seq {text!r}: the range is empty ({last} < {first})")
    return first, last


def _optional_index(text: str, option: str, what: str) -> int | None:
    t = text.strip().lower()
    if t in ("none", "null", "-"):
        return None
    # ASCII only: str.isdigit() takes '²' (int() then fails) and '٣' (read as 3).
    if not (t.isascii() and t.isdigit()):
        raise UsageError(f"{option} {text!r}: expected {what} or 'none'")
    return int(t)


def parse_window(text: str) -> int | None:
    """Parse a ``--window`` value: an integer, or ``none`` for stores without a window.

    Args:
        text: The value.

    Returns:
        The window, or None.

    Raises:
        UsageError: Neither.
    """
    return _optional_index(text, "--window", "an integer window")


def parse_group(text: str) -> int | None:
    """Parse a ``--group`` filter value: an index, or ``none`` for events without one.

    Args:
        text: The value.

    Returns:
        The index, or None.

    Raises:
        UsageError: Neither.
    """
    return _optional_index(text, "--group", "a group index")


def parse_rank(text: str) -> int | None:
    """Parse a ``--rank`` value: a data-parallel rank, or ``none``.

    Args:
        text: The value.

    Returns:
        The rank, or None.

    Raises:
        UsageError: Neither.
    """
    return _optional_index(text, "--rank", "a data-parallel rank")


@dataclass(frozen=True)
class BatchFilter:
    """Which batches to keep. A None field means "all".

    Attributes:
        channels: Channel selectors: a channel name, an endpoint, a glob over the name,
            or a port number.
        ranks: Data-parallel ranks (None in the set: batches without a rank).
        since: Keep batches received at or after this.
        until: Keep batches received before or at this.
        seq_first: Lowest seq kept.
        seq_last: Highest seq kept.
    """

    channels: tuple[str, ...] | None = None
    ranks: frozenset[int | None] | None = None
    since: TimeBound | None = None
    until: TimeBound | None = None
    seq_first: int | None = None
    seq_last: int | None = None

    def channel_match(self, name: str, endpoint: str) -> bool:
        """Return True when a channel passes the channel selectors.

        Args:
            name: MCAP channel name.
            endpoint: Its ZeroMQ endpoint.

        Returns:
            Whether to keep the channel.
        """
        if self.channels is None:
            return True
        for sel in self.channels:
            if sel in (name, endpoint) or fnmatch.fnmatchcase(name, sel):
                return True
            if sel.isdigit() and endpoint.endswith(f":{sel}"):
                return True
        return False


# -- the replay ------------------------------------------------------------------------


@dataclass
class ReplayBatch:
    """One selected batch.

    Attributes:
        message: The recorded message (payload bytes as received).
        batch: The decoded (and, when annotating, annotated) batch; None when not decoded.
        events: The events that passed the event filters (annotated when annotating).
        dp_rank: The batch's rank (its own, else its channel's).
        error: Why the payload did not decode, or None.
        table: The annotation rule that applies to the batch (its channel and rank),
            when annotating or checking; :func:`kvtool.wire.annotate_payload` takes it.
    """

    message: RecordedMessage
    batch: KVEventBatch | None
    events: list[Event]
    dp_rank: int | None
    error: str | None = None
    table: ChannelRule | None = None


@dataclass
class ReplayStats:
    """Counts of one replay.

    Attributes:
        messages: Messages read.
        batches: Batches selected.
        events: Events selected.
        decode_errors: Payloads that did not decode.
        skipped_events: Events that could not be decoded (their neighbours were kept).
        first_errors: The first few decode problems, for messages.
    """

    messages: int = 0
    batches: int = 0
    events: int = 0
    decode_errors: int = 0
    skipped_events: int = 0
    first_errors: list[str] = field(default_factory=list)


class Replay:
    """Iterate the selected batches of one or more recordings, merged by receive time.

    Use as a context manager (it holds the files open). Iterate it once; afterwards
    :attr:`stats`, :attr:`recoveries`, :attr:`annotators` and :attr:`checker` hold the
    outcome.

    Args:
        paths: The recordings.
        event_filter: Event restrictions.
        batch_filter: Batch restrictions.
        annotate: Annotate stores with the group metadata.
        check: Compare stores with the group metadata (see :class:`kvtool.annotate.Checker`).
        groups_file: ``--groups FILE``.
        group_flags: ``--group-meta IDX=KIND[:WINDOW]`` flags.
        decode: Force decoding (e.g. to print events); otherwise payloads are decoded
            only when a filter, the annotation or the check needs them.

    Raises:
        RecordingError: A recording cannot be opened.
        MetadataError: The group metadata is invalid.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        event_filter: EventFilter | None = None,
        batch_filter: BatchFilter | None = None,
        annotate: bool = False,
        check: bool = False,
        groups_file: str | os.PathLike[str] | None = None,
        group_flags: Sequence[str] | None = None,
        decode: bool = False,
    ) -> None:
        if not paths:
            raise UsageError("give at least one recording")
        self.event_filter = event_filter or EventFilter()
        self.batch_filter = batch_filter or BatchFilter()
        self.annotate = annotate
        self.check = check
        self.stats = ReplayStats()
        self.decode = (
            decode
            or annotate
            or check
            or self.event_filter.active
            or self.batch_filter.ranks is not None
        )
        self.readers: list[RecordingReader] = []
        # A --groups file or --group flags are validated before anything is opened.
        given: GroupTable | None = None
        if (annotate or check) and (groups_file is not None or group_flags):
            given = resolve_groups(groups_file, group_flags, None)
        try:
            for p in paths:
                self.readers.append(open_recording(p))
            self._setup(given)
        except BaseException:
            self.close()
            raise

    def _setup(self, given: GroupTable | None) -> None:
        self.annotation: Annotation | None = None
        """THE annotation of the input (metadata by precedence, else learned from the
        whole input), when annotating or checking."""
        self.given: GroupTable | None = given
        """The table from ``--groups``/``--group`` flags, when given."""
        self.annotators: dict[tuple[str, str, int | None], Annotator] = {}
        self.merge_findings = MergeFindings()
        """What the same-batch rule found across inputs (see :mod:`kvtool.inputs`)."""
        if self.annotate or self.check:
            if given is not None and not given.partial:
                self.annotation = Annotation(given)
            else:
                # --group-meta flags: merged over each channel's recording metadata.
                self.annotation = resolve_annotation(readers=self.readers, given=given)
        self.checker: Checker | None = Checker() if self.check else None
        self.new_warnings: list[str] = []
        """Out-of-range warnings not yet shown (one per index); the caller drains it."""

    @property
    def tables(self) -> dict[str, GroupTable | None]:
        """Channel name → the metadata table that applies to it (None: learned)."""
        ann = self.annotation
        if ann is None:
            return {}
        return {c.name: ann.table_for(c.name) for r in self.readers for c in r.channels.values()}

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every recording."""
        for r in self.readers:
            r.close()

    # -- describing the source ------------------------------------------------------------

    def metadata_source(self) -> str:
        """Say which group metadata source is used (for the stderr status line).

        Returns:
            E.g. ``groups.json (6 groups: …)`` or ``learned from annotated stores …``.
        """
        ann = self.annotation
        if ann is None:
            return "none"
        if ann.given is not None and not ann.given.partial:
            return f"{ann.given.source} ({len(ann.given)} groups: {ann.given.describe()})"
        parts: list[str] = []
        learned = {ch for ch, _rank, _g in ann.learned}
        for name, t in self.tables.items():
            if t is not None:
                text = f"{t.source} ({len(t)} groups: {t.describe()})"
            else:  # "learned" only where a store gave a kind to learn (report's words)
                text = f"{name}: {LEARNED_SOURCE if name in learned else NO_KIND_SOURCE}"
            if text not in parts:
                parts.append(text)
        given = ann.given
        if given is not None and given.ungrouped is not None and not given.groups:
            parts.append(f"{given.source} ({given.describe()})")
        elif given is None or given.ungrouped is None:
            # A copy's stored none=KIND rule (issue 21), where no flag replaces it.
            for rule in ann.recorded_ungrouped.values():
                text = f"{rule.source}: {rule.describe()}"
                if text not in parts:
                    parts.append(text)
        return "; ".join(parts) if parts else "none (the input has no channel)"

    @property
    def recoveries(self) -> list[RecoveryReport]:
        """The recovery report of every recording (final after iterating)."""
        return [r.recovery for r in self.readers]

    @property
    def damaged(self) -> bool:
        """True when any recording was damaged or any payload or event did not decode."""
        return (
            any(rep.damaged for rep in self.recoveries)
            or self.stats.decode_errors > 0
            or self.stats.skipped_events > 0
        )

    # -- iteration ------------------------------------------------------------------------

    def messages(self) -> Iterator[RecordedMessage]:
        """Yield every message of every recording in THE merge order, each batch once.

        Yields:
            Recorded messages (see :func:`kvtool.inputs.merge_messages`).
        """
        for _i, m in merge_messages(
            [r.messages() for r in self.readers], findings=self.merge_findings
        ):
            yield m

    def _annotator(self, msg: RecordedMessage, rank: int | None) -> Annotator:
        ch = msg.channel
        key = (ch.path, ch.name, rank)
        ann = self.annotators.get(key)
        if ann is None:
            assert self.annotation is not None
            ann = self.annotators[key] = Annotator(self.annotation.rule(ch.name, rank))
        return ann

    def __iter__(self) -> Iterator[ReplayBatch]:
        bf = self.batch_filter
        ef = self.event_filter
        stats = self.stats
        start: int | None = None
        since = until = None
        channel_ok: dict[tuple[str, int], bool] = {}
        self.merge_findings = MergeFindings()
        for msg in self.messages():
            stats.messages += 1
            if start is None:
                start = msg.log_time
                since = bf.since.resolve(start) if bf.since is not None else None
                until = bf.until.resolve(start) if bf.until is not None else None
            if since is not None and msg.log_time < since:
                continue
            if until is not None and msg.log_time > until:
                continue
            if bf.seq_first is not None and msg.seq < bf.seq_first:
                continue
            if bf.seq_last is not None and msg.seq > bf.seq_last:
                continue
            ch = msg.channel
            key = (ch.path, ch.id)
            ok = channel_ok.get(key)
            if ok is None:
                ok = channel_ok[key] = bf.channel_match(ch.name, ch.endpoint)
            if not ok:
                continue
            rank = ch.dp_rank
            if not self.decode:
                if bf.ranks is not None and rank not in bf.ranks:
                    continue
                stats.batches += 1
                yield ReplayBatch(msg, None, [], rank)
                continue
            try:
                batch = decode_batch(msg.data, seq=msg.seq)
            except ProtocolError as err:
                stats.decode_errors += 1
                text = f"{ch.path}: {ch.name}: {err}"
                if len(stats.first_errors) < 5:
                    stats.first_errors.append(text)
                if bf.ranks is not None and rank not in bf.ranks:
                    continue
                if ef.active:
                    continue
                stats.batches += 1
                yield ReplayBatch(msg, None, [], rank, error=text)
                continue
            if batch.skipped:
                stats.skipped_events += len(batch.skipped)
                for s in batch.skipped:
                    if len(stats.first_errors) < 5:
                        stats.first_errors.append(f"{ch.path}: {ch.name}: {s}")
            rank = event_rank(ch.dp_rank, batch.data_parallel_rank)
            if bf.ranks is not None and rank not in bf.ranks:
                continue
            rule: ChannelRule | None = None
            if self.annotation is not None:
                ann = self._annotator(msg, rank)
                assert isinstance(ann.table, ChannelRule)
                rule = ann.table
                if self.checker is not None:
                    # Learned channels are checked for conflicts (the annotation's) and
                    # unannotated stores, not as if learned values were metadata.
                    self.checker.observe(ch.name, rank, batch.events, msg.seq, table=rule.table)
                if self.annotate:
                    batch, fresh = ann(batch)
                    if fresh:
                        self.new_warnings.extend(f"seq {msg.seq}: {w}" for w in fresh)
            events = [ev for ev in batch.events if ef.match(ev)] if ef.active else batch.events
            if ef.active and not events:
                continue
            stats.batches += 1
            stats.events += len(events)
            yield ReplayBatch(msg, batch, events, rank, table=rule)

    def disagreements(self) -> list[str]:
        """Return ``--check``'s lines: disagreements with metadata and conflicts.

        Returns:
            One line per disagreeing group (see :meth:`kvtool.annotate.Checker.disagreements`).
        """
        if self.checker is None:
            return []
        conflicts = self.annotation.conflicts if self.annotation is not None else ()
        return self.checker.disagreements(conflicts)

    def unlearned(self) -> list[str]:
        """Name the recordings whose stores had nothing to learn from (no annotated store).

        Quiet for a recording whose channels' events without ``group_idx`` are given a kind
        (``--group-meta none=KIND``, or a copy's stored rule): that is the kind they get.

        Returns:
            One line per such recording (empty unless annotating with learned metadata).
        """
        from kvtool.info import sglang_like
        from kvtool.report.findings import ungrouped_hint

        ann = self.annotation
        if ann is None or not self.annotate:
            return []
        learned_channels = {ch for ch, _rank, _g in ann.learned}
        out = []
        for r in self.readers:
            names = {c.name for c in r.channels.values() if ann.needs_learning(c.name)}
            if not names or names & learned_channels:
                continue
            if all(ann.ungrouped_for(n) is not None for n in names):
                continue
            if sglang_like(r.messages()):
                out.append(f"{r.path}: {ungrouped_hint(True)}; stores stay unannotated")
            else:
                out.append(
                    f"{r.path}: no store carries a kind to learn from and there is no group "
                    "metadata; stores stay unannotated (give --groups FILE or --group-meta "
                    "IDX=KIND[:WINDOW]; none=KIND[:WINDOW] for events without group_idx)"
                )
        return out

    def out_of_range(self) -> list[str]:
        """Return one line per group index that was not in the metadata, with its count.

        Returns:
            vLLM's warning per index plus how many stores it left unannotated.
        """
        total: Counter[int] = Counter()
        for ann in self.annotators.values():
            total.update(ann.out_of_range)
        return Annotator(GroupTable({}), total).summary()

    def findings(self) -> list[str]:
        """Return what every command says about the input as a whole.

        Returns:
            The same-batch findings and the annotation conflicts, one line each.
        """
        out = self.merge_findings.lines()
        # --check lists conflicts among its disagreements already.
        if self.annotation is not None and self.checker is None:
            out.extend(c.describe() for c in self.annotation.conflicts)
        return out


__all__ = [
    "UNANNOTATED",
    "BatchFilter",
    "EventFilter",
    "Replay",
    "ReplayBatch",
    "ReplayStats",
    "TimeBound",
    "parse_group",
    "parse_rank",
    "parse_seq_range",
    "parse_time_bound",
    "parse_window",
]
