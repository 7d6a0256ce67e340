"""The report's rows: one ``gkey`` per (group_idx, kind, window[, medium]), in stream order.

The registry maps each report row to its gkey, numbered in order of first appearance in
the stream (:class:`kvtool.report.builder.ReportBuilder` keeps it across chunks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.annotate import kind_label
from kvtool.columns import UNATTRIBUTED, np
from kvtool.report.arrays import (
    I64,
    MediumRow,
    ReportRow,
    int_column,
    mark_changes,
    pack_keys,
    string_codes,
)

if TYPE_CHECKING:
    from numpy.typing import NDArray

Registry = dict[ReportRow | MediumRow, int]
"""Report row -> its gkey."""


def gkey_of(
    registry: Registry, group_idx: int | None, kind: str, window: int | None, *medium: str | None
) -> int:
    """The report row (gkey) of (group_idx, kind, window[, medium]), registered if new."""
    key: ReportRow | MediumRow = (group_idx, kind, window, *medium)  # type: ignore[assignment]
    if key not in registry:
        registry[key] = len(registry)
    return registry[key]


def gkeys(
    registry: Registry,
    df: pl.DataFrame,
    skip: NDArray[Any],
    unattributed: NDArray[Any],
    group: NDArray[Any],
    no_group: NDArray[Any],
    *,
    by_medium: bool,
) -> NDArray[Any]:
    """Return each row's report row (``gkey``; -1 where ``skip``: clears belong to none).

    A row's report row is (group_idx, kind_final, sliding_window): stores count under
    their own kind, removes under their group's; a remove left ``unattributed`` by
    :func:`kvtool.report.attribution.resolve_ungrouped` has no window; a row with no
    kind is ``unannotated`` (distinct from vLLM's own ``unknown``). Rows come in runs
    of one key (an event's blocks share it), so the keys are read at run starts only; the few
    distinct keys of the chunk are registered in order of first appearance, so
    numbering follows the stream.
    """
    n = df.height
    kind_s = df["kind"]
    # Runs of one kind string (nulls included) without coding every row: the kinds are
    # coded at run starts only (a categorical cast of the whole column costs more).
    kind_run = kind_s.rle_id().to_numpy()
    window, window_null = int_column(df, "sliding_window")
    if window_null is None:
        window_null = np.zeros(n, dtype=bool)
    any_unattributed = bool(unattributed.any())
    if any_unattributed:
        window_null = window_null | unattributed
        window = np.where(unattributed, 0, window)
    cols: tuple[NDArray[Any], ...] = (
        group, no_group, kind_run, unattributed, window, window_null, skip
    )  # fmt: skip
    medium_s = df["medium"] if by_medium else None
    if medium_s is not None:
        cols = (*cols, medium_s.rle_id().to_numpy())
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for values in cols:
        mark_changes(values, change)
    starts = np.flatnonzero(change)
    kind = np.asarray(
        kind_s.gather(starts)
        .cast(pl.Categorical)
        .to_physical()
        .cast(pl.Int64)
        .fill_null(-1)
        .to_numpy(),
        dtype=I64,
    )
    if any_unattributed:
        kind = np.where(unattributed[starts], -2, kind)
    at = [group, no_group, None, window, window_null, skip]
    codes = [kind if values is None else values[starts] for values in at]
    if medium_s is not None:
        codes.append(string_codes(medium_s.gather(starts)))
    packed = pack_keys(codes)
    _uniq, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    code_gkey = np.full(len(first), -1, dtype=I64)
    for j in np.argsort(first).tolist():
        r = int(starts[first[j]])
        if skip[r]:
            continue
        # A kind spelled like kvtool's own labels keeps apart from them (issue 24).
        k_final = UNATTRIBUTED if unattributed[r] else kind_label(kind_s[r])
        code_gkey[j] = gkey_of(
            registry,
            None if no_group[r] else int(group[r]),
            k_final,
            None if window_null[r] else int(window[r]),
            *(() if medium_s is None else (medium_s[r],)),
        )
    lengths = np.diff(np.append(starts, n))
    out: NDArray[Any] = np.repeat(code_gkey[inverse.reshape(-1)], lengths)
    return out


def registry_frame(registry: Registry, *, by_medium: bool) -> pl.DataFrame:
    """The report rows as a frame: group_idx, kind_final, sliding_window, gkey (and medium)."""
    frame = pl.DataFrame(
        [(key[0], key[1], key[2], i) for key, i in registry.items()],
        schema={
            "group_idx": pl.Int64,
            "kind_final": pl.String,
            "sliding_window": pl.Int64,
            "gkey": pl.UInt32,
        },
        orient="row",
    )
    if by_medium:
        media = [key[3] if len(key) > 3 else None for key in registry]
        frame = frame.with_columns(medium=pl.Series(media, dtype=pl.String))
    return frame


# -- one chunk ---------------------------------------------------------------------------


def level_map(registry: Registry, *, by_medium: bool) -> pl.DataFrame:
    """:func:`registry_frame` with each row's level keys (``L_kind``, ``L_window``, ...)."""
    return registry_frame(registry, by_medium=by_medium).with_columns(
        L_kind=pl.col("kind_final"),
        L_window=pl.col("sliding_window"),
        L_group=pl.col("gkey").cast(pl.Int64),
        L_total=pl.lit(0, pl.Int64),
    )


__all__ = ["Registry", "gkey_of", "gkeys", "level_map", "registry_frame"]
