"""KV cache group metadata: kinds and their labels, spec -> kind, the metadata sources.

A table (:class:`GroupTable`) comes from a ``--groups`` file, ``--group-meta`` flags
(merged over a recording's own, :func:`merge_over`) or a recording's metadata record
(:func:`resolve_groups`). Spec descriptions are turned into kind and window as
``get_kv_cache_spec_kind`` and ``get_kv_cache_spec_sliding_window`` in
``vllm/v1/kv_cache_interface.py`` do. The rule that applies a table is
:mod:`kvtool.annotate`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtool.errors import MetadataError
from kvtool.poolsize import read_groups_json

if TYPE_CHECKING:
    import polars as pl

KindWindow = tuple[str, int | None]
"""A group's annotation: (kind, sliding window or None)."""

LearnKey = tuple[str, int | None, int]
"""(channel, data-parallel rank, group_idx): the key of a learned annotation. The channel
is the recording's channel name (``endpoint`` or ``endpoint#topic``), the same in every
file that recorded that publisher, so several inputs learn together."""

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
            none=KIND``: SGLang, vLLM before ~0.21), or None: they stay unannotated.
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

    def ungrouped_metadata(self) -> dict[str, object] | None:
        """Return :attr:`ungrouped` as a ``kvtool.ungrouped`` record holds it, or None.

        ``get_kv_cache_group_metadata()``'s list (:meth:`to_metadata`) has no entry for
        events without ``group_idx``; a recording keeps the ``none=KIND[:WINDOW]`` rule in
        a record of its own (:func:`ungrouped_from_record` reads it back).

        Returns:
            ``{"kind", "sliding_window", "source"}``, or None without a rule.
        """
        if self.ungrouped is None:
            return None
        kind, window = self.ungrouped
        return {"kind": kind, "sliding_window": window, "source": self.source}

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
    ungrouped stream: SGLang, vLLM before ~0.21; issue 21), :attr:`GroupTable.ungrouped`.

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
        # 'none': the events without group_idx (SGLang, vLLM before ~0.21; issue 21).
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


def ungrouped_from_record(values: Mapping[str, object], *, source: str) -> GroupTable:
    """Read a ``kvtool.ungrouped`` record: the kind of events without ``group_idx``.

    The record (:meth:`GroupTable.ungrouped_metadata`) is what ``replay --annotate
    --group-meta none=KIND[:WINDOW] -o COPY`` stores, so a report of the copy gives those
    events the kind a report of the original with the flag gives them (issue 21).

    Args:
        values: The record's decoded values: ``kind`` (a non-empty string),
            ``sliding_window`` (int64 or null), ``source``, optionally ``channel``.
        source: Names the recording in the table's source and in error messages.

    Returns:
        A partial table with no groups and :attr:`GroupTable.ungrouped` set, like the
        flag's (:func:`parse_group_flags`).

    Raises:
        MetadataError: The record does not have that shape.
    """
    kind = values.get("kind")
    window = values.get("sliding_window")
    if not isinstance(kind, str) or not kind:
        raise MetadataError(f'{source}: "kind" must be a non-empty string, got {kind!r}')
    if window is not None and not (_is_int(window) and _is_i64(window)):
        raise MetadataError(
            f'{source}: "sliding_window" must be an integer (int64) or null, got {window!r}'
        )
    assert window is None or isinstance(window, int)
    given = values.get("source")
    label = f"{source} (from {given})" if isinstance(given, str) and given else source
    return GroupTable({}, label, partial=True, ungrouped=(kind, window))


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
