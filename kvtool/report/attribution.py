"""Which kind and window a remove belongs to, and so which report row it counts in.

DESIGN.md "Report semantics": a remove with ``group_idx`` takes its group's kind (the
annotator has already set it from metadata or learned stores); a remove *without*
``group_idx`` on a channel whose stores carry one (older vLLM senders mixed with newer
ones, or a partial upgrade) is attributed through the (hash → groups) state: when the
hash is live in exactly one group of that channel, the remove belongs to that group;
live in none (an orphan) or in several (ambiguous), it is ``unattributed`` -- never
guessed. On channels with no ``group_idx`` at all, removes are keyed like their stores
(channel, no group, hash) and need no resolution.

This resolution walks the chunk's rows of such channels in stream order in Python: it
only runs for chunks that hold removes without ``group_idx`` on grouped channels, which
vLLM >= 0.21 never sends.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

from kvtool.annotate import kind_of_label
from kvtool.columns import CLEARED, REMOVED, STORED

GroupKind = Callable[[int, int, int], "tuple[str, int | None] | None"]
"""(channel_id, group_idx, event_index) -> (kind, window) of a group, or None."""

RESOLVED_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.Int64(),
    "resolved": pl.Boolean(),
    "resolved_group": pl.Int64(),
    "resolved_kind": pl.String(),
    "resolved_window": pl.Int64(),
    "unattributed": pl.Boolean(),
    "unattributed_orphan": pl.Boolean(),
}


def needs_resolution(df: pl.DataFrame, grouped_channels: set[int]) -> bool:
    """Whether a chunk holds removes without ``group_idx`` on channels with grouped stores.

    Args:
        df: The chunk (with ``type_code``, ``group_idx``, ``hash``, ``channel_id``).
        grouped_channels: Channels whose stores carry ``group_idx``.

    Returns:
        True when :func:`resolve_ungrouped` has work to do.
    """
    if not grouped_channels:
        return False
    return bool(
        df.select(
            (
                (pl.col("type_code") == REMOVED)
                & pl.col("group_idx").is_null()
                & pl.col("hash").is_not_null()
                & pl.col("channel_id").is_in(list(grouped_channels))
            ).any()
        ).item()
    )


def resolve_ungrouped(
    df: pl.DataFrame,
    live: pl.DataFrame,
    grouped_channels: set[int],
    kind_of_gkey: dict[int, tuple[str, int | None]],
    group_kind: GroupKind | None,
) -> tuple[pl.DataFrame, int]:
    """Attribute removes without ``group_idx`` by the (hash → group) state, in stream order.

    Args:
        df: The chunk, with ``row`` (stream position), ``event_index`` and optionally
            ``restart`` (the row begins a publisher restart: its channel starts afresh).
        live: The live entries before the chunk (``channel_id``, ``group_idx``, ``hash``, ``gkey``).
        grouped_channels: Channels whose stores carry ``group_idx``.
        kind_of_gkey: gkey → (kind, window) of the report rows the live entries are in.
        group_kind: The annotator's group lookup, for the kind of the group found.

    Returns:
        One row per remove without ``group_idx`` (:data:`RESOLVED_SCHEMA`), and how many
        were ambiguous (live in several groups).
    """
    chans = list(grouped_channels)
    restart = pl.col("restart") if "restart" in df.columns else pl.lit(False)
    rows = df.filter(
        pl.col("channel_id").is_in(chans)
        & ((pl.col("type_code") == CLEARED) | pl.col("hash").is_not_null() | restart)
    ).select(
        restart.alias("restart"),
        "row",
        "channel_id",
        "type_code",
        "group_idx",
        "hash",
        "kind",
        "sliding_window",
        "event_index",
    )
    Key = tuple[int, int | None, int]
    count: dict[Key, int] = {}
    kinds: dict[Key, tuple[str | None, int | None]] = {}
    groups_of: dict[tuple[int, int], set[int | None]] = {}
    for cid, g, h, gkey in (
        live.filter(pl.col("channel_id").is_in(chans))
        .select("channel_id", "group_idx", "hash", "gkey")
        .iter_rows()
    ):
        count[(cid, g, h)] = count.get((cid, g, h), 0) + 1
        groups_of.setdefault((cid, h), set()).add(g)
        k0, w0 = kind_of_gkey[gkey]
        kinds[(cid, g, h)] = (kind_of_label(k0), w0)
    ambiguous = 0
    out: list[tuple[int, bool, int | None, str | None, int | None, bool, bool]] = []
    for re, row, cid, t, g, h, k, w, e in rows.iter_rows():
        if re:
            # A publisher restart (seq going back) begins here: its cache is new, as the
            # kernel's channel state is (kvtool.report.restarts).
            for key in [key for key in count if key[0] == cid]:
                del count[key]
            for hkey in [hk for hk in groups_of if hk[0] == cid]:
                del groups_of[hkey]
            if h is None and t != CLEARED:
                continue
        if t == CLEARED:
            for key in [key for key in count if key[0] == cid]:
                del count[key]
            for hkey in [hk for hk in groups_of if hk[0] == cid]:
                del groups_of[hkey]
            continue
        if t == STORED:
            key = (cid, g, h)
            count[key] = count.get(key, 0) + 1
            kinds[key] = (k, w)
            groups_of.setdefault((cid, h), set()).add(g)
            continue
        if g is None:
            cands = [x for x in groups_of.get((cid, h), ()) if count.get((cid, x, h), 0) > 0]
            if len(cands) != 1:
                # Live in no group (orphan) or several (ambiguous): unattributed.
                ambiguous += len(cands) > 1
                out.append((row, False, None, None, None, True, not cands))
                continue
            g = cands[0]
            # The group's kind (metadata or learned); else what its store said.
            known = (
                group_kind(cid, g, e)
                if group_kind is not None and g is not None and g >= 0
                else None
            )
            k2, w2 = known if known is not None else kinds.get((cid, g, h), (k, w))
            out.append((row, True, g, k2, w2, False, False))
        key = (cid, g, h)
        c = count.get(key, 0)
        if c > 0:
            count[key] = c - 1
            if c == 1:
                groups_of.get((cid, h), set()).discard(g)
    return pl.DataFrame(out, schema=RESOLVED_SCHEMA, orient="row"), ambiguous
