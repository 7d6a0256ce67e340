"""Issue 21: report rows of the reference model (tests/semantics_model.py) for the tests."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Literal

from kvtool.protocol import decode_batch
from kvtool.recording import open_recording
from tests.semantics_model import MAKES_BLOCK, Counts, ReportMode, SemanticsModel

LIFETIME_QUANTILES = (("lifetime_p50_s", 50.0), ("lifetime_p90_s", 90.0), ("lifetime_p99_s", 99.0))


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """Linear quantiles of lifetimes, rounded to 6 digits as kvtool reports them."""
    out: dict[str, float | None] = {}
    xs = sorted(values)
    for name, q in LIFETIME_QUANTILES:
        if not xs:
            out[name] = None
            continue
        pos = (len(xs) - 1) * q / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        out[name] = round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo), 6)
    return out


def row(c: Counts, *, live: int, peak: int, live_keys: int, live_entries: int) -> dict[str, object]:
    """One report row of the model, in the column names docs/SEMANTICS.md proposes."""
    st, rm = c.stores, c.removes
    stored = sum(st[k] for k in MAKES_BLOCK)
    out: dict[str, object] = {
        "store_events": c.store_events,
        "blocks_stored": stored,
        "tokens_stored": c.tokens_stored,
        "remove_events": c.remove_events,
        "blocks_removed": rm["eviction"],
        "blocks_cleared": c.blocks_cleared,
        "entries_cleared": c.entries_cleared,
        "live_blocks_end": live,
        "peak_live_blocks": peak,
        "live_keys": live_keys,
        "live_entries": live_entries,
        "distinct_hashes": len(c.distinct),
        "new_entries": st["new_entry"],
        "blocks_recomputed": st["recompute"],
        "stored_while_live": st["stored_while_live"],
        "partial_primary": c.partial_primary,
        "partial_extra_keys": st["partial_extra"],
        "rekeys": st["rekey"],
        "rekeys_of_live_key": st["rekey_of_live_key"],
        "checkpoints_discarded": rm["discard"],
        "hit_announced_blocks": st["announcement"],
        "tokens_announced": c.tokens_announced,
        "hit_blocks": c.hit_blocks,
        "hit_tokens": c.hit_tokens,
        "failed_lookups": c.failed_lookups,
        "evicted_extra_keys": rm["eviction_extra_key"],
        "partial_promotions": rm["promotion"],
        "rekey_removes": rm["rekey_remove"],
        "orphan_removes": rm["orphan"],
        "ambiguous_announcements": c.ambiguous_announcements,
        "ambiguous_announced_blocks": c.ambiguous_announced_blocks,
        "ambiguous_copy_evictions": c.ambiguous_copy_evictions,
    }
    # Where the wire cannot tell an announcement from a second copy (see
    # SemanticsModel._is_announcement), the truth lies in these bounds.
    taken, left = c.ambiguous_taken_blocks, c.ambiguous_announced_blocks - c.ambiguous_taken_blocks
    ann = st["announcement"]
    out["hit_announced_blocks_bound"] = [ann - taken, ann + left]
    out["blocks_stored_bound"] = [stored - left, stored + taken]
    out.update(quantiles(c.lifetimes))
    return out


def _merge(counts: Iterable[Counts]) -> Counts:
    """Sum the counts of several groups (one kind's row)."""
    m = Counts()
    for c in counts:
        for f in fields(Counts):
            mine, theirs = getattr(m, f.name), getattr(c, f.name)
            if isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, set):
                mine |= theirs
            elif isinstance(mine, list):
                mine += theirs
            elif f.name not in ("live_blocks", "peak_live_blocks"):
                setattr(m, f.name, mine + theirs)
    return m


def summary(model: SemanticsModel) -> dict[str, list[dict[str, object]]]:
    """The model's rows: ``by_group`` (with ``group_idx`` and ``kind``) and ``by_kind``.

    Args:
        model: A model that has been fed a whole stream.

    Returns:
        ``{"by_group": [...], "by_kind": [...]}``, rows sorted by their key.
    """
    live_keys: Counter[int | None] = Counter()
    live_entries: Counter[int | None] = Counter()
    for groups in model.channels.values():
        for gi, g in groups.items():
            live_keys[gi] += sum(1 for v in g.copies.values() if v)
            live_entries[gi] += sum(len(v) for v in g.copies.values())
    by_group: list[dict[str, object]] = []
    for gi in sorted(model.counts, key=lambda x: -1 if x is None else x):
        c = model.counts[gi]
        r: dict[str, object] = {"group_idx": gi, "kind": model.kinds.get(gi, "unannotated")}
        r.update(
            row(
                c,
                live=c.live_blocks,
                peak=c.peak_live_blocks,
                live_keys=live_keys[gi],
                live_entries=live_entries[gi],
            )
        )
        by_group.append(r)
    by_kind: list[dict[str, object]] = []
    for kind in sorted({str(r["kind"]) for r in by_group}):
        gis = [gi for gi in model.counts if model.kinds.get(gi, "unannotated") == kind]
        c = _merge(model.counts[gi] for gi in gis)
        live = sum(model.counts[gi].live_blocks for gi in gis)
        r = {"kind": kind}
        r.update(
            row(
                c,
                live=live,
                peak=model.kind_peak[kind],
                live_keys=sum(live_keys[gi] for gi in gis),
                live_entries=sum(live_entries[gi] for gi in gis),
            )
        )
        by_kind.append(r)
    return {"by_group": by_group, "by_kind": by_kind}


def run_recording(
    path: str | Path,
    groups: Sequence[dict[str, object]] | None = None,
    *,
    report_mode: ReportMode = "auto",
    copy_rule: Literal["adjacent", "oldest", "newest"] = "adjacent",
) -> SemanticsModel:
    """Feed a whole recording into a new model (groups: the file's own when not given).

    Args:
        path: An MCAP recording.
        groups: Group metadata; the recording's metadata record when None.
        report_mode: See :class:`SemanticsModel`.
        copy_rule: See :class:`SemanticsModel`.

    Returns:
        The model after the last batch.
    """
    with open_recording(path) as r:
        model = SemanticsModel(groups if groups is not None else r.groups, report_mode, copy_rule)
        for msg in r.messages():
            b = decode_batch(msg.data, seq=msg.seq)
            rank = b.data_parallel_rank if b.data_parallel_rank is not None else msg.channel.dp_rank
            model.feed(
                b.events, b.ts, channel=msg.channel.name, rank=rank, seq=msg.seq, skipped=b.skipped
            )
    return model


def findings(model: SemanticsModel) -> list[str]:
    """The findings the model's rules raise (names from docs/SEMANTICS.md).

    Args:
        model: A model that has been fed a whole stream.

    Returns:
        One line per finding, in a fixed order.
    """
    out: list[str] = []
    total = _merge(model.counts.values())
    if model.announcements_seen:
        out.append(
            f"hit_announcements: {total.stores['announcement']} blocks announced as hits "
            f"(requests in kv_cache_report_mode='full'); not counted as stores"
        )
    if total.ambiguous_announcements:
        out.append(
            f"announcement_or_copy: {total.ambiguous_announced_blocks} blocks in "
            f"{total.ambiguous_announcements} parentless stores could be hit announcements or "
            "second copies; the counts they touch are given as bounds"
        )
    if total.ambiguous_copy_evictions:
        out.append(
            f"copy_choice: {total.ambiguous_copy_evictions} removes of a key cached in several "
            f"blocks; which copy vLLM evicted is not on the wire (rule: {model.copy_rule})"
        )
    if total.removes["rekey_remove"]:
        out.append(
            f"mamba_rekey_or_discard: {total.removes['rekey_remove']} checkpoint removes followed "
            "by a partial store (re-key, or a discard and a new block: same physical counts)"
        )
    if model.unknown_tags:
        tags = ", ".join(f"{t} {n}" for t, n in sorted(model.unknown_tags.items()))
        out.append(f"unknown_event_tags: {tags}")
    return out
