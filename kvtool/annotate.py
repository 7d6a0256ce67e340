"""THE annotation core: vLLM's ``take_events`` rule and the resolved :class:`Annotation`.

Pure, no I/O. The metadata sources and spec→kind are :mod:`kvtool.groups` (only
:func:`~kvtool.groups.load_groups_file` reads a file), the learner is
:mod:`kvtool.learner`, and the learning pass over recordings is
:func:`kvtool.inputs.resolve_annotation`; their names are importable from here too.

The rule (``vllm/v1/core/kv_cache_manager.py`` ``take_events``): only ``BlockStored``
events are touched; a ``group_idx`` of None leaves the event alone; an index outside
the metadata table logs ``Group index `N` not in KV cache metadata`` and leaves the
event alone; otherwise both ``kv_cache_spec_kind`` and ``kv_cache_spec_sliding_window``
are set from the table (overwriting whatever was there; the window is None for kinds
without one). :class:`ChannelRule` is that rule for one (channel, rank); removes take
their group's (kind, window) from it too (:meth:`ChannelRule.group`).

Sources, by precedence: ``--groups FILE``, ``--group`` flags (not both), the
recording's per-channel then recording-wide metadata record, else what annotated
stores say, learned from the WHOLE input per (channel, data-parallel rank, group_idx)
by the one :class:`GroupLearner`. Learned values never overwrite a store's own kind; they
fill stores without one and label removes. Stores of one key that disagree are a
:class:`Conflict` (``replay --check`` lists it, ``report`` and ``replay`` say it); every
command resolves it the same way: the value most stores say, on a tie the one said first
in merge order. The resolved :class:`Annotation` is frozen and picklable.

Adapters, each a thin call into the rule: :func:`annotate`/:class:`Annotator` (decoded
structs, ``replay``), :func:`kvtool.wire.annotate_payload` (wire bytes),
:func:`kvtool.columns.annotate_table` (columns: ``report``, ``export``),
:class:`StatusKinds` (the recorder's live status counts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

# Kinds, group tables and the metadata sources live in kvtool.groups, the learner in
# kvtool.learner; their names stay importable from here.
from kvtool.groups import (
    KINDS,
    LITERAL_PREFIX,
    OWN_LABELS,
    SPEC_PARENTS,
    UNANNOTATED,
    UNATTRIBUTED,
    UNIFORM_SPEC,
    GroupInfo,
    GroupTable,
    KindWindow,
    LearnKey,
    _is_int,
    groups_from_list,
    kind_label,
    kind_of_label,
    load_groups_file,
    merge_over,
    out_of_range_warning,
    parse_group_flags,
    resolve_groups,
    spec_kind,
    spec_sliding_window,
    unknown_kind,
)
from kvtool.learner import (
    LEARNED_SOURCE,
    Conflict,
    GroupLearner,
    KindChange,
    StreamKey,
    _kw,
)
from kvtool.protocol import BlockStored, Event, KVEventBatch
from kvtool.text import plural

NO_KIND_SOURCE = "none (no store carries a kind)"
"""The metadata source when nothing gives a kind: no table, no flag, no store's own kind."""

# -- the rule --------------------------------------------------------------------------

Decision = KindWindow | int | None
"""What the rule does with one event: set this (kind, window); an ``int`` (the offending
index) when the index is not in the metadata (warn, leave untouched); None to leave the
event untouched without a warning."""


@dataclass(frozen=True)
class ChannelRule:
    """The rule for the events of one (recording, channel, rank): every adapter asks it.

    With a metadata table this is vLLM's ``take_events``: a store whose ``group_idx`` is
    in the table takes the table's kind and window (overwriting the wire's); None leaves
    it alone; an index outside the table is a warning and leaves it alone. Without one,
    the learned annotations apply: a store that carries its own kind keeps it (it is what
    the engine said), a store without one takes its group's learned (kind, window).

    Events without ``group_idx`` (stores and removes alike) follow :meth:`no_group`.

    Attributes:
        table: The metadata table, or None (learned).
        learned: group_idx → (kind, window) learned for this channel and rank.
        ungrouped: The ``--group-meta none=KIND`` flag's (kind, window), or None.
    """

    table: GroupTable | None = None
    learned: Mapping[int, KindWindow] = field(default_factory=dict)
    ungrouped: KindWindow | None = None

    def no_group(self) -> KindWindow | None:
        """Return the (kind, window) of events without ``group_idx`` (None: untouched).

        This is the one statement of the rule (:meth:`Annotation.ungrouped_for` asks it
        too): the ``--group-meta none=KIND`` flag wins over the table's own ungrouped kind,
        as :func:`merge_over` merges the flags over a recording's metadata.

        Returns:
            :attr:`ungrouped` (the flag), else the table's, else None.
        """
        if self.ungrouped is not None:
            return self.ungrouped
        return self.table.ungrouped if self.table is not None else None

    def store(self, group_idx: object, kind: object = None, window: object = None) -> Decision:
        """Decide what to do with one ``BlockStored``.

        Args:
            group_idx: Its ``group_idx`` (None when absent).
            kind: Its wire ``kv_cache_spec_kind``.
            window: Its wire ``kv_cache_spec_sliding_window``.

        Returns:
            The :data:`Decision`.
        """
        if group_idx is None:
            return self.no_group()
        if not _is_int(group_idx):
            return None
        assert isinstance(group_idx, int)
        if self.table is not None:
            info = self.table.groups.get(group_idx)
            if info is None:
                return group_idx
            return info.kind, info.sliding_window
        if kind is not None:
            return None
        return self.learned.get(group_idx)

    def group(self, group_idx: object) -> KindWindow | None:
        """Return the (kind, window) of a group, for events that carry none (removes).

        Args:
            group_idx: The group (None when absent).

        Returns:
            From the table, else learned, else None.
        """
        if group_idx is None:
            return self.no_group()
        if not _is_int(group_idx):
            return None
        assert isinstance(group_idx, int)
        if self.table is not None:
            info = self.table.groups.get(group_idx)
            return (info.kind, info.sliding_window) if info is not None else None
        return self.learned.get(group_idx)


def _as_rule(table: GroupTable | ChannelRule) -> ChannelRule:
    return table if isinstance(table, ChannelRule) else ChannelRule(table)


def annotation_for(
    event_type: str,
    group_idx: object,
    table: GroupTable | ChannelRule,
    kind: object = None,
    window: object = None,
) -> Decision:
    """Decide what ``take_events`` does with one event: the rule itself.

    Args:
        event_type: The event's type tag.
        group_idx: Its ``group_idx`` (None when absent).
        table: The metadata, or a :class:`ChannelRule`.
        kind: The event's wire kind (matters only for learned rules).
        window: The event's wire window.

    Returns:
        The :data:`Decision` (only ``BlockStored`` is ever touched).
    """
    if event_type != "BlockStored":
        return None
    return _as_rule(table).store(group_idx, kind, window)


def annotate_event(event: Event, table: GroupTable | ChannelRule) -> tuple[Event, int | None]:
    """Apply the rule to one decoded event.

    Args:
        event: The event.
        table: The metadata, or a :class:`ChannelRule`.

    Returns:
        ``(event, None)`` (the same or an annotated copy), or ``(event, N)`` when its
        group index N is not in the table.
    """
    if not isinstance(event, BlockStored):
        return event, None
    decision = _as_rule(table).store(
        event.group_idx, event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window
    )
    if decision is None:
        return event, None
    if isinstance(decision, int):
        return event, decision
    kind, window = decision
    if event.kv_cache_spec_kind == kind and event.kv_cache_spec_sliding_window == window:
        return event, None
    return (
        msgspec.structs.replace(
            event, kv_cache_spec_kind=kind, kv_cache_spec_sliding_window=window
        ),
        None,
    )


def _annotate_events(batch: KVEventBatch, rule: ChannelRule) -> tuple[KVEventBatch, list[int], int]:
    """The struct adapter: (batch, out-of-range indices met, stores the rule set)."""
    bad: list[int] = []
    set_ = 0
    events = batch.events
    new: list[Event] | None = None
    for i, ev in enumerate(events):
        if not isinstance(ev, BlockStored):
            continue
        out, idx = annotate_event(ev, rule)
        if idx is not None:
            bad.append(idx)
            continue
        set_ += 1
        if out is not ev:
            if new is None:
                new = list(events)
            new[i] = out
    if new is not None:
        batch = msgspec.structs.replace(batch, events=new)
    return batch, bad, set_


def annotate(
    batch: KVEventBatch, table: GroupTable | ChannelRule
) -> tuple[KVEventBatch, list[str]]:
    """Annotate a decoded batch exactly as vLLM's ``KVCacheManager.take_events`` does.

    Args:
        batch: The decoded batch.
        table: The metadata, or a :class:`ChannelRule` (e.g. learned).

    Returns:
        The batch (the same object when nothing changed) and one warning per store whose
        group index is not in the table (vLLM's wording).
    """
    out, bad, _ = _annotate_events(batch, _as_rule(table))
    return out, [out_of_range_warning(i) for i in bad]


@dataclass
class Annotator:
    """Stateful wrapper of :func:`annotate`: counts out-of-range indices, warns once each.

    Attributes:
        table: The metadata, or a :class:`ChannelRule`.
        out_of_range: Stores per group index not in the table.
        annotated: Stores the rule covered.
    """

    table: GroupTable | ChannelRule
    out_of_range: Counter[int] = field(default_factory=Counter)
    annotated: int = 0

    def __call__(self, batch: KVEventBatch) -> tuple[KVEventBatch, list[str]]:
        """Annotate one batch.

        Args:
            batch: The decoded batch.

        Returns:
            The annotated batch and the warnings not shown before (one per new index).
        """
        out, bad, n = _annotate_events(batch, _as_rule(self.table))
        self.annotated += n
        fresh = []
        for i in bad:
            if i not in self.out_of_range:
                fresh.append(out_of_range_warning(i))
            self.out_of_range[i] += 1
        return out, fresh

    def summary(self) -> list[str]:
        """Return one line per out-of-range index with its count.

        Returns:
            Lines like ``Group index `7` not in KV cache metadata (12 stores left unannotated)``.
        """
        return [
            f"{out_of_range_warning(i)} ({n} store{'s' if n != 1 else ''} left unannotated)"
            for i, n in sorted(self.out_of_range.items())
        ]


@dataclass(frozen=True)
class Annotation:
    """The resolved annotation of one input: small, frozen and picklable.

    Every command asks it, so every command gives an event the same kind and window.
    Sources, in precedence order: ``given`` (``--groups FILE``; ``--group-meta`` flags are
    partial: merged over each channel's recording metadata into ``tables``, see
    :func:`merge_over`, and alone for a channel without any), a recording's per-channel
    metadata record, its
    recording-wide metadata record (for a channel held by several inputs: the first
    input, in command-line order, that has one), else ``learned`` (from the whole input,
    :class:`GroupLearner`). A channel is its name (``endpoint`` or ``endpoint#topic``), the
    same in every file.

    Attributes:
        given: The ``--groups``/``--group`` table, or None.
        tables: Channel name → the recording metadata table that applies to it.
        learned: (channel, rank, group_idx) → (kind, window).
        conflicts: Keys whose annotated stores disagree (resolved as :class:`GroupLearner`
            says).
        recorded_ungrouped: Channel name → a recording's stored ``none=KIND`` rule
            (``kvtool.ungrouped``, issue 21): the kind of the channel's events without
            ``group_idx`` unless a ``--group-meta none=KIND`` flag gives another.
    """

    given: GroupTable | None = None
    tables: Mapping[str, GroupTable] = field(default_factory=dict)
    learned: Mapping[LearnKey, KindWindow] = field(default_factory=dict)
    conflicts: tuple[Conflict, ...] = ()
    recorded_ungrouped: Mapping[str, GroupTable] = field(default_factory=dict)

    def table_for(self, channel: str) -> GroupTable | None:
        """Return the metadata table that applies to a channel, or None (learned).

        Args:
            channel: The channel name.

        Returns:
            The table by precedence, or None.
        """
        if self.given is not None and not self.given.partial:
            return self.given
        table = self.tables.get(channel)
        if table is None and self.given is not None and self.given.groups:
            return self.given  # partial flags, a channel with no metadata of its own
        # Flags naming only ``none=KIND`` leave a channel's groups to be learned.
        return table

    def ungrouped_for(self, channel: str) -> KindWindow | None:
        """Return the (kind, window) of a channel's events without ``group_idx``.

        Args:
            channel: The channel name.

        Returns:
            What :meth:`ChannelRule.no_group` says for the channel's table and the
            ``--group-meta none=KIND`` flag, or None.
        """
        return ChannelRule(self.table_for(channel), ungrouped=self._ungrouped(channel)).no_group()

    def _ungrouped(self, channel: str) -> KindWindow | None:
        """The ``--group-meta none=KIND`` flag's rule, else the channel's stored one."""
        if self.given is not None and self.given.ungrouped is not None:
            return self.given.ungrouped
        rule = self.recorded_ungrouped.get(channel)
        return rule.ungrouped if rule is not None else None

    def rule(self, channel: str, dp_rank: int | None) -> ChannelRule:
        """Return the rule for the events of one (channel, rank).

        Args:
            channel: The channel name.
            dp_rank: The events' data-parallel rank (see :func:`event_rank`).

        Returns:
            The rule (metadata, else learned).
        """
        table = self.table_for(channel)
        ungrouped = self._ungrouped(channel)
        if table is not None:
            return ChannelRule(table, ungrouped=ungrouped)
        learned = {
            g: kw for (ch, r, g), kw in self.learned.items() if ch == channel and r == dp_rank
        }
        return ChannelRule(None, learned, ungrouped)

    def needs_learning(self, channel: str) -> bool:
        """Return True when no metadata covers a channel (its stores teach the learner).

        Args:
            channel: The channel name.

        Returns:
            Whether the channel is annotated from learned values.
        """
        return self.table_for(channel) is None

    def sources(self) -> list[str]:
        """Return the metadata sources in use, one per distinct source.

        Returns:
            Source names; ``learned from annotated stores …`` when kinds were learned,
            :data:`NO_KIND_SOURCE` when there is no metadata and no store carries a kind.
        """
        out: list[str] = []
        if self.given is not None and not self.given.partial:
            return [self.given.source]
        for t in self.tables.values():
            if t.source not in out:
                out.append(t.source)
        flags = self.given is not None and self.given.ungrouped is not None
        if not flags:
            for rule in self.recorded_ungrouped.values():
                text = f"{rule.source}: {rule.describe()}"
                if text not in out:
                    out.append(text)
        if self.given is not None and self.given.groups:
            return out or [self.given.source]
        if self.learned:
            out.append(LEARNED_SOURCE)
        elif not (out or flags):
            out.append(NO_KIND_SOURCE)  # nothing to learn from: never "learned"
        if self.given is not None and self.given.ungrouped is not None:
            out.append(f"{self.given.source} ({self.given.describe()})")
        return out


def event_rank(channel_rank: int | None, batch_rank: object) -> int | None:
    """Return the data-parallel rank of a batch's events: its channel's, else the batch's.

    The recorder knows which rank it subscribed to (vLLM offsets the port by the rank);
    a channel without a rank takes what the payload says.

    Args:
        channel_rank: The rank the recording's channel names.
        batch_rank: The rank the payload names (None when absent).

    Returns:
        The rank every adapter keys the annotation by.
    """
    if channel_rank is not None:
        return channel_rank
    return batch_rank if _is_int(batch_rank) else None  # type: ignore[return-value]


@dataclass
class StatusKinds:
    """The recorder's live adapter: kind labels for status counts, one event at a time.

    A live recorder cannot learn from the whole input; it applies the same rule with the
    metadata it was given and, without it, what annotated stores of a (channel, group)
    said so far. Labels: the rule's kind, else ``unannotated`` (stores) /
    ``unattributed`` (removes).

    Attributes:
        table: The metadata the recorder was given, or None.
        learner: What annotated stores said so far.
    """

    table: GroupTable | None = None
    learner: GroupLearner = field(default_factory=GroupLearner)
    _rules: dict[str, ChannelRule] = field(default_factory=dict)

    def store(self, channel: str, group_idx: int | None, kind: str | None, count: int = 1) -> str:
        """Return the kind label of ``count`` stores (and learn from them).

        Args:
            channel: The channel (any stable name).
            group_idx: Their group.
            kind: Their wire kind.
            count: How many.

        Returns:
            The label.
        """
        if kind is not None and group_idx is not None and self.table is None:
            key = (channel, None, group_idx)
            if (kind, None) not in self.learner.said.get(key, {}):
                self._rules.pop(channel, None)  # a new value: resolve again
            self.learner.observe_store(channel, None, group_idx, kind, None, count=count)
        rule = self._rule(channel)
        d = rule.store(group_idx, kind)
        if isinstance(d, tuple):
            return kind_label(d[0])
        return kind_label(kind)

    def remove(self, channel: str, group_idx: int | None) -> str:
        """Return the kind label of a remove.

        Args:
            channel: The channel.
            group_idx: Its group.

        Returns:
            The label.
        """
        g = self._rule(channel).group(group_idx)
        return kind_label(g[0]) if g is not None else UNATTRIBUTED

    def _rule(self, channel: str) -> ChannelRule:
        rule = self._rules.get(channel)
        if rule is None:
            if self.table is not None:
                rule = ChannelRule(self.table)
            else:
                learned = {
                    g: kw for (ch, _r, g), kw in self.learner.resolved().items() if ch == channel
                }
                rule = ChannelRule(None, learned)
            self._rules[channel] = rule
        return rule


# -- checking ------------------------------------------------------------------------------


@dataclass
class _GroupIssues:
    mismatched: Counter[tuple[str | None, int | None]] = field(default_factory=Counter)
    expected: set[tuple[str, int | None]] = field(default_factory=set)
    unannotated: int = 0
    out_of_range: int = 0
    first_seq: int | None = None


_LEARNED = object()


@dataclass
class Checker:
    """Compares what a recording's stores say with a metadata table (``replay --check``).

    Feed every batch with :meth:`observe`; :meth:`disagreements` then gives one line per
    group that disagrees: stores whose kind/window differ from the table, stores left
    unannotated, indices not in the table, and (without a table) keys whose annotated
    stores conflict, with how every command resolves them (:class:`Conflict`).

    Without a table there is nothing to compare a store with but the other stores of its
    (channel, rank, group): their conflicts are disagreements; a store without a kind is
    :attr:`unchecked`, never a disagreement (issue 24: the legacy capture, with no kind on
    the wire and no metadata, "disagreed" in all 6 groups with what was learned from it).

    Attributes:
        table: The metadata to compare with; None compares each (channel, rank) with
            what its own annotated stores say (learned).
        learner: Learns kinds per (channel, rank, group) for the learned comparison.
        stores: Stores seen.
        stores_without_group: Stores without ``group_idx`` (nothing to compare).
        against_metadata: Stores compared with a metadata table.
        against_each_other: Stores with a kind and no table: compared with the other
            stores of their (channel, rank, group).
        unchecked: Stores with neither a table nor a kind: nothing to compare them with.
    """

    table: GroupTable | None = None
    learner: GroupLearner = field(default_factory=GroupLearner)
    stores: int = 0
    stores_without_group: int = 0
    against_metadata: int = 0
    against_each_other: int = 0
    unchecked: int = 0
    _issues: dict[int, _GroupIssues] = field(default_factory=dict)

    def _issue(self, idx: int) -> _GroupIssues:
        got = self._issues.get(idx)
        if got is None:
            got = self._issues[idx] = _GroupIssues()
        return got

    def observe(
        self,
        channel: str,
        dp_rank: int | None,
        events: Sequence[Event],
        seq: int | None = None,
        table: GroupTable | object | None = _LEARNED,
    ) -> None:
        """Check one batch's stores.

        Args:
            channel: The channel name.
            dp_rank: The data-parallel rank.
            events: The decoded events as recorded.
            seq: The batch seq.
            table: The table for this batch (e.g. its own recording's metadata);
                defaults to :attr:`table`. None compares with what is learned.
        """
        tab = self.table if table is _LEARNED else table
        assert tab is None or isinstance(tab, GroupTable)
        if tab is None:
            self.learner.observe(channel, dp_rank, events, seq)
        for ev in events:
            if not isinstance(ev, BlockStored):
                continue
            self.stores += 1
            idx = ev.group_idx
            if idx is None:
                self.stores_without_group += 1
                continue
            kind, window = ev.kv_cache_spec_kind, ev.kv_cache_spec_sliding_window
            if tab is None:
                # No metadata: conflicts among the stores come from the learner; a store
                # without a kind has nothing to be compared with.
                if kind is not None:
                    self.against_each_other += 1
                else:
                    self.unchecked += 1
                continue
            self.against_metadata += 1
            info = tab.lookup(idx)
            if info is None:
                iss = self._issue(idx)
                iss.out_of_range += 1
            elif kind is None:
                iss = self._issue(idx)
                iss.unannotated += 1
            elif kind != info.kind or window != info.sliding_window:
                iss = self._issue(idx)
                iss.mismatched[(kind, window)] += 1
                iss.expected.add((info.kind, info.sliding_window))
            else:
                continue
            if iss.first_seq is None:
                iss.first_seq = seq

    def disagreements(self, conflicts: Sequence[Conflict] | None = None) -> list[str]:
        """Return one line per disagreeing group, each starting ``group N:``.

        Args:
            conflicts: The input's conflicts (e.g. :attr:`Annotation.conflicts`); default:
                those of what this checker learned.

        Returns:
            The lines, ordered by group index (empty when everything agrees).
        """
        found = list(conflicts) if conflicts is not None else self.learner.conflicts()
        by_group: dict[int, list[Conflict]] = {}
        for c in found:
            by_group.setdefault(c.key[2], []).append(c)
        lines = []
        for idx in sorted(set(self._issues) | set(by_group)):
            iss = self._issues.get(idx, _GroupIssues())
            parts: list[str] = []
            if iss.mismatched:
                said = ", ".join(
                    f"{plural(n, 'store')} {'says' if n == 1 else 'say'} {_kw(k, w)}"
                    for (k, w), n in iss.mismatched.most_common()
                )
                expect = " or ".join(sorted(_kw(k, w) for k, w in iss.expected))
                parts.append(f"metadata says {expect}, but {said}")
            if iss.unannotated:
                parts.append(f"{plural(iss.unannotated, 'store')} left unannotated")
            if iss.out_of_range:
                parts.append(
                    f"{plural(iss.out_of_range, 'store')} "
                    f"{'carries' if iss.out_of_range == 1 else 'carry'} group_idx {idx}, which is "
                    "not in the metadata"
                )
            bad = iss.mismatched or iss.unannotated or iss.out_of_range
            if iss.first_seq is not None and bad:
                parts.append(f"first at seq {iss.first_seq}")
            parts.extend(c.detail() for c in by_group.get(idx, []))
            lines.append(f"group {idx}: " + "; ".join(parts))
        return lines


__all__ = [
    "KINDS",
    "LEARNED_SOURCE",
    "LITERAL_PREFIX",
    "NO_KIND_SOURCE",
    "OWN_LABELS",
    "SPEC_PARENTS",
    "UNANNOTATED",
    "UNATTRIBUTED",
    "UNIFORM_SPEC",
    "Annotation",
    "Annotator",
    "ChannelRule",
    "Checker",
    "Conflict",
    "Decision",
    "GroupInfo",
    "GroupLearner",
    "GroupTable",
    "KindChange",
    "KindWindow",
    "LearnKey",
    "StatusKinds",
    "StreamKey",
    "annotate",
    "annotate_event",
    "annotation_for",
    "event_rank",
    "groups_from_list",
    "kind_label",
    "kind_of_label",
    "load_groups_file",
    "merge_over",
    "out_of_range_warning",
    "parse_group_flags",
    "resolve_groups",
    "spec_kind",
    "spec_sliding_window",
    "unknown_kind",
]
