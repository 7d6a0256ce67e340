"""Findings: one line each for what in a report looks wrong, and what the user can do."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from kvtool.columns import UNANNOTATED, UNATTRIBUTED, ReadStats, TableAnnotator
from kvtool.protocol import sorted_unknown_tags
from kvtool.report import announce
from kvtool.report.source import Finding
from kvtool.text import plural, printable

if TYPE_CHECKING:
    from kvtool.report.builder import ReportBuilder


def report_findings(
    rep: dict[str, pl.DataFrame],
    builder: ReportBuilder,
    annotator: TableAnnotator,
    stats: ReadStats,
) -> list[Finding]:
    """Return one finding per thing in a report that looks wrong or needs the user's help.

    Args:
        rep: The finished tables (``totals``, ``by_kind``...).
        builder: The builder that made them (clock steps, sparse timeline, channels).
        annotator: The annotator used (kind changes, groups outside the metadata).
        stats: The read's stats (skipped input, damage, lost batches).

    Returns:
        The findings, most important first (each a line of text with its kind).
    """
    out: list[Finding] = []
    tot = rep["totals"].to_dicts()[0]
    by_kind = {r["kind"]: r for r in rep["by_kind"].to_dicts()}
    stored = tot["blocks_stored"]
    un = by_kind.get(UNANNOTATED, {})
    if stored and un.get("blocks_stored", 0) == stored:
        if builder.grouped_channels:
            out.append(
                Finding(
                    "unannotated",
                    "no store was annotated with a kind: pass the group metadata with "
                    "--groups FILE (get_kv_cache_group_metadata()) or --group-meta "
                    "IDX=KIND[:WINDOW]",
                )
            )
        else:
            out.append(Finding("unannotated", _ungrouped_finding(stats)))
    removed = tot["blocks_removed"]
    unattr = by_kind.get(UNATTRIBUTED, {}).get("blocks_removed", 0)
    unann = by_kind.get(UNANNOTATED, {}).get("blocks_removed", 0)
    if removed and unattr + unann == removed:
        how = (
            "--groups FILE or --group-meta IDX=KIND[:WINDOW]"
            if builder.grouped_channels
            else "--group-meta none=KIND[:WINDOW] for events without group_idx"
        )
        out.append(
            Finding(
                "unannotated",
                f"no remove could be attributed to a kind ({unattr} unattributed, {unann} "
                f"unannotated): give the group metadata ({how})",
            )
        )
    elif unattr:
        out.append(
            Finding(
                "unattributed",
                f"{plural(unattr, 'removed block')} without group_idx could not be attributed "
                "(hash live in no group or in several): reported as unattributed",
            )
        )
    names = {cid: ref.info.name for cid, ref in stats.channels.items()}
    for cid, g, before, after in sorted(annotator.changes, key=str):
        out.append(
            Finding(
                "kind_change",
                f"group {g} on {names.get(cid, cid)} changes kind mid-stream: "
                f"{_kw(before)} -> {_kw(after)}",
            )
        )
    evicting = {
        k: r["blocks_removed"]
        for k, r in by_kind.items()
        if r["blocks_removed"] and k not in (UNATTRIBUTED, UNANNOTATED)
    }
    if evicting:
        for k, r in by_kind.items():
            if k in (UNATTRIBUTED, UNANNOTATED) or k in evicting or not r["blocks_stored"]:
                continue
            other = ", ".join(f"{o} {n}" for o, n in sorted(evicting.items()))
            out.append(
                Finding(
                    "silent_kind",
                    f"{k} stored {r['blocks_stored']} blocks but none was evicted while others "
                    f"evicted ({other}): its removes may be missing from the stream",
                )
            )
    for cid, (n, dropped) in sorted(builder.restarts.items()):
        out.append(
            Finding(
                "restart",
                f"{plural(n, 'publisher restart')} on {names.get(cid, cid)}: the state started "
                "afresh "
                f"({plural(dropped, 'block')} dropped, counted as blocks_cleared)",
            )
        )
    if builder.negative_lifetimes:
        out.append(
            Finding(
                "negative_lifetime",
                f"{plural(builder.negative_lifetimes, 'block lifetime')} "
                f"{'was' if builder.negative_lifetimes == 1 else 'were'} negative (the publisher's "
                "clock went backwards between store and remove): counted as 0 s",
            )
        )
    if builder.timeline_sparse:
        out.append(
            Finding(
                "sparse_timeline",
                "the timeline lists only the buckets with events (a dense grid of every bucket "
                "and kind would be too large): choose a larger --every for every bucket",
            )
        )
    if tot["orphan_removes"]:
        out.append(
            Finding(
                "orphan_removes",
                f"{plural(tot['orphan_removes'], 'removed block')} "
                f"{'was' if tot['orphan_removes'] == 1 else 'were'} not live (the stream began "
                "mid-way or batches were lost): counted as orphan_removes",
            )
        )
    for g, n in sorted(annotator.out_of_range.items()):
        out.append(
            Finding(
                "out_of_metadata",
                f"Group index `{g}` not in KV cache metadata ({plural(n, 'store')} left "
                "unannotated)",
            )
        )
    unknown = sum(stats.unknown_tags.values())
    if stats.bad_batches or stats.skipped_events > unknown:
        out.append(
            Finding(
                "malformed",
                f"skipped {plural(stats.bad_batches, 'malformed payload')} and "
                f"{plural(stats.skipped_events - unknown, 'undecodable event')}"
                + (f"; first: {stats.problems[0]}" if stats.problems else ""),
            )
        )
    if unknown:
        out.append(Finding("unknown_events", unknown_tags_finding(stats.unknown_tags)))
    # Typed where they are read (kind, the recording's path, the line): kept as they are.
    out.extend(stats.lost)
    out.extend(stats.damaged)
    out.extend(Finding("input", line) for line in annotator.findings(stats))
    # Hit announcements (issue 21, docs/SEMANTICS.md R6).
    mode = getattr(annotator, "report_mode", "auto")
    origin = stats.origin_rows > 0
    out.extend(Finding(kind, text) for kind, text in announce.findings(tot, mode, origin))
    if tot.get("ambiguous_copy_evictions"):
        out.append(Finding("copy_choice", copy_choice_finding(tot)))
    return out


COPY_RULE = (
    "the copy whose further keys the next removes name, else one not stored in the batch, "
    "else the one stored with the block evicted just before, else the oldest"
)
"""R8's rule, as the ``copy_choice`` finding states it (docs/SEMANTICS.md)."""


def copy_choice_finding(row: dict[str, object]) -> str:
    """The finding for evictions of a key cached in several blocks (R8), with the bound.

    Args:
        row: A report row (``totals``) with ``ambiguous_copy_evictions`` and the lifetime
            columns and their bounds.

    Returns:
        E.g. ``51 evictions were of a key cached in several blocks: which copy vLLM
        evicted is not on the wire; lifetimes take …; under the oldest-first and
        newest-first rules lifetime p50 is between 0.008 and 0.009 s, …``.
    """
    parts = []
    for q in ("p50", "p90", "p99"):
        low, high = row.get(f"lifetime_{q}_s_bound_low"), row.get(f"lifetime_{q}_s_bound_high")
        if low is not None and high is not None:
            parts.append(f"{q} between {low} and {high} s")
    n = int(row["ambiguous_copy_evictions"])  # type: ignore[call-overload]
    if parts:
        bound = (
            f"; under the oldest-first and newest-first rules lifetime {', '.join(parts)} "
            "(lifetime_pNN_s_bound_low/high)"
        )
    else:
        bound = (
            "; report --lifetime-bounds gives the lifetimes under the oldest-first and "
            "newest-first rules, a bound (lifetime_pNN_s_bound_low/high)"
        )
    return (
        f"{plural(n, 'eviction')} {'was' if n == 1 else 'were'} of a key cached in several "
        "blocks: which copy vLLM evicted "
        f"is not on the wire; lifetimes take {COPY_RULE}{bound}"
    )


UNGROUPED_SOURCES = "SGLang, or vLLM before group_idx (~0.21, vllm#37688)"
"""Who sends events without ``group_idx`` (PROTOCOL.md: the field came in ~v0.21)."""


def ungrouped_hint(sglang: bool) -> str:
    """What to say of a stream whose events carry no ``group_idx``, and the option to give.

    One wording for ``report``'s finding and ``replay --annotate``'s warning (issue 21).

    Args:
        sglang: The stream shows SGLang's signature (:func:`kvtool.info.sglang_like`).

    Returns:
        E.g. ``the stream is SGLang-like (…): … give their kind with --group-meta
        none=KIND[:WINDOW] (e.g. none=full_attention)``.
    """
    from kvtool.info import SGLANG_LIKE

    who = (
        f"the stream is {SGLANG_LIKE}; where SGLang's cache has a sliding-window part, "
        "evicting that part alone sends no event"
        if sglang
        else f"as {UNGROUPED_SOURCES} sends"
    )
    return (
        f"no store carries group_idx or a kind ({who}): give their kind with --group-meta "
        "none=KIND[:WINDOW] (e.g. none=full_attention)"
    )


def _ungrouped_finding(stats: ReadStats) -> str:
    from kvtool.info import recording_sglang_like

    return ungrouped_hint(recording_sglang_like(stats.recordings)) + (
        "; without it kinds cannot be known: every block is reported as unannotated"
    )


def unknown_tags_finding(counts: dict[str, int]) -> str:
    """The finding for events of unknown type (issue 21), every tag with its count.

    Args:
        counts: Tag (as sent) → events skipped.

    Returns:
        ``3 events of unknown type BlockInactive, 1 BlockTransferred were skipped (a
        newer vLLM?)``; tags pass through :func:`kvtool.text.printable`.
    """
    ordered = sorted_unknown_tags(counts)
    parts = [f"{n:,} {printable(t)}" for t, n in ordered.items()]
    first = next(iter(ordered.values()))
    parts[0] = parts[0].replace(" ", f" event{'' if first == 1 else 's'} of unknown type ", 1)
    verb = "was" if sum(ordered.values()) == 1 else "were"
    return f"{', '.join(parts)} {verb} skipped (a newer vLLM?)"


def _kw(kw: tuple[str, int | None]) -> str:
    """A kind with its window, for messages."""
    k, w = kw
    return k + (f" window {w}" if w is not None else "")
