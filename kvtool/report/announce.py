"""Hit announcements in the state kernel (issue 21, rules R6 and R7 of docs/SEMANTICS.md).

Under ``kv_cache_report_mode="full"`` vLLM's ``get_computed_blocks`` announces a request's
hit: for each group with hit blocks one ``BlockStored`` of every hit block's hash,
``parent_block_hash`` None, the group's block size and the prefix's tokens, one event per
group in a row (``emit_cached_block_events``). They change no state, never get a remove,
and never count as stores, live, peak or lifetimes.

- **With** ``origin`` (vllm-project/vllm#51699): ``REUSED`` is an announcement, ``NEW`` a
  store, exactly.
- **Without** (vLLM 0.33): a run of parentless stores, one per group of the channel with
  the same tokens, is an announcement when its blocks are a valid hit in every group,
  judged on the live keys at the run's position (vLLM's per-kind hit rule: full attention
  every block, sliding window the last ``ceil((w - 1) / bs)`` blocks, Mamba the block at
  the length). It is *certain* when a shorter prefix is a valid hit too or a later store
  of the batch continues it (its parent is the run's last hash); otherwise *ambiguous* (a
  block-aligned prompt whose lookup was capped computes from block 0 too): taken as an
  announcement in ``auto`` mode once its channel showed a certain one, in ``full`` mode
  always, and counted for the bound either way.
- **Hits** (R7): per announced event, its blocks and tokens; a lookup repeated in the
  channel's next batch (same first hash) after one that stored nothing more in its group
  (its allocation failed) takes the earlier count back (``failed_lookups``).

Departures from the reference model (tests/semantics_model.py): "announced before" and
"the next batch" are per channel (the model's are stream-wide), so that reports of units
of work (``--jobs``) merge exactly; groups past 62 share one bit of the coverage mask.

:func:`announce` is called by both loops of :mod:`kvtool.report.kernel` at the first row
of a candidate event (:func:`candidates`) and marks the rows of the events it decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtool._jit import inline_kernel, kernel
from kvtool.columns import np
from kvtool.report.kbase import FLAG_MAMBA, FLAG_PREFIX, FLAG_TIER, FLAG_WINDOW, probe
from kvtool.text import plural

INCREMENTAL, AUTO, FULL = 0, 1, 2
"""Report modes (``--report-mode``): no request announces (every parentless store is a
store), decide from what the stream shows, every request announces."""

MODES = {"incremental": INCREMENTAL, "auto": AUTO, "full": FULL}
"""The modes by name."""

ORIGIN_NEW, ORIGIN_REUSED = 1, 2
"""Codes of the table's ``origin`` column (:data:`kvtool.columns.ORIGIN_CODES`)."""

ANNOUNCED, ANNOUNCED_AMBIGUOUS = 14, 15
"""The kernel's ``what`` of a row of an announcement: certain (or marked ``REUSED``), or
ambiguous and taken as one (``auto`` after a certain one)."""

NOTE_AMBIGUOUS = 1
"""``Out.note`` of a row of an ambiguous run left as a store (the bound's other side)."""

HIT_FIELDS = 9
_H_CHAN, _H_GROUP, _H_NOG, _H_BATCH, _H_FIRST, _H_N, _H_TOKENS, _H_TAIL, _H_GKEY = range(9)
"""Columns of the hit records: per (channel, group), its last counted announcement."""

STORE = 1  # kvtool.report.kernel.STORE


def candidates(op: Any, sh: Any, mode: int, first: Any) -> Any:
    """The rows where an announcement may start.

    An event's first row, a store of hashes, marked ``REUSED``, or (not ``incremental``)
    unmarked, parentless, of whole blocks and of the GPU block pool
    (``emit_cached_block_events``; an offload to another tier is a parentless store of
    cached keys too).

    Args:
        op: The kernel's row kinds.
        sh: The rows' :class:`kvtool.report.kernel.Shape`.
        mode: The report mode.
        first: Each row is its event's first.

    Returns:
        A bool array.
    """
    out = (op == STORE) & first & (sh.hashes > 0)
    reused = sh.origin == ORIGIN_REUSED
    if mode == INCREMENTAL:
        return out & reused
    whole = (sh.bs > 0) & (sh.tokens == sh.hashes * sh.bs)
    gpu = (sh.flags & FLAG_TIER) == 0
    return out & (reused | (~sh.has_parent & (sh.origin == 0) & whole & gpu))


@inline_kernel
def _bit(group: Any, no_group: Any) -> Any:
    if no_group:
        return np.int64(1) << np.int64(63)
    return np.int64(1) << np.int64(min(group, 62))


@inline_kernel
def _span(cl: Any, e: Any, a: Any, b: Any) -> Any:
    """Live keys among blocks ``a..b-1`` of the event starting at row ``e``."""
    if b <= a:
        return 0
    lo = cl[e + a - 1] if a > 0 else 0
    return cl[e + b - 1] - lo


@inline_kernel
def _valid(sh: Any, cl: Any, e: Any, k: Any, mode: Any) -> Any:
    """Whether the first ``k`` blocks of the event at row ``e`` are a hit by its kind."""
    f = sh.flags[e]
    if f & FLAG_PREFIX:
        return _span(cl, e, 0, k) == k  # FullAttentionManager: every block
    w = sh.window[e]
    bs = sh.bs[e]
    if f & FLAG_WINDOW and w > 0 and bs > 0:
        need = (w - 1 + bs - 1) // bs  # SlidingWindowManager: cdiv(window - 1, block_size)
        a = max(0, k - need)
        return _span(cl, e, a, k) == k - a
    if f & FLAG_MAMBA:
        return _span(cl, e, k - 1, k) == 1  # MambaManager: the state at the length
    # A kind whose hit rule is not known proves nothing, unless every request announces.
    return mode == FULL


@inline_kernel
def _mark(out: Any, e: Any, n: Any, code: Any) -> None:
    for r in range(e, e + n):
        out.what[r] = code


@inline_kernel
def _count_hit(
    op: Any,
    chan: Any,
    group: Any,
    no_group: Any,
    h: Any,
    gkey: Any,
    sh: Any,
    e: Any,
    hits: Any,
    hit_n: Any,
    out: Any,
) -> None:
    """R7: count the announced event at row ``e`` once per admitted request."""
    ch, g, ng = chan[e], group[e], no_group[e]
    n = sh.hashes[e]
    idx = -1
    for x in range(hit_n[0]):
        if hits[x, _H_CHAN] == ch and hits[x, _H_GROUP] == g and hits[x, _H_NOG] == ng:
            idx = x
            break
    if idx < 0:
        idx = hit_n[0]
        hit_n[0] = idx + 1
        hits[idx, _H_CHAN] = ch
        hits[idx, _H_GROUP] = g
        hits[idx, _H_NOG] = ng
        hits[idx, _H_BATCH] = -2
        hits[idx, _H_TAIL] = 0
    elif hits[idx, _H_TAIL] and hits[idx, _H_BATCH] == sh.pbatch[e] and hits[idx, _H_FIRST] == h[e]:
        # The channel's previous batch announced this lookup and stored nothing after it
        # in the group: its allocation failed, and this is the same request again.
        out.back_blocks[e] = hits[idx, _H_N]
        out.back_tokens[e] = hits[idx, _H_TOKENS]
        out.back_gkey[e] = hits[idx, _H_GKEY]
    tail = 1
    cur = sh.batch[e]
    r = e + n
    while r < len(op) and sh.batch[r] == cur:
        if op[r] == STORE and chan[r] == ch and group[r] == g and no_group[r] == ng:
            tail = 0
            break
        r += 1
    hits[idx, _H_BATCH] = cur
    hits[idx, _H_FIRST] = h[e]
    hits[idx, _H_N] = n
    hits[idx, _H_TOKENS] = sh.tokens[e]
    hits[idx, _H_TAIL] = tail
    hits[idx, _H_GKEY] = gkey[e]


@kernel
def announce(
    t: Any,
    seen: Any,
    hits: Any,
    hit_n: Any,
    op: Any,
    chan: Any,
    group: Any,
    no_group: Any,
    h: Any,
    gkey: Any,
    sh: Any,
    cand: Any,
    i: Any,
    mode: Any,
    out: Any,
    cl: Any,
) -> Any:
    """Decide the run of candidate events starting at row ``i`` (see the module docstring).

    Marks the rows of announced events (``out.what``: :data:`ANNOUNCED`,
    :data:`ANNOUNCED_AMBIGUOUS`) and of ambiguous runs left as stores (``out.note``), and
    writes a failed lookup's take-back at the row of the lookup repeated
    (``out.back_blocks``, ``back_tokens``, ``back_gkey``).

    Args:
        t: The key table (read only).
        seen: Per channel, certain announcements so far.
        hits: The hit records (room for one more per candidate of the call).
        hit_n: [hit records in use].
        op: Row kinds.
        chan: Channel of each row.
        group: Group of each row.
        no_group: The row has no ``group_idx``.
        h: Hash of each row.
        gkey: Report row of each row.
        sh: The rows' shape.
        cand: :func:`candidates`.
        i: The run's first row.
        mode: The report mode.
        out: The call's output.
        cl: Scratch, one per row.

    Returns:
        The run's last row (the rows up to it start no other run).
    """
    n_rows = len(op)
    cur = sh.batch[i]
    ch = chan[i]
    if sh.origin[i] == ORIGIN_REUSED:
        seen[ch] += 1
        _mark(out, i, sh.hashes[i], ANNOUNCED)
        _count_hit(op, chan, group, no_group, h, gkey, sh, i, hits, hit_n, out)
        return i + sh.hashes[i] - 1
    # The run: one event per group, the same tokens, in a row.
    mask = np.int64(0)
    j = i
    while (
        j < n_rows
        and sh.batch[j] == cur
        and cand[j]
        and chan[j] == ch
        and sh.origin[j] == 0
        and sh.tokens[j] == sh.tokens[i]
    ):
        b = _bit(group[j], no_group[j])
        if mask & b:
            break
        mask |= b
        j += sh.hashes[j]
    end = j - 1
    # Every block's key live now (evictions earlier in the batch count); a valid hit in
    # every group, and every group of the channel announcing.
    e = i
    while e <= end:
        n = sh.hashes[e]
        acc = 0
        for r in range(e, e + n):
            s = probe(t, ch, group[r], no_group[r], h[r])
            if t.live[s] >= 0:
                acc += 1
            cl[r] = acc
        if not _valid(sh, cl, e, n, mode):
            return end
        e += n
    if sh.want[end] & ~mask:
        return end
    certain = mode == FULL
    if not certain:
        # A later store of the batch continues the run: the request's own allocate_slots.
        e = i
        while e <= end and not certain:
            last = h[e + sh.hashes[e] - 1]
            r = end + 1
            while r < n_rows and sh.batch[r] == cur:
                if op[r] == STORE and sh.has_parent[r] and sh.parent[r] == last:
                    certain = True
                    break
                r += 1
            e += sh.hashes[e]
    if not certain:
        # A shorter prefix (one length for every group) is a valid hit too: vLLM would
        # have hit at least that, so the lookup did not hit nothing.
        n0 = sh.hashes[i]
        bs0 = sh.bs[i]
        for k in range(1, n0):
            length = k * bs0
            ok = _valid(sh, cl, i, k, mode)
            e = i + n0
            while ok and e <= end:
                bse = sh.bs[e]
                ok = False if length % bse else _valid(sh, cl, e, length // bse, mode)
                e += sh.hashes[e]
            if ok:
                certain = True
                break
    if certain:
        seen[ch] += 1
        code = ANNOUNCED
    elif seen[ch] > 0:
        code = ANNOUNCED_AMBIGUOUS
    else:
        for r in range(i, end + 1):
            out.note[r] = NOTE_AMBIGUOUS
        return end
    e = i
    while e <= end:
        _mark(out, e, sh.hashes[e], code)
        _count_hit(op, chan, group, no_group, h, gkey, sh, e, hits, hit_n, out)
        e += sh.hashes[e]
    return end


@dataclass
class ChannelContext:
    """What :func:`channel_context` carries from chunk to chunk, per channel.

    Attributes:
        seen: The groups seen so far (a bit each).
        meta: The groups its metadata names (0: no metadata).
        last_batch: Its last batch number.
    """

    seen: dict[int, int] = field(default_factory=dict)
    meta: dict[int, int] = field(default_factory=dict)
    last_batch: dict[int, int] = field(default_factory=dict)


def _mask(groups: tuple[int, ...] | None) -> int:
    mask = 0
    for g in groups or ():
        mask |= 1 << min(max(g, 0), 62)
    return mask


def channel_context(
    channel: Any,
    batch: Any,
    group: Any,
    no_group: Any,
    counted: Any,
    ctx: ChannelContext,
    annotator: Any,
) -> tuple[Any, Any]:
    """Per row: the groups an announcement on its channel covers, and its previous batch.

    The groups (:attr:`kvtool.report.kernel.Shape.want`, a bit each) are the channel's
    metadata's, else those of its ``counted`` rows up to the row; the previous batch
    (``pbatch``) is the channel's batch before the row's (-1: none). Both carry across
    chunks in ``ctx``.

    Args:
        channel: Each row's channel.
        batch: Each row's batch number.
        group: Each row's group (0 where ``no_group``).
        no_group: The row has no ``group_idx``.
        counted: The rows whose group the channel has (stores and removes of a group).
        ctx: The state carried (changed in place).
        annotator: The report's annotator (its ``group_indices``), or None.

    Returns:
        ``want`` and ``pbatch``.
    """
    n = len(channel)
    bits = np.left_shift(np.int64(1), np.clip(group, 0, 62).astype(np.int64))
    bits = np.where(no_group, np.iinfo(np.int64).min, bits)
    bits = np.where(counted, bits, 0)
    want = np.zeros(n, dtype=np.int64)
    pbatch = np.empty(n, dtype=np.int64)
    present = np.flatnonzero(np.bincount(channel)).tolist()
    for c in present:
        idx = np.arange(n) if len(present) == 1 else np.flatnonzero(channel == c)
        if c not in ctx.meta:
            got = None
            if annotator is not None and hasattr(annotator, "group_indices"):
                got = annotator.group_indices(c)
            ctx.meta[c] = _mask(got)
        meta = ctx.meta[c]
        if meta:
            want[idx] = meta
        else:
            acc = np.bitwise_or.accumulate(bits[idx]) | np.int64(ctx.seen.get(c, 0))
            want[idx] = acc
            ctx.seen[c] = int(acc[-1])
        bb = batch[idx]
        change = np.ones(len(bb), dtype=bool)
        change[1:] = bb[1:] != bb[:-1]
        heads = bb[change]
        prev = np.empty_like(heads)
        prev[0] = ctx.last_batch.get(c, -1)
        prev[1:] = heads[:-1]
        pbatch[idx] = prev[np.cumsum(change) - 1]
        ctx.last_batch[c] = int(bb[-1])
    return want, pbatch


def _were(n: int) -> str:
    return "was" if n == 1 else "were"


def findings(totals: dict[str, Any], mode: str, origin: bool = False) -> list[tuple[str, str]]:
    """The findings of hit announcements: (kind, text) each.

    Args:
        totals: The report's ``totals`` row.
        mode: The report mode.
        origin: The stream's stores carry ``origin`` (#51699): announcements are marked,
            in every mode, and nothing is inferred.

    Returns:
        ``hit_announcements`` (``auto`` found some), ``hit_rate`` (announcements, but
        not ``full``: no hit rate), ``announcement_or_copy`` (runs the wire cannot tell
        from second copies, with the bounds).
    """
    out: list[tuple[str, str]] = []
    ann = int(totals.get("hit_announced_blocks", 0) or 0)
    stored = int(totals.get("blocks_stored", 0) or 0)
    taken = int(totals.get("blocks_stored_bound", 0) or 0)
    left = int(totals.get("hit_announced_blocks_bound", 0) or 0)
    if ann and origin:
        out.append(
            (
                "hit_announcements",
                f"{plural(ann, 'block')} {_were(ann)} hit announcements (origin=REUSED, "
                "vllm-project/vllm#51699), not stores: hit_blocks/hit_tokens count the hits",
            )
        )
    elif ann and mode == "auto":
        out.append(
            (
                "hit_announcements",
                f"{plural(ann, 'block')} {_were(ann)} hit announcements (requests in "
                "kv_cache_report_mode='full'), not stores: hit_blocks/hit_tokens count the "
                "hits; --report-mode incremental counts them as stores",
            )
        )
    if ann and mode != "full":
        out.append(
            (
                "hit_rate",
                "hit_rate is not given: the wire does not show that every request announces "
                "(requests in the default report mode hit without an event); give "
                "--report-mode full if every request sets kv_cache_report_mode='full'",
            )
        )
    if taken or left:
        out.append(
            (
                "announcement_or_copy",
                f"{plural(taken + left, 'block')} in parentless stores could be hit announcements "
                f"or second copies (the wire cannot tell): blocks_stored is between "
                f"{stored - left:,} and {stored + taken:,}, hit_announced_blocks between "
                f"{ann - taken:,} and {ann + left:,}",
            )
        )
    return out


__all__ = [
    "ANNOUNCED",
    "ANNOUNCED_AMBIGUOUS",
    "AUTO",
    "FULL",
    "HIT_FIELDS",
    "INCREMENTAL",
    "MODES",
    "NOTE_AMBIGUOUS",
    "ORIGIN_NEW",
    "ORIGIN_REUSED",
    "ChannelContext",
    "announce",
    "candidates",
    "channel_context",
    "findings",
]
