"""The per-batch bookkeeping of the issue 21 rules (docs/SEMANTICS.md R2-R5), for the kernel.

:class:`Pending` holds, per batch, what later rows of it resolve; the helpers here are
inlined into :func:`kvtool.report.kernel.advance`'s store and remove branches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from kvtool._jit import inline_kernel
from kvtool.columns import np
from kvtool.report import kbase
from kvtool.report.kbase import EVICTED, FLAG_WINDOW, UNIT
from kvtool.report.kstate import Channels, Entries, Live, Table, unlink

if TYPE_CHECKING:
    from numpy.typing import NDArray

_OWNER, _BNEXT, _SLOT = kbase.OWNER, kbase.BNEXT, kbase.SLOT
_UNIT = UNIT


@inline_kernel
def find(lc: Any, lg: Any, ln: Any, n: Any, ch: Any, g: Any, ng: Any) -> Any:
    """The index of (channel, group, no_group) among the first ``n`` of a pending list."""
    for k in range(n):
        if lc[k] == ch and lg[k] == g and ln[k] == ng:
            return k
    return -1


@inline_kernel
def is_partial(sh: Any, i: Any) -> Any:
    """A partial entry's store (R2): one hash whose tokens are a hash unit of the block.

    One hash, fewer tokens than the group's block size, a multiple of 16 that divides it
    (vLLM aligns blocks and hash units to 16 tokens; an older vLLM's store of a block's
    first few tokens is no partial entry), in a group that is not a sliding window's.
    """
    tok = sh.tokens[i]
    bs = sh.bs[i]
    return (
        sh.hashes[i] == 1
        and tok > 0
        and tok < bs
        and tok % _UNIT == 0
        and bs % tok == 0
        and (sh.flags[i] & FLAG_WINDOW) == 0
    )


class Pending(NamedTuple):
    """Per batch, what later rows of it resolve (docs/SEMANTICS.md, "Porting notes").

    ``fold_*``: keys of blocks taken off just now whose removes follow (R3); ``lf_*``:
    per group, the last full block stored (a partial's host, R2); ``pr_*``: per group, a
    promoted block awaiting its full key (R4); ``pk``: keys promoted whose re-store is an
    extra key; ``rk_*``: per group, a Mamba checkpoint block awaiting its new key (R5);
    ``late_*``: lifetimes of evicted blocks' further keys whose removes never came in
    their batch (R8: the entry's lifetime ends at the eviction all the same).
    ``n``: [folds, lf, pr, pk, rk, late].
    """

    fold_slot: NDArray[Any]
    fold_ts: NDArray[Any]
    fold_gkey: NDArray[Any]
    fold_rm: NDArray[Any]
    late_gkey: NDArray[Any]
    late_rm: NDArray[Any]
    late_st: NDArray[Any]
    lf_chan: NDArray[Any]
    lf_group: NDArray[Any]
    lf_nog: NDArray[Any]
    lf_entry: NDArray[Any]
    lf_serial: NDArray[Any]
    pr_chan: NDArray[Any]
    pr_group: NDArray[Any]
    pr_nog: NDArray[Any]
    pr_row: NDArray[Any]
    pr_ts: NDArray[Any]
    pr_open: NDArray[Any]
    pk: NDArray[Any]
    rk_chan: NDArray[Any]
    rk_group: NDArray[Any]
    rk_nog: NDArray[Any]
    n: NDArray[Any]


def pending(n: int) -> Pending:
    """Room for a call of ``n`` rows (each list at most one entry per row)."""
    i64 = np.int64

    def z() -> NDArray[Any]:
        return np.zeros(n + 1, dtype=i64)

    def b() -> NDArray[Any]:
        return np.zeros(n + 1, dtype=np.bool_)

    def f() -> NDArray[Any]:
        return np.zeros(n + 1, dtype=np.float64)

    return Pending(
        z(), f(), z(), f(), z(), f(), f(),
        z(), z(), b(), z(), z(),
        z(), z(), b(), z(), np.zeros(n + 1, np.float64), b(),
        z(),
        z(), z(), b(),
        np.zeros(6, dtype=i64),
    )  # fmt: skip


@inline_kernel
def flush_folds(pd: Pending) -> None:
    """Forget the folded keys whose removes did not come (at a batch's end, a clear).

    An evicted block's give their lifetime all the same (``late_*``).
    """
    for k in range(pd.n[0]):
        if np.isfinite(pd.fold_ts[k]):
            m = pd.n[5]
            pd.late_gkey[m] = pd.fold_gkey[k]
            pd.late_rm[m] = pd.fold_rm[k]
            pd.late_st[m] = pd.fold_ts[k]
            pd.n[5] = m + 1
    pd.n[0] = 0


@inline_kernel
def settle(pd: Pending, c: Channels, chan: Any, out: Any) -> None:
    """End a batch: a promoted block whose full key never came was evicted after all."""
    for k in range(pd.n[2]):
        if pd.pr_open[k]:
            r = pd.pr_row[k]
            out.what[r] = EVICTED
            out.ts[r] = pd.pr_ts[k]
            c.evictions[chan[r]] += 1
    flush_folds(pd)
    for k in range(1, 5):
        pd.n[k] = 0


@inline_kernel
def drop_block(
    t: Table,
    lv: Live,
    e: Entries,
    c: Channels,
    meta: Any,
    live_gkey: Any,
    x: Any,
    ts: Any,
    ch: Any,
    pd: Pending,
    life: Any,
) -> Any:
    """Take the block holding entry ``x`` off the cache, with all its keys.

    The removes of its other keys follow (folded, R3); they give a lifetime where the
    block was evicted (``life``), none else (R8: NaN, which no lifetime pairs).

    Returns:
        The block's report row.
    """
    b = e.aux[x, _OWNER]
    g = e.gkey[b]
    y = b
    while y >= 0:
        ny = e.aux[y, _BNEXT]
        if y != x:
            k = pd.n[0]
            pd.fold_slot[k] = e.aux[y, _SLOT]
            pd.fold_ts[k] = e.ts[y] if life else np.nan
            pd.fold_gkey[k] = e.gkey[y]
            pd.fold_rm[k] = ts
            pd.n[0] = k + 1
        unlink(t, lv, e, c, meta, y, ts, ch)
        y = ny
    live_gkey[g] -= 1
    return g


@inline_kernel
def block_has(t: Table, e: Entries, x: Any, h: Any, not_slot: Any) -> Any:
    """Whether the block of entry ``x`` carries key hash ``h`` (other than ``not_slot``)."""
    y = e.aux[x, _OWNER]
    while y >= 0:
        s = e.aux[y, _SLOT]
        if s != not_slot and t.hash[s] == h:
            return True
        y = e.aux[y, _BNEXT]
    return False


__all__ = [
    "Pending",
    "block_has",
    "drop_block",
    "find",
    "flush_folds",
    "is_partial",
    "pending",
    "settle",
]
