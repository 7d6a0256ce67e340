"""The report builder's array helpers and the kernel's classes of rows, as the tables count them.

Pure numpy/polars on one chunk's columns: nothing here keeps state
(:mod:`kvtool.report.builder` drives them chunk by chunk).
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any

import polars as pl

from kvtool.columns import np
from kvtool.report import kernel
from kvtool.report.aggregates import PLAUSIBLE_TS_MAX, PLAUSIBLE_TS_MIN

if TYPE_CHECKING:
    from numpy.typing import NDArray


BLOCK_IN = (*kernel.MAKES_BLOCK, kernel.REKEY, kernel.DISCARDED_STORE)
BLOCK_OUT = (kernel.EVICTED, kernel.PROMOTED, kernel.REKEY_REMOVE, kernel.DISCARD)
ANNOUNCED = (kernel.ANNOUNCED, kernel.ANNOUNCED_AMBIGUOUS)
NOT_A_BLOCK = (
    kernel.EXTRA,
    kernel.EXTRA_NOOP,
    kernel.REKEY,
    kernel.DISCARDED_STORE,
    *ANNOUNCED,
)
PREFIX_KINDS = ("full_attention", "mla_attention", "sink_full_attention")
NOT_AN_EVICTION = (kernel.EVICTED_EXTRA, kernel.PROMOTED, kernel.REKEY_REMOVE, kernel.DISCARD)
KEY_IN = (*BLOCK_IN, kernel.EXTRA)
KEY_OUT = (*BLOCK_OUT, kernel.EVICTED_EXTRA)
CLASS_COLUMNS = (
    ("partial_extra_keys", kernel.EXTRA),
    ("evicted_extra_keys", kernel.EVICTED_EXTRA),
    ("rekeys", kernel.REKEY),
    ("partial_promotions", kernel.PROMOTED),
    ("rekey_removes", kernel.REKEY_REMOVE),
    ("checkpoints_discarded", kernel.DISCARD),
)
"""Issue 21: the kernel's classes of stores and removes (docs/SEMANTICS.md), as columns."""

ReportRow = tuple[int | None, str, int | None]
"""(group_idx, kind, sliding_window) of one report row."""

MediumRow = tuple[int | None, str, int | None, str | None]
"""(group_idx, kind, sliding_window, medium) of one report row of a builder made with
``by_medium`` (``kvtool serve``'s ``medium`` label)."""

I64 = "int64"
"""numpy's int64, by name."""


def _medium_salt(medium: str) -> int:
    """A medium's key salt: 64 stable bits of its name (nonzero)."""
    got = int.from_bytes(hashlib.blake2b(medium.encode(), digest_size=8).digest(), "little")
    return ((got | 1) ^ (1 << 63)) - (1 << 63)  # as a signed int64


def tier_keys(df: pl.DataFrame) -> pl.DataFrame:
    """The chunk with each row's ``hash`` and ``parent`` made a key of its medium's cache.

    Each medium is a cache of its own (issue 21, docs/SEMANTICS.md "Tiers"): a CPU copy of
    a key live on the GPU is a transfer into another cache, not a second copy or a hit
    announcement, and a remove on CPU removes no GPU copy. The kernel keys its state by
    (channel, rank, group, hash); a row of another medium than ``GPU`` (or none: vLLM
    before 0.11, SGLang's device pool) gets its hash and parent xor-ed with its medium's
    salt, so it keys its own medium's entries. GPU rows, and every row of an untiered
    stream, are left as they are (the same counts, byte for byte).

    Args:
        df: A chunk (``medium`` among its columns, or not: then returned as is).

    Returns:
        The chunk, salted where a row names another medium.
    """
    if "medium" not in df.columns:
        return df
    med = df["medium"]
    tier = ~(med.is_null() | (med == "GPU").fill_null(False))
    if not tier.any():
        return df
    names = med.filter(tier).unique().to_list()
    salt = med.replace_strict(
        names, [_medium_salt(m) for m in names], default=0, return_dtype=pl.Int64
    )
    cols = [c for c in ("hash", "parent") if c in df.columns]
    return df.with_columns(pl.col(c).xor(salt) for c in cols)


def int_column(
    df: pl.DataFrame, name: str, fill: int = 0
) -> tuple[NDArray[Any], NDArray[Any] | None]:
    """Return a column as an int64 array (nulls as ``fill``) and its null mask (None: none)."""
    s = df[name]
    if s.null_count():
        return np.asarray(s.fill_null(fill).to_numpy(), dtype=I64), s.is_null().to_numpy()
    return np.asarray(s.to_numpy(), dtype=I64), None


def plausible_ts_array(df: pl.DataFrame) -> NDArray[Any]:
    """:func:`~kvtool.report.aggregates.plausible_ts` on arrays (same floats)."""
    ts_s = df["ts"]
    if ts_s.null_count():
        ts_s = ts_s.fill_null(float("nan"))
    ts = np.asarray(ts_s.to_numpy(), dtype=np.float64)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(ts) & (ts >= PLAUSIBLE_TS_MIN) & (ts < PLAUSIBLE_TS_MAX)
    if ok.all():
        return ts
    fallback = df["log_time"].to_numpy().astype(np.float64) * 1e-9
    return np.where(ok, ts, fallback)


def string_codes(strings: pl.Series) -> NDArray[Any]:
    """Codes of a few strings (null: -1), equal where the strings are, within one call."""
    return np.asarray(
        strings.cast(pl.Categorical).to_physical().cast(pl.Int64).fill_null(-1).to_numpy(),
        dtype=I64,
    )


def mark_changes(values: NDArray[Any], out: NDArray[Any]) -> None:
    """``out[1:] |= values[1:] != values[:-1]`` unless ``values`` is constant."""
    if len(values) and not (values == values[0]).all():
        out[1:] |= values[1:] != values[:-1]


def pack_keys(cols: list[NDArray[Any]]) -> NDArray[Any]:
    """One int64 per row that is equal exactly where all ``cols`` (integer arrays) are.

    Each column is offset by its minimum and scaled by the span of the ones before it;
    when the spans' product would not fit, the columns are replaced by dense codes first.
    """
    lows = [int(v.min()) for v in cols]
    spans = [int(v.max()) - lo + 1 for v, lo in zip(cols, lows, strict=True)]
    if math.prod(spans) >= 1 << 62:
        dense = [np.unique(v, return_inverse=True) for v in cols]
        cols = [inv.reshape(-1) for _u, inv in dense]
        lows = [0] * len(cols)
        spans = [len(u) for u, _inv in dense]
        if math.prod(spans) >= 1 << 62:  # pragma: no cover - needs > 2**10 distinct of each
            packed = np.zeros(len(cols[0]), dtype=I64)
            for codes, span in zip(cols, spans, strict=True):
                packed = np.unique(packed * span + codes, return_inverse=True)[1].reshape(-1)
            return packed
    packed = np.zeros(len(cols[0]), dtype=I64)
    for values, lo, span in zip(cols, lows, spans, strict=True):
        packed = packed * span + (values.astype(I64) - lo)
    return packed


def inserted(shape: kernel.Shape, at: NDArray[Any]) -> kernel.Shape:
    """``shape`` with each row ``at`` repeated before itself (a restart's clear's row)."""
    cols: list[Any] = [None if a is None else np.insert(a, at, a[at]) for a in shape]
    return kernel.Shape(*cols)


def seconds_between(earlier: NDArray[Any], later: NDArray[Any]) -> NDArray[Any]:
    """``later - earlier`` in seconds, taken at microsecond resolution.

    ts is float seconds since the epoch: the difference of the rounded microseconds
    keeps float rounding of large timestamps from showing (rounded half to even, scaled
    back by a multiplication: what polars computes for ``(r * 1e6).round() -
    (s * 1e6).round()) / 1e6``).
    """
    with np.errstate(invalid="ignore"):
        out: NDArray[Any] = (np.rint(later * 1e6) - np.rint(earlier * 1e6)) * 1e-6
    return out


__all__ = [
    "ANNOUNCED",
    "BLOCK_IN",
    "BLOCK_OUT",
    "CLASS_COLUMNS",
    "I64",
    "KEY_IN",
    "KEY_OUT",
    "NOT_AN_EVICTION",
    "NOT_A_BLOCK",
    "PREFIX_KINDS",
    "MediumRow",
    "ReportRow",
    "inserted",
    "int_column",
    "mark_changes",
    "pack_keys",
    "plausible_ts_array",
    "seconds_between",
    "string_codes",
    "tier_keys",
]
