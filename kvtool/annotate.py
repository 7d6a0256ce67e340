"""THE annotation core: vLLM's ``take_events`` rule, metadata sources, spec→kind, the learner.

Pure, no I/O except :func:`load_groups_file` reading the one file it is given (the
learning pass over recordings is :func:`kvtool.inputs.resolve_annotation`).

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
structs, ``replay``), :func:`kvtool.publish.annotate_payload` (wire bytes),
:func:`kvtool.columns.annotate_table` (columns: ``report``, ``export``),
:class:`StatusKinds` (the recorder's live status counts).

Spec descriptions are turned into kind and window as ``get_kv_cache_spec_kind`` and
``get_kv_cache_spec_sliding_window`` in ``vllm/v1/kv_cache_interface.py`` do.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from kvtool.errors import MetadataError
from kvtool.poolsize import read_groups_json
from kvtool.protocol import BlockStored, Event, KVEventBatch

if TYPE_CHECKING:
    import polars as pl

KINDS = (
    "full_attention",
    "mla_attention",
    "sliding_window",
    "sliding_window_mla",
    "mamba",
    "chunked_local_attention",
    "sink_full_attention",
    "encoder_only_attention",
    "cross_attention",
    "unknown",
)
"""vLLM's ``KVCacheSpecKind`` values (0.33). Any other string is accepted as a kind too."""

UNANNOTATED = "unannotated"
"""kvtool's label for stores without a kind."""
UNATTRIBUTED = "unattributed"
"""kvtool's label for removes no store explains."""
OWN_LABELS = (UNANNOTATED, UNATTRIBUTED)
LITERAL_PREFIX = "kind:"
"""Shown before a kind from the wire or metadata spelled like one of :data:`OWN_LABELS`."""


def kind_label(kind: str | None) -> str:
    """Return how a kind is shown, filtered on and exported: never one of kvtool's labels.

    ``None`` (no kind) is ``unannotated``. A kind that a publisher or a metadata file
    spells ``unannotated`` or ``unattributed`` is shown as ``kind:unannotated``, so it
    never merges with kvtool's own label (issue 24); a kind already starting with
    ``kind:`` (and the empty kind) gets the prefix too, so two different kinds never show
    alike.

    Args:
        kind: The kind as sent or given, or None.

    Returns:
        The label.
    """
    if kind is None:
        return UNANNOTATED
    if not kind or kind in OWN_LABELS or kind.startswith(LITERAL_PREFIX):
        return LITERAL_PREFIX + kind  # an empty kind is "kind:", visibly
    return kind


def kind_of_label(label: str) -> str | None:
    """Return the kind a :func:`kind_label` label stands for (None for ``unannotated``).

    Args:
        label: A label :func:`kind_label` returned.

    Returns:
        The kind as sent or given, or None.
    """
    if label == UNANNOTATED:
        return None
    return label.removeprefix(LITERAL_PREFIX) if label.startswith(LITERAL_PREFIX) else label


UNIFORM_SPEC = "UniformTypeKVCacheSpecs"

# Class hierarchy of vLLM's KV cache specs (kv_cache_interface.py): class -> base class.
SPEC_PARENTS: dict[str, str | None] = {
    "KVCacheSpec": None,
    "AttentionSpec": "KVCacheSpec",
    "FullAttentionSpec": "AttentionSpec",
    "MLAAttentionSpec": "FullAttentionSpec",
    "HiddenStateCacheSpec": "MLAAttentionSpec",
    "RSWASpec": "FullAttentionSpec",
    "TQFullAttentionSpec": "FullAttentionSpec",
    "SinkFullAttentionSpec": "FullAttentionSpec",
    "ChunkedLocalAttentionSpec": "AttentionSpec",
    "SlidingWindowSpec": "AttentionSpec",
    "SlidingWindowMLASpec": "SlidingWindowSpec",
    "CircularBufferSpec": "AttentionSpec",
    "MambaSpec": "KVCacheSpec",
    "EncoderOnlyAttentionSpec": "AttentionSpec",
    "CrossAttentionSpec": "AttentionSpec",
    UNIFORM_SPEC: "KVCacheSpec",
}

# get_kv_cache_spec_kind: subclass checks before base classes.
_KIND_ORDER: tuple[tuple[str, str], ...] = (
    ("SlidingWindowMLASpec", "sliding_window_mla"),
    ("MLAAttentionSpec", "mla_attention"),
    ("SinkFullAttentionSpec", "sink_full_attention"),
    ("FullAttentionSpec", "full_attention"),
    ("ChunkedLocalAttentionSpec", "chunked_local_attention"),
    ("SlidingWindowSpec", "sliding_window"),
    ("MambaSpec", "mamba"),
    ("EncoderOnlyAttentionSpec", "encoder_only_attention"),
    ("CrossAttentionSpec", "cross_attention"),
)

# KVCacheSpecRegistry (register_all_kvcache_specs): class -> uniform_type_base_spec.
# Classes not listed inherit the entry of their nearest registered ancestor.
_UNIFORM_BASE: dict[str, str] = {
    "FullAttentionSpec": "FullAttentionSpec",
    "MLAAttentionSpec": "FullAttentionSpec",
    "TQFullAttentionSpec": "FullAttentionSpec",
    "RSWASpec": "FullAttentionSpec",
    "HiddenStateCacheSpec": "FullAttentionSpec",
    "SinkFullAttentionSpec": "FullAttentionSpec",
    "SlidingWindowSpec": "SlidingWindowSpec",
    "SlidingWindowMLASpec": "SlidingWindowMLASpec",
    "MambaSpec": "MambaSpec",
    "ChunkedLocalAttentionSpec": "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec": "CrossAttentionSpec",
    "CircularBufferSpec": "CircularBufferSpec",
}


def out_of_range_warning(group_idx: int) -> str:
    """Return vLLM's warning for a store whose group index is not in the table.

    Args:
        group_idx: The offending index.

    Returns:
        ``Group index `N` not in KV cache metadata``.
    """
    return f"Group index `{group_idx}` not in KV cache metadata"


@dataclass(frozen=True)
class GroupInfo:
    """One KV cache group, as ``get_kv_cache_group_metadata()`` describes it.

    Attributes:
        group_idx: The group's index.
        kind: Its ``KVCacheSpecKind`` value (any string).
        block_size: Tokens per block, when known.
        sliding_window: The window in tokens, or None for kinds without one.
    """

    group_idx: int
    kind: str
    block_size: int | None = None
    sliding_window: int | None = None

    def to_metadata(self) -> dict[str, object]:
        """Return the ``get_kv_cache_group_metadata()`` entry for this group.

        Returns:
            ``{"group_idx", "kind", "block_size", "sliding_window"}``.
        """
        return {
            "group_idx": self.group_idx,
            "kind": self.kind,
            "block_size": self.block_size,
            "sliding_window": self.sliding_window,
        }


@dataclass
class GroupTable:
    """The KV cache group metadata used to annotate: ``group_idx`` → :class:`GroupInfo`.

    Attributes:
        groups: The groups by index.
        source: Where the table came from, for messages (a file, ``--group flags`` …).
        partial: The table names only some groups (``--group-meta`` flags): it is merged
            over a recording's own metadata (:func:`merge_over`) instead of replacing it.
        ungrouped: The (kind, window) of events without ``group_idx`` (``--group-meta
            none=KIND``: SGLang, vLLM before 0.21), or None: they stay unannotated.
    """

    groups: dict[int, GroupInfo]
    source: str = ""
    partial: bool = False
    ungrouped: KindWindow | None = None

    def lookup(self, group_idx: int) -> GroupInfo | None:
        """Return the group with this index, or None when the table has none.

        Args:
            group_idx: The index a ``BlockStored`` carries.

        Returns:
            The group, or None (out of range).
        """
        return self.groups.get(group_idx)

    def __len__(self) -> int:
        return len(self.groups)

    def to_metadata(self) -> list[dict[str, object]]:
        """Return the table as ``get_kv_cache_group_metadata()`` returns it (by index).

        Returns:
            One dict per group, ordered by ``group_idx``.
        """
        return [self.groups[i].to_metadata() for i in sorted(self.groups)]

    def to_frame(self) -> pl.DataFrame:
        """Return the table as a polars DataFrame, for joins in vectorised code.

        Returns:
            Columns ``group_idx`` (Int64), ``kind`` (Utf8), ``sliding_window`` (Int64),
            one row per group ordered by ``group_idx``.
        """
        import polars as pl

        rows = [self.groups[i] for i in sorted(self.groups)]
        return pl.DataFrame(
            {
                "group_idx": [g.group_idx for g in rows],
                "kind": [g.kind for g in rows],
                "sliding_window": [g.sliding_window for g in rows],
            },
            schema={"group_idx": pl.Int64, "kind": pl.Utf8, "sliding_window": pl.Int64},
        )

    def describe(self) -> str:
        """Return a short one-line description: ``0=full_attention 1=sliding_window:64``.

        Returns:
            The groups in ``--group`` flag syntax.
        """
        parts = []
        for i in sorted(self.groups):
            g = self.groups[i]
            w = f":{g.sliding_window}" if g.sliding_window is not None else ""
            parts.append(f"{i}={g.kind}{w}")
        if self.ungrouped is not None:
            kind, window = self.ungrouped
            parts.append(f"none={kind}" + (f":{window}" if window is not None else ""))
        return " ".join(parts)


# -- spec descriptions -----------------------------------------------------------------


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_i64(v: object) -> bool:
    return _is_int(v) and -(2**63) <= v < 2**63  # type: ignore[operator]


def _spec_class(spec: Mapping[str, object], where: str) -> str:
    name = spec.get("spec", spec.get("type"))
    if not isinstance(name, str):
        raise MetadataError(
            f'{where}: a spec description needs "spec": a vLLM KV cache spec class name '
            f"(one of {', '.join(SPEC_PARENTS)})"
        )
    if name not in SPEC_PARENTS:
        raise MetadataError(
            f"{where}: unknown spec class {name!r} (known: {', '.join(SPEC_PARENTS)})"
        )
    return name


def _mro(name: str) -> list[str]:
    out: list[str] = []
    cur: str | None = name
    while cur is not None:
        out.append(cur)
        cur = SPEC_PARENTS[cur]
    return out


def _isinstance(name: str, base: str) -> bool:
    return base in _mro(name)


def _inner_specs(spec: Mapping[str, object], where: str) -> list[Mapping[str, object]]:
    inner = spec.get("specs", spec.get("kv_cache_specs"))
    if isinstance(inner, Mapping):
        inner = list(inner.values())
    if not isinstance(inner, list) or not inner:
        raise MetadataError(
            f'{where}: {UNIFORM_SPEC} needs "specs": a non-empty list (or layer→spec map) '
            "of spec descriptions"
        )
    out: list[Mapping[str, object]] = []
    for j, s in enumerate(inner):
        if not isinstance(s, Mapping):
            raise MetadataError(f"{where}: inner spec {j} is not an object")
        out.append(s)
    return out


def _uniform_base(name: str) -> str | None:
    for cls in _mro(name):
        if cls in _UNIFORM_BASE:
            return _UNIFORM_BASE[cls]
    return None


def spec_kind(spec: Mapping[str, object], *, where: str = "spec") -> str:
    """Return the ``KVCacheSpecKind`` vLLM's ``get_kv_cache_spec_kind`` gives a spec.

    Subclasses are checked before their base classes. A ``UniformTypeKVCacheSpecs``
    wrapper gives its single inner kind; with several inner kinds, ``full_attention``
    when every inner spec registers the full-attention base spec, else ``unknown``.

    Args:
        spec: A spec description, e.g. ``{"spec": "SlidingWindowSpec", "sliding_window": 64}``.
        where: Names the description in error messages.

    Returns:
        The kind string.

    Raises:
        MetadataError: The description names no known spec class.
    """
    name = _spec_class(spec, where)
    if name == UNIFORM_SPEC:
        inner = _inner_specs(spec, where)
        kinds = {spec_kind(s, where=f"{where}, inner spec {j}") for j, s in enumerate(inner)}
        if len(kinds) == 1:
            return next(iter(kinds))
        bases = {_uniform_base(_spec_class(s, where)) for s in inner}
        if bases == {"FullAttentionSpec"}:
            return "full_attention"
        return "unknown"
    for cls, kind in _KIND_ORDER:
        if _isinstance(name, cls):
            return kind
    return "unknown"


def spec_sliding_window(spec: Mapping[str, object], *, where: str = "spec") -> int | None:
    """Return the window vLLM's ``get_kv_cache_spec_sliding_window`` gives a spec.

    Only sliding-window specs (incl. sliding-window MLA) have one; a uniform wrapper has
    one only when all inner windows agree; chunked local attention has none.

    Args:
        spec: A spec description.
        where: Names the description in error messages.

    Returns:
        The window in tokens, or None.

    Raises:
        MetadataError: Unknown spec class, or a sliding-window spec without an integer
            ``sliding_window``.
    """
    name = _spec_class(spec, where)
    if name == UNIFORM_SPEC:
        inner = _inner_specs(spec, where)
        windows = {
            spec_sliding_window(s, where=f"{where}, inner spec {j}") for j, s in enumerate(inner)
        }
        return next(iter(windows)) if len(windows) == 1 else None
    if _isinstance(name, "SlidingWindowSpec"):
        w = spec.get("sliding_window")
        if not _is_int(w) or w <= 0 or not _is_i64(w):  # type: ignore[operator]
            raise MetadataError(
                f'{where}: {name} needs "sliding_window": a positive integer (tokens, int64)'
            )
        assert isinstance(w, int)
        return w
    return None


def _spec_block_size(spec: Mapping[str, object], where: str) -> int | None:
    bs = spec.get("block_size")
    if bs is None and _spec_class(spec, where) == UNIFORM_SPEC:
        sizes = {_spec_block_size(s, where) for s in _inner_specs(spec, where)}
        return next(iter(sizes)) if len(sizes) == 1 else None
    if bs is not None and not (_is_int(bs) and _is_i64(bs)):
        raise MetadataError(f'{where}: "block_size" must be an integer, got {bs!r}')
    return bs  # type: ignore[return-value]


# -- groups files, flags, recording metadata --------------------------------------------


def groups_from_list(entries: object, *, source: str) -> GroupTable:
    """Build a table from a ``get_kv_cache_group_metadata()`` list or spec descriptions.

    Each entry is either a metadata entry (``group_idx``, ``kind``, optional
    ``block_size`` and ``sliding_window``) or a spec description (``spec`` plus the
    spec's fields); a spec description without ``group_idx`` describes the group at its
    position in the list. Indices must be unique and cover 0..N-1, as vLLM's table does.

    Args:
        entries: The decoded JSON (a list, or an object with a ``groups`` list).
        source: Names the origin in the table and in error messages (e.g. the file).

    Returns:
        The table.

    Raises:
        MetadataError: Wrong shape, unknown spec class, bad field type, duplicate or
            missing ``group_idx``.
    """
    if isinstance(entries, Mapping) and "groups" in entries:
        entries = entries["groups"]
    if not isinstance(entries, list):
        raise MetadataError(
            f'{source}: expected a JSON list of groups ({{"group_idx", "kind", '
            f'"block_size", "sliding_window"}} or spec descriptions), '
            f"got {type(entries).__name__}"
        )
    if not entries:
        raise MetadataError(f"{source}: the list of groups is empty")
    groups: dict[int, GroupInfo] = {}
    for pos, entry in enumerate(entries):
        where = f"{source}: entry {pos}"
        if not isinstance(entry, Mapping):
            raise MetadataError(f"{where}: expected an object, got {type(entry).__name__}")
        idx = entry.get("group_idx")
        if "spec" in entry or ("type" in entry and "kind" not in entry):
            if idx is None:
                idx = pos
            kind = spec_kind(entry, where=where)
            window = spec_sliding_window(entry, where=where)
            block_size = _spec_block_size(entry, where)
        else:
            if idx is None:
                raise MetadataError(
                    f'{where}: missing "group_idx" (a metadata entry needs group_idx and '
                    'kind; a spec description needs "spec")'
                )
            kind_v = entry.get("kind")
            if not isinstance(kind_v, str) or not kind_v:
                raise MetadataError(f'{where}: "kind" must be a non-empty string, got {kind_v!r}')
            kind = kind_v
            window_v = entry.get("sliding_window")
            if window_v is not None and not (_is_int(window_v) and _is_i64(window_v)):
                # int64, as every event's window is read (issue 24: a larger one crashed)
                raise MetadataError(
                    f'{where}: "sliding_window" must be an integer (int64) or null, '
                    f"got {window_v!r}"
                )
            window = window_v if isinstance(window_v, int) else None
            bs_v = entry.get("block_size")
            if bs_v is not None and not (_is_int(bs_v) and _is_i64(bs_v)):
                raise MetadataError(
                    f'{where}: "block_size" must be an integer or null, got {bs_v!r}'
                )
            block_size = bs_v if isinstance(bs_v, int) else None
        if not _is_int(idx) or idx < 0:
            raise MetadataError(f'{where}: "group_idx" must be an integer >= 0, got {idx!r}')
        assert isinstance(idx, int)
        if idx in groups:
            raise MetadataError(f"{where}: duplicate group_idx {idx}")
        groups[idx] = GroupInfo(idx, kind, block_size, window)
    missing = [i for i in range(len(groups)) if i not in groups]
    if missing:
        raise MetadataError(
            f"{source}: group_idx {missing[0]} is missing (indices must run 0..{len(groups) - 1}"
            " without gaps, as vLLM numbers its groups)"
        )
    return GroupTable(groups, source)


def load_groups_file(path: str | os.PathLike[str]) -> GroupTable:
    """Read a groups file: ``get_kv_cache_group_metadata()``'s list or spec descriptions.

    The file is validated completely before use.

    Args:
        path: The JSON file.

    Returns:
        The table, with the file name as its source.

    Raises:
        MetadataError: The file cannot be read, is not JSON, or is not a valid table.
    """
    name = os.fspath(path)
    return groups_from_list(read_groups_json(name), source=name)


def _ascii_int(text: str) -> bool:
    t = text.strip()
    return t.isascii() and t.isdigit()


def unknown_kind(option: str, kind: str, known: Iterable[str], *, extra: str = "") -> str:
    """The one message for a kind typed on the command line that names no known kind.

    ``--kind`` and ``--group-meta`` both say it: the kind, vLLM's kinds, and the closest
    names (``ful_attention``: did you mean full_attention?).

    Args:
        option: The option and its value, e.g. ``--group-meta '0=ful_attention'``.
        kind: The kind.
        known: Every name that would have been accepted (for the closest match).
        extra: More to say inside the parentheses (e.g. kvtool's own labels).

    Returns:
        One line.
    """
    import difflib

    from kvtool.text import printable

    close = difflib.get_close_matches(kind, sorted(set(known)), n=2, cutoff=0.5)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return printable(f"{option}: not a KV cache kind (vLLM's: {', '.join(KINDS)}{extra}){hint}")


def parse_group_flags(flags: Sequence[str]) -> GroupTable:
    """Parse ``--group-meta IDX=KIND[:WINDOW]`` flags into a (partial) table.

    A kind must be one of vLLM's :data:`KINDS`, as ``--kind`` checks it (a typo such as
    ``ful_attention`` made a row of its own); a kind vLLM adds later can be given in a
    ``--groups`` file, which comes from the engine rather than from typing.
    ``none=KIND[:WINDOW]`` gives the kind of the events without ``group_idx`` (an
    ungrouped stream: SGLang, vLLM before 0.21; issue 21), :attr:`GroupTable.ungrouped`.

    Args:
        flags: E.g. ``["0=full_attention", "1=sliding_window:1024"]``, ``["none=full_attention"]``.

    Returns:
        The table, ``partial``: merged over a recording's own metadata where there is
        some (:func:`merge_over`); alone, indices it leaves out count as out of range.

    Raises:
        MetadataError: A flag that does not parse, an unknown kind, or an index given twice.
    """
    groups: dict[int, GroupInfo] = {}
    ungrouped: KindWindow | None = None
    for flag in flags:
        idx_s, sep, rest = flag.partition("=")
        kind, _, win_s = rest.partition(":")
        hint = (
            "expected IDX=KIND[:WINDOW], e.g. 1=sliding_window:1024, or none=KIND for "
            "events without group_idx"
        )
        # 'none': the events without group_idx (SGLang, vLLM before 0.21; issue 21).
        is_none = idx_s.strip().lower() == "none"
        # ASCII digits only: str.isdigit() takes '²' (int() then fails) and '٣'.
        if not sep or not (is_none or _ascii_int(idx_s)) or not kind.strip():
            raise MetadataError(f"--group-meta {flag!r}: {hint}")
        idx = -1 if is_none else int(idx_s)
        if not is_none and not _is_i64(idx):  # every event's group_idx is int64 (issue 24)
            raise MetadataError(f"--group-meta {flag!r}: group {idx_s} is past int64; {hint}")
        window: int | None = None
        win_s = win_s.strip()
        if win_s and win_s.lower() not in ("none", "null"):
            if not _ascii_int(win_s):
                raise MetadataError(
                    f"--group-meta {flag!r}: window {win_s!r} is not a non-negative integer; {hint}"
                )
            window = int(win_s)
            if not _is_i64(window):
                raise MetadataError(
                    f"--group-meta {flag!r}: window {win_s!r} is past int64; {hint}"
                )
        if (is_none and ungrouped is not None) or (not is_none and idx in groups):
            what = "none" if is_none else str(idx)
            raise MetadataError(f"--group-meta {flag!r}: group {what} is given twice")
        if kind.strip() not in KINDS:
            raise MetadataError(
                unknown_kind(
                    f"--group-meta {flag!r}",
                    kind.strip(),
                    KINDS,
                    extra="; a kind kvtool does not know yet: give it in a --groups FILE",
                )
            )
        if is_none:
            ungrouped = (kind.strip(), window)
        else:
            groups[idx] = GroupInfo(idx, kind.strip(), None, window)
    return GroupTable(groups, "--group-meta flags", partial=True, ungrouped=ungrouped)


def merge_over(flags: GroupTable, base: GroupTable | None) -> GroupTable:
    """Merge a partial table (``--group-meta`` flags) over a recording's own metadata.

    The flags' groups replace the recording's groups of the same index; every other group
    keeps the recording's kind and window (issue 24: a partial ``--group-meta`` replaced
    the whole table, and the groups it left out were reported "left unannotated").

    Args:
        flags: The partial table.
        base: The recording's table for the channel, or None (the flags alone).

    Returns:
        The merged table; its source names both (``--group-meta flags (0) over …``).
    """
    if base is None:
        return flags
    merged = dict(base.groups)
    merged.update(flags.groups)
    names = [str(i) for i in sorted(flags.groups)]
    names += ["none"] if flags.ungrouped is not None else []
    ungrouped = flags.ungrouped if flags.ungrouped is not None else base.ungrouped
    return GroupTable(
        merged, f"{flags.source} (group {','.join(names)}) over {base.source}", ungrouped=ungrouped
    )


def resolve_groups(
    groups_file: str | os.PathLike[str] | None,
    group_flags: Sequence[str] | None,
    recording_groups: list[dict[str, object]] | None,
    *,
    recording: str = "recording",
) -> GroupTable | None:
    """Pick the metadata source: ``--groups`` file, ``--group`` flags, the recording's.

    Args:
        groups_file: The ``--groups`` file, or None.
        group_flags: The ``--group`` flags, or None/empty.
        recording_groups: The recording's ``kvtool.groups`` list, or None.
        recording: The recording's name, for the source label and error messages.

    Returns:
        The table, or None when no source is given (learn from the stream).

    Raises:
        MetadataError: Both a file and flags are given, or the chosen source is invalid.
    """
    if groups_file is not None and group_flags:
        raise MetadataError(
            "give the group metadata either as --groups FILE or as --group-meta flags, not both"
        )
    if groups_file is not None:
        return load_groups_file(groups_file)
    if group_flags:
        # Partial: merged over each recording's metadata by the caller (merge_over).
        return parse_group_flags(group_flags)
    if recording_groups is not None:
        return groups_from_list(recording_groups, source=f"{recording} (metadata record)")
    return None


# -- the rule --------------------------------------------------------------------------

KindWindow = tuple[str, int | None]
"""A group's annotation: (kind, sliding window or None)."""

LearnKey = tuple[str, int | None, int]
"""(channel, data-parallel rank, group_idx): the key of a learned annotation. The channel
is the recording's channel name (``endpoint`` or ``endpoint#topic``), the same in every
file that recorded that publisher, so several inputs learn together."""

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


# -- learning from the whole input ---------------------------------------------------------

StreamKey = tuple[str, int | None]
"""(channel name, data-parallel rank) — two engines may serve different models."""


@dataclass(frozen=True)
class KindChange:
    """A group whose annotated stores disagree (kept for ``--check`` wording).

    Attributes:
        channel: Channel name.
        dp_rank: Data-parallel rank.
        group_idx: The group.
        seq: Seq of the first store that said ``after``.
        before: (kind, window) every command uses (see :class:`GroupLearner`).
        after: Another (kind, window) stores of the group said.
    """

    channel: str
    dp_rank: int | None
    group_idx: int
    seq: int | None
    before: KindWindow
    after: KindWindow


@dataclass(frozen=True)
class Conflict:
    """Stores of one (channel, rank, group) that say more than one (kind, window).

    Attributes:
        key: (channel, rank, group_idx).
        chosen: The (kind, window) every command uses for the key.
        said: Every (kind, window) said, with its store count and first seq, most said first.
    """

    key: LearnKey
    chosen: KindWindow
    said: tuple[tuple[KindWindow, int, int | None], ...]

    def describe(self) -> str:
        """Return one line: the group, where, what each value was said by, what is used.

        Returns:
            E.g. ``group 1: conflicting annotations on tcp://h:5557 rank 0: …``.
        """
        return f"group {self.key[2]}: {self.detail()}"

    def detail(self) -> str:
        """Return :meth:`describe` without the leading ``group N:``.

        Returns:
            The text.
        """
        ch, rank, _g = self.key
        parts = ", ".join(
            f"{_kw(*kw)} by {n} store(s)" + (f" from seq {s}" if s is not None else "")
            for kw, n, s in self.said
        )
        return (
            f"conflicting annotations on {ch} rank {rank}: {parts}; every command uses "
            f"{_kw(*self.chosen)} (the value most stores say; on a tie, the first in merge "
            "order)"
        )


@dataclass
class _Said:
    count: int
    first: tuple[object, ...]
    first_seq: int | None


@dataclass
class GroupLearner:
    """THE learner: (channel, rank, group_idx) → (kind, window) from annotated stores.

    It is a function of the whole input, not of reading order: it counts every
    (kind, window) that stores of a key say, with the merge position of the first store
    that said it, and :meth:`resolved` picks per key the value the most stores say, on a
    tie the one said first in merge order (see :mod:`kvtool.inputs`). Learners of parts
    of the input (files, chunks) combine exactly with :meth:`merge`, so the answer is the
    same whether the input is learned in one pass or in parallel pieces. A key with more
    than one value is a :class:`Conflict`.

    Attributes:
        said: key → (kind, window) → count and first position.
        block_sizes: key → the block size the first annotated store gave.
    """

    said: dict[LearnKey, dict[KindWindow, _Said]] = field(default_factory=dict)
    block_sizes: dict[LearnKey, int] = field(default_factory=dict)
    _n: int = 0

    def observe_store(
        self,
        channel: str,
        dp_rank: int | None,
        group_idx: int,
        kind: str,
        window: int | None,
        *,
        seq: int | None = None,
        position: tuple[object, ...] | None = None,
        count: int = 1,
    ) -> None:
        """Count ``count`` annotated stores of one key saying (kind, window).

        Args:
            channel: Channel name.
            dp_rank: Data-parallel rank.
            group_idx: The group.
            kind: What the stores say.
            window: Their window.
            seq: The batch seq, for messages.
            position: Merge position of the (first) store (comparable across every
                observation of this learner and those merged into it); default: the
                order of observation.
            count: How many stores.
        """
        if position is None:
            position = (self._n,)
        self._n += 1
        key = (channel, dp_rank, group_idx)
        vals = self.said.get(key)
        if vals is None:
            vals = self.said[key] = {}
        kw = (kind, window)
        got = vals.get(kw)
        if got is None:
            vals[kw] = _Said(count, position, seq)
        else:
            got.count += count
            if position < got.first:
                got.first, got.first_seq = position, seq

    def observe(
        self,
        channel: str,
        dp_rank: int | None,
        events: Iterable[object],
        seq: int | None = None,
        *,
        position: tuple[object, ...] | None = None,
    ) -> None:
        """Learn from one batch's events (decoded structs or lean projections).

        Args:
            channel: The channel name.
            dp_rank: The data-parallel rank.
            events: Events with ``group_idx``/``kv_cache_spec_kind``/
                ``kv_cache_spec_sliding_window`` attributes (non-stores have no kind).
            seq: The batch seq, for messages.
            position: The batch's merge position (default: order of observation).
        """
        said: Counter[tuple[object, object, object]] = Counter(
            (
                getattr(ev, "group_idx", None),
                kind,
                getattr(ev, "kv_cache_spec_sliding_window", None),
            )
            for ev in events
            if (kind := getattr(ev, "kv_cache_spec_kind", None)) is not None
        )
        for (idx, kind, window), n in said.items():
            # Values outside int64 are nothing vLLM sends; the table reads them as null.
            if not isinstance(kind, str) or not isinstance(idx, int) or not _is_i64(idx):
                continue
            if not isinstance(window, int) or not _is_i64(window):
                window = None
            self.observe_store(
                channel, dp_rank, idx, kind, window, seq=seq, position=position, count=n
            )
        if any((channel, dp_rank, idx) not in self.block_sizes for idx, _k, _w in said):
            for ev in events:
                idx = getattr(ev, "group_idx", None)
                size = getattr(ev, "block_size", None)
                key = (channel, dp_rank, idx)
                if (
                    isinstance(idx, int)
                    and isinstance(size, int)
                    and _is_int(size)
                    and key not in self.block_sizes
                    and getattr(ev, "kv_cache_spec_kind", None) is not None
                ):
                    self.block_sizes[key] = size  # type: ignore[index]

    def merge(self, other: GroupLearner) -> None:
        """Add what another learner (of another part of the input) saw.

        Args:
            other: The learner to fold in; positions must be comparable with this one's.
        """
        for key, vals in other.said.items():
            for (k, w), s in vals.items():
                self.observe_store(
                    key[0],
                    key[1],
                    key[2],
                    k,
                    w,
                    seq=s.first_seq,
                    position=s.first,
                    count=s.count,
                )
        for key, size in other.block_sizes.items():
            self.block_sizes.setdefault(key, size)

    @staticmethod
    def _ranked(vals: dict[KindWindow, _Said]) -> list[tuple[KindWindow, _Said]]:
        return sorted(vals.items(), key=lambda kv: (-kv[1].count, kv[1].first, str(kv[0])))

    def resolved(self) -> dict[LearnKey, KindWindow]:
        """Return the one (kind, window) per key (most said; tie: first in merge order).

        Returns:
            key → (kind, window).
        """
        return {key: self._ranked(vals)[0][0] for key, vals in self.said.items()}

    def conflicts(self) -> list[Conflict]:
        """Return every key whose stores said more than one (kind, window).

        Returns:
            The conflicts, ordered by key.
        """
        out = []
        for key in sorted(self.said, key=str):
            vals = self.said[key]
            if len(vals) < 2:
                continue
            ranked = self._ranked(vals)
            out.append(
                Conflict(key, ranked[0][0], tuple((kw, s.count, s.first_seq) for kw, s in ranked))
            )
        return out

    @property
    def learned(self) -> dict[StreamKey, dict[int, GroupInfo]]:
        """(channel, rank) → group_idx → resolved :class:`GroupInfo`."""
        out: dict[StreamKey, dict[int, GroupInfo]] = {}
        for (ch, rank, g), (k, w) in self.resolved().items():
            out.setdefault((ch, rank), {})[g] = GroupInfo(
                g, k, self.block_sizes.get((ch, rank, g)), w
            )
        return out

    @property
    def changes(self) -> list[KindChange]:
        """One :class:`KindChange` per value a conflicting key said besides the chosen one."""
        out = []
        for c in self.conflicts():
            for kw, _n, seq in c.said[1:]:
                out.append(KindChange(c.key[0], c.key[1], c.key[2], seq, c.chosen, kw))
        return out

    def table(self, channel: str, dp_rank: int | None) -> GroupTable:
        """Return what was learned for one (channel, rank) as a table.

        Args:
            channel: The channel name.
            dp_rank: The data-parallel rank.

        Returns:
            The table (possibly empty), source ``learned from annotated stores``.
        """
        groups = dict(self.learned.get((channel, dp_rank), {}))
        return GroupTable(groups, f"learned from annotated stores ({channel}, rank {dp_rank})")

    def describe(self) -> str:
        """Return one line summarising what was learned.

        Returns:
            E.g. ``2 stream(s), 6 group(s)``.
        """
        streams = {(ch, r) for ch, r, _ in self.said}
        return f"{len(streams)} stream(s), {len(self.said)} group(s)"


LEARNED_SOURCE = "learned from annotated stores per (channel, rank, group)"


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
    """

    given: GroupTable | None = None
    tables: Mapping[str, GroupTable] = field(default_factory=dict)
    learned: Mapping[LearnKey, KindWindow] = field(default_factory=dict)
    conflicts: tuple[Conflict, ...] = ()

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
        return ChannelRule(self.table_for(channel), ungrouped=self._ungrouped_flag()).no_group()

    def _ungrouped_flag(self) -> KindWindow | None:
        return self.given.ungrouped if self.given is not None else None

    def rule(self, channel: str, dp_rank: int | None) -> ChannelRule:
        """Return the rule for the events of one (channel, rank).

        Args:
            channel: The channel name.
            dp_rank: The events' data-parallel rank (see :func:`event_rank`).

        Returns:
            The rule (metadata, else learned).
        """
        table = self.table_for(channel)
        ungrouped = self._ungrouped_flag()
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
            Source names; ``learned from annotated stores …`` when learning is used.
        """
        out: list[str] = []
        if self.given is not None and not self.given.partial:
            return [self.given.source]
        for t in self.tables.values():
            if t.source not in out:
                out.append(t.source)
        if self.given is not None and self.given.groups:
            return out or [self.given.source]
        flags = self.given is not None and self.given.ungrouped is not None
        if self.learned or not (out or flags):
            out.append(LEARNED_SOURCE)
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
                    f"{n} store(s) say {_kw(k, w)}" for (k, w), n in iss.mismatched.most_common()
                )
                expect = " or ".join(sorted(_kw(k, w) for k, w in iss.expected))
                parts.append(f"metadata says {expect}, but {said}")
            if iss.unannotated:
                parts.append(f"{iss.unannotated} store(s) left unannotated")
            if iss.out_of_range:
                parts.append(
                    f"{iss.out_of_range} store(s) carry group_idx {idx}, which is not in the "
                    "metadata"
                )
            bad = iss.mismatched or iss.unannotated or iss.out_of_range
            if iss.first_seq is not None and bad:
                parts.append(f"first at seq {iss.first_seq}")
            parts.extend(c.detail() for c in by_group.get(idx, []))
            lines.append(f"group {idx}: " + "; ".join(parts))
        return lines


def _kw(kind: str | None, window: int | None) -> str:
    if kind is None:
        return "no kind"
    return f"{kind}" + (f" (window {window})" if window is not None else " (no window)")


__all__ = [
    "KINDS",
    "LEARNED_SOURCE",
    "SPEC_PARENTS",
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
