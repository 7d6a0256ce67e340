"""The one metric registry: every report metric declared once (no polars: cheap to import).

A metric's name (DESIGN.md's column name, the JSON key), its two-line table label, its
unit, how two partial reports of disjoint parts of a stream merge it, which direction is
worse for ``diff --fail-on``, and how it is exposed to Prometheus are all read from here:
the tables, the legend, JSON, CSV, ``diff``, ``top`` and ``serve`` never spell them again.
Adding a metric is its declaration here plus its computation in the state kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Merge = Literal["sum", "max", "last", "distinct", "quantile", "ratio"]
"""How partial reports merge: ``sum`` adds; ``max`` takes the largest (a peak);
``last`` is the value at the end of the last part (state carried across parts);
``distinct`` unions sets; ``quantile`` is taken again over the merged samples; ``ratio``
is derived from two summed metrics after the merge (never merged itself)."""

Worse = Literal["up", "down", "none"]
"""Which way a change is a regression for ``diff``: ``up`` a rise, ``down`` a fall."""

PromType = Literal["counter", "gauge", "histogram", "none"]
"""How ``kvtool serve`` exposes it: a ``_total`` counter, a gauge, a histogram (of the
samples behind a quantile metric), or not at all (a derived ratio, a set size)."""


@dataclass(frozen=True)
class Metric:
    """One report metric.

    Attributes:
        name: The column and JSON key, as DESIGN.md names it.
        label: The table header: name over unit, two lines.
        legend: The legend's line for it (what the label stands for, in vLLM's terms).
        unit: ``blocks``, ``tokens``, ``events``, ``hashes``, ``seconds``, ``evictions``
            or ``ratio``.
        merge: How partials merge (:data:`Merge`).
        worse: Which direction is worse (:data:`Worse`).
        prom: The Prometheus type (:data:`PromType`).
        prom_name: The Prometheus family name (``kvtool_`` prefix, base units, no
            ``_total``: prometheus_client adds it to counters); empty for ``none``.
        help: One line of help text for Prometheus and ``--help``.
        aliases: Older JSON names kept for one release (deprecated).
        ratio_of: A ``ratio`` metric's parts: (numerator, the summed metrics of its
            denominator), both summed over whatever merged first (empty for the others).
    """

    name: str
    label: str
    legend: str
    unit: str
    merge: Merge
    worse: Worse
    prom: PromType
    prom_name: str
    help: str
    aliases: tuple[str, ...] = ()
    ratio_of: tuple[str, tuple[str, ...]] = ("", ())


def _m(
    name: str,
    label: str,
    legend: str,
    unit: str,
    merge: Merge,
    worse: Worse,
    prom: PromType,
    prom_name: str,
    help_: str,
    aliases: tuple[str, ...] = (),
    ratio_of: tuple[str, tuple[str, ...]] = ("", ()),
) -> Metric:
    return Metric(
        name, label, legend, unit, merge, worse, prom, prom_name, help_, aliases, ratio_of
    )


# fmt: off
METRICS: tuple[Metric, ...] = (
    _m("store_events", "stores\nevents", "stores events = store_events", "events",
       "sum", "none", "counter", "kvtool_store_events", "BlockStored events."),
    _m("blocks_stored", "stored\nblocks", "stored blocks = blocks_stored", "blocks",
       "sum", "none", "counter", "kvtool_blocks_stored", "Blocks stored into the cache."),
    _m("tokens_stored", "stored\ntokens", "stored tokens = tokens_stored", "tokens",
       "sum", "none", "counter", "kvtool_tokens_stored", "Tokens of the stored blocks."),
    _m("remove_events", "removes\nevents", "removes events = remove_events", "events",
       "sum", "none", "counter", "kvtool_remove_events", "BlockRemoved events."),
    _m("blocks_removed", "removed\nblocks", "removed = blocks_removed (evicted)", "blocks",
       "sum", "up", "counter", "kvtool_blocks_removed", "Blocks evicted (BlockRemoved)."),
    _m("blocks_cleared", "cleared\nblocks", "cleared = blocks_cleared (AllBlocksCleared, restart)",
       "blocks", "sum", "up", "counter", "kvtool_blocks_cleared",
       "Blocks dropped by AllBlocksCleared or a publisher restart."),
    _m("live_blocks_end", "live\nblocks", "live = live_blocks_end (cached at the end)",
       "blocks", "last", "none", "gauge", "kvtool_live_blocks", "Blocks cached now."),
    _m("peak_live_blocks", "peak\nblocks", "peak = peak_live_blocks (most cached at once)",
       "blocks", "max", "none", "gauge", "kvtool_peak_live_blocks",
       "Most blocks cached at once."),
    _m("distinct_hashes", "distinct\nhashes", "distinct = distinct_hashes", "hashes",
       "distinct", "none", "none", "", "Distinct block hashes seen."),
    _m("stored_while_live", "stored\nwhile live",
       "stored while live = stored_while_live (a store of a block already cached: a second "
       "copy, or a hit announced again)", "blocks", "sum", "up", "counter",
       "kvtool_blocks_stored_while_live", "Stores of a block that was still cached.",
       aliases=("restored_blocks",)),
    _m("blocks_recomputed", "recomp\nblocks",
       "recomp = blocks_recomputed (stored again after it was evicted or cleared)",
       "blocks", "sum", "up", "counter", "kvtool_blocks_recomputed",
       "Stores of a block that was cached earlier and evicted or cleared since."),
    # Issue 21 (docs/SEMANTICS.md): what the other keys on the wire were.
    _m("live_keys", "live\nkeys", "live keys = live_keys (distinct hash keys cached at the "
       "end: a block can carry several, a key in two blocks counts once)", "hashes", "sum",
       "none", "gauge", "kvtool_live_keys",
       "Distinct hash keys cached now (partial entries are extra keys on a block)."),
    _m("live_entries", "live\nentries", "live entries = live_entries ((key, block) entries "
       "cached at the end: a key in two blocks counts twice)", "hashes", "sum", "none",
       "gauge", "kvtool_live_entries", "Cached (hash key, block) entries now."),
    _m("entries_cleared", "cleared\nentries", "cleared entries = entries_cleared ((key, "
       "block) entries dropped by AllBlocksCleared or a restart: a key in two blocks counts "
       "twice)", "hashes", "sum", "none", "counter", "kvtool_entries_cleared",
       "(Hash key, block) entries dropped by AllBlocksCleared or a publisher restart."),
    _m("partial_extra_keys", "partial\nextra", "partial extra = partial_extra_keys (a "
       "partial prefix key added to a block already cached: not a block)", "hashes", "sum",
       "none", "counter", "kvtool_partial_extra_keys",
       "Partial prefix keys added to a cached block (BlockStored with the hash block size)."),
    _m("evicted_extra_keys", "evicted\nextra", "evicted extra = evicted_extra_keys (removes "
       "of a block's further keys when it is evicted: not evictions)", "hashes", "sum", "none",
       "counter", "kvtool_evicted_extra_keys",
       "Removes of the further keys of an evicted block (one eviction, several keys)."),
    _m("rekeys", "rekeys\nblocks", "rekeys = rekeys (a new key on a block already cached: a "
       "partial block promoted to full, a Mamba checkpoint re-keyed)", "blocks", "sum", "none",
       "counter", "kvtool_rekeys", "New keys on a cached block (promotion, Mamba re-key)."),
    _m("partial_promotions", "promoted\nblocks", "promoted = partial_promotions (a partial "
       "key removed when its block fills: not an eviction)", "blocks", "sum", "none",
       "counter", "kvtool_partial_promotions",
       "Partial primary keys replaced when their block filled (not evictions)."),
    _m("rekey_removes", "rekey rm\nblocks", "rekey rm = rekey_removes (a Mamba checkpoint's "
       "old key removed on a re-key: not an eviction)", "blocks", "sum", "none", "counter",
       "kvtool_rekey_removes", "Mamba checkpoint keys removed on a re-key (not evictions)."),
    _m("checkpoints_discarded", "discard\nblocks", "discard = checkpoints_discarded (a "
       "transient Mamba checkpoint stored and dropped in one batch: neither stored nor "
       "evicted)", "blocks", "sum", "none", "counter", "kvtool_checkpoints_discarded",
       "Transient Mamba checkpoints stored and discarded in one batch."),
    # Hit announcements (kv_cache_report_mode="full", R6/R7 of docs/SEMANTICS.md).
    _m("hit_announced_blocks", "announced\nblocks", "announced = hit_announced_blocks (blocks "
       "of BlockStored events that announced a prefix-cache hit: no store)", "blocks", "sum",
       "none", "counter", "kvtool_hit_announced_blocks",
       "Blocks of hit announcements (kv_cache_report_mode='full'), not stores."),
    _m("tokens_announced", "announced\ntokens", "announced tokens = tokens_announced (tokens "
       "of the hit announcements)", "tokens", "sum", "none", "counter",
       "kvtool_tokens_announced", "Tokens of hit announcements."),
    _m("hit_blocks", "hit\nblocks", "hit = hit_blocks (blocks of announced hits of requests "
       "then admitted; a lookup repeated after its allocation failed counts once)", "blocks",
       "sum", "down", "counter", "kvtool_hit_blocks",
       "Prefix-cache hit blocks of admitted requests (announcing requests only)."),
    _m("hit_tokens", "hit\ntokens", "hit tokens = hit_tokens", "tokens", "sum", "down",
       "counter", "kvtool_hit_tokens",
       "Prefix-cache hit tokens of admitted requests (announcing requests only)."),
    _m("hit_rate", "hit\nrate", "hit rate = hit_rate (hit_tokens / (hit_tokens + "
       "tokens_stored): of the full-block tokens of admitted requests, the share read from "
       "the prefix cache rather than computed and stored; only where every request "
       "announces (--report-mode full), else null)", "ratio", "ratio", "down", "gauge",
       "kvtool_prefix_cache_hit_ratio",
       "hit_tokens / (hit_tokens + tokens_stored), where every request announces.",
       ratio_of=("hit_tokens", ("hit_tokens", "tokens_stored"))),
    _m("failed_lookups", "failed\nlookups", "failed = failed_lookups (hit announcements taken "
       "back: the allocation failed and the same lookup came again)", "events", "sum", "up",
       "counter", "kvtool_failed_lookups", "Announced lookups whose allocation failed."),
    _m("blocks_stored_bound", "stored\n+ at most", "stored + at most = blocks_stored_bound "
       "(blocks of parentless stores taken as hit announcements that could be second copies: "
       "blocks_stored is at most blocks_stored + this, at least blocks_stored - "
       "hit_announced_blocks_bound; 0: the wire tells)", "blocks", "sum", "none", "none", "",
       "How many more blocks_stored could be."),
    _m("hit_announced_blocks_bound", "announced\n+ at most", "announced + at most = "
       "hit_announced_blocks_bound (blocks of parentless stores counted as stores that could "
       "be hit announcements: hit_announced_blocks is at most hit_announced_blocks + this, at "
       "least hit_announced_blocks - blocks_stored_bound)", "blocks", "sum", "none", "none",
       "", "How many more hit_announced_blocks could be."),
    _m("ambiguous_copy_evictions", "copy\nchoices", "copy choices = "
       "ambiguous_copy_evictions (evictions of a key cached in several blocks: which copy "
       "went is not on the wire, the lifetimes take one by rule R8)", "evictions", "sum",
       "none", "none", "", "Evictions of a key with several copies (copy chosen by rule)."),
    _m("recompute_share", "recomp\nshare",
       "recomp share = recompute_share (blocks_recomputed / blocks_stored)", "ratio",
       "ratio", "up", "none", "", "Share of stored blocks that were recomputed.",
       ratio_of=("blocks_recomputed", ("blocks_stored",))),
    _m("orphan_removes", "orphans\nblocks", "orphans = orphan_removes (removed, never seen "
       "stored)", "blocks", "sum", "up", "counter", "kvtool_orphan_removes",
       "Removes of a block not cached (the stream began mid-way or lost its store)."),
    _m("lifetime_p50_s", "life\np50 s", "life pNN s = lifetime_pNN_s (store to remove, "
       "seconds)", "seconds", "quantile", "down", "histogram", "kvtool_block_lifetime_seconds",
       "Block lifetime, store to remove."),
    _m("lifetime_p90_s", "life\np90 s", "", "seconds", "quantile", "down", "histogram",
       "kvtool_block_lifetime_seconds", "Block lifetime, store to remove."),
    _m("lifetime_p99_s", "life\np99 s", "", "seconds", "quantile", "down", "histogram",
       "kvtool_block_lifetime_seconds", "Block lifetime, store to remove."),
    # R8 (docs/SEMANTICS.md): which copy of a twice-cached key an eviction took is not on
    # the wire; the lifetime quantiles under the two extreme rules (oldest copy first,
    # newest copy first), the lower and the higher of the two.
    _m("lifetime_p50_s_bound_low", "life p50\nlow s", "life pNN s low = "
       "lifetime_pNN_s_bound_low (the lower of the lifetime quantiles under the "
       "oldest-first and the newest-first copy rule)",
       "seconds", "quantile", "none", "none", "",
       "Block lifetime p50, the lower of the two extreme copy rules."),
    _m("lifetime_p50_s_bound_high", "life p50\nhigh s", "life pNN s high = "
       "lifetime_pNN_s_bound_high (the higher of the lifetime quantiles under the "
       "oldest-first and the newest-first copy rule)",
       "seconds", "quantile", "none", "none", "",
       "Block lifetime p50, the higher of the two extreme copy rules."),
    _m("lifetime_p90_s_bound_low", "life p90\nlow s", "",
       "seconds", "quantile", "none", "none", "",
       "Block lifetime p90, the lower of the two extreme copy rules."),
    _m("lifetime_p90_s_bound_high", "life p90\nhigh s", "",
       "seconds", "quantile", "none", "none", "",
       "Block lifetime p90, the higher of the two extreme copy rules."),
    _m("lifetime_p99_s_bound_low", "life p99\nlow s", "",
       "seconds", "quantile", "none", "none", "",
       "Block lifetime p99, the lower of the two extreme copy rules."),
    _m("lifetime_p99_s_bound_high", "life p99\nhigh s", "",
       "seconds", "quantile", "none", "none", "",
       "Block lifetime p99, the higher of the two extreme copy rules."),
    _m("recompute_gap_s_p50", "gap\np50 s", "gap pNN s = recompute_gap_s_pNN (remove to "
       "re-store of a recomputed block, seconds)", "seconds", "quantile", "down", "histogram",
       "kvtool_recompute_gap_seconds", "Time from a block's removal to its re-store."),
    _m("recompute_gap_s_p90", "gap\np90 s", "", "seconds", "quantile", "down", "histogram",
       "kvtool_recompute_gap_seconds", "Time from a block's removal to its re-store."),
    _m("recompute_gap_s_p99", "gap\np99 s", "", "seconds", "quantile", "down", "histogram",
       "kvtool_recompute_gap_seconds", "Time from a block's removal to its re-store."),
    _m("recompute_distance_p50", "dist\np50", "dist pNN = recompute_distance_pNN "
       "(evictions in the pool between a block's removal and its re-store)", "evictions",
       "quantile", "down", "none", "", "Evictions in the pool between removal and re-store."),
    _m("recompute_distance_p90", "dist\np90", "", "evictions", "quantile", "down", "none",
       "", "Evictions in the pool between removal and re-store."),
    _m("recompute_distance_p99", "dist\np99", "", "evictions", "quantile", "down", "none",
       "", "Evictions in the pool between removal and re-store."),
)
# fmt: on
"""Every report metric, in DESIGN.md's column order."""

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
"""The metrics by name (aliases included)."""
BY_NAME.update({a: m for m in METRICS for a in m.aliases})


def usable_blocks(pool_blocks: int) -> int:
    """Return the blocks of a pool of ``pool_blocks`` that can hold cached entries.

    vLLM's block 0 is the null block (``BlockPool``): ``num_gpu_blocks - 1`` are usable.
    Every share of the pool (``report --pool-blocks``, ``serve``'s occupancy gauge) divides
    by this.

    Args:
        pool_blocks: ``num_gpu_blocks``.

    Returns:
        The usable blocks (at least 1).
    """
    return max(pool_blocks - 1, 1)


def metric(name: str) -> Metric:
    """Return the metric named ``name`` (or one of its deprecated aliases).

    Args:
        name: A metric name or alias.

    Returns:
        Its declaration.

    Raises:
        KeyError: No such metric.
    """
    return BY_NAME[name]


SHORT_LABELS: dict[str, str] = {
    # top's columns (kvtool/render/top.py): one word over the numbers, 80 columns wide.
    "live_blocks_end": "live",
    "peak_live_blocks": "peak",
    "blocks_stored": "store",
    "blocks_removed": "evict",
    "blocks_recomputed": "recomp",
    "orphan_removes": "orphan",
    "lifetime_p50_s": "p50 s",
    # The long names, for a diff table that fits 80 columns only with them.
    "checkpoints_discarded": "ckpt_discarded",
    "hit_announced_blocks": "announced",
    "blocks_stored_bound": "stored_bound",
    "hit_announced_blocks_bound": "announced_bound",
    "recompute_gap_s_p50": "recomp_gap_p50",
    "recompute_gap_s_p90": "recomp_gap_p90",
    "recompute_gap_s_p99": "recomp_gap_p99",
    "recompute_distance_p50": "recomp_dist_p50",
    "recompute_distance_p90": "recomp_dist_p90",
    "recompute_distance_p99": "recomp_dist_p99",
    "ambiguous_copy_evictions": "ambiguous_copy",
    "hit_rate": "hit rate",
    "lifetime_p50_s_bound_low": "life_p50_low",
    "lifetime_p50_s_bound_high": "life_p50_high",
    "lifetime_p90_s_bound_low": "life_p90_low",
    "lifetime_p90_s_bound_high": "life_p90_high",
    "lifetime_p99_s_bound_low": "life_p99_low",
    "lifetime_p99_s_bound_high": "life_p99_high",
}
"""One-line short labels (at most 16 characters, each naming one metric): ``top``'s column
headers, and the metric column of a ``diff`` table that does not fit with the names."""


def short_label(name: str) -> str:
    """Return the metric's one-line short label (:data:`SHORT_LABELS`), else its name.

    Args:
        name: A metric name.

    Returns:
        The label.
    """
    return SHORT_LABELS.get(name, name)


__all__ = [
    "BY_NAME",
    "METRICS",
    "SHORT_LABELS",
    "Merge",
    "Metric",
    "PromType",
    "Worse",
    "metric",
    "short_label",
    "usable_blocks",
]
